"""Hugging Face transformers examples/pytorch/text-classification/run_glue_no_trainer.py: a BERT for sequence
classification built from its config, tokenized pairs padded by the collator into dict batches with labels, AdamW
over two groups (no weight decay on biases and LayerNorm weights), get_scheduler("linear") with warm-up; each batch:
outputs = model(**batch), loss = outputs.loss, loss / gradient_accumulation_steps, backward, and every
gradient_accumulation_steps batches optimizer.step(), lr_scheduler.step(), optimizer.zero_grad(): the script's own
accumulation (2 here), with the run's calls in the place of Accelerate's.

BERT of 2 layers, width 32, 2 labels, sequences of 12 random tokens."""
import torch
from torch.utils.data import DataLoader

from accel.testing import Setup

from . import NoTrainer, grouped_parameters, tokens

REFUSES = {}
GRADIENT_ACCUMULATION_STEPS = 2


def pad_to_longest(features: list[dict]):
    """What DataCollatorWithPadding returns: the batch padded to its longest sequence, with the attention mask, as a
    BatchEncoding (a UserDict with attributes of its own)."""
    import transformers

    longest = max(len(f["input_ids"]) for f in features)
    batch = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
    for f in features:
        fill = longest - len(f["input_ids"])
        batch["input_ids"].append(f["input_ids"] + [0] * fill)
        batch["token_type_ids"].append(f["token_type_ids"] + [0] * fill)
        batch["attention_mask"].append([1] * len(f["input_ids"]) + [0] * fill)
    batch["labels"] = [f["labels"] for f in features]
    return transformers.BatchEncoding({k: torch.tensor(v) for k, v in batch.items()})


class Train(NoTrainer):
    name, schedule, warmup, accumulation = "run_glue", "linear", 1, GRADIENT_ACCUMULATION_STEPS


def build() -> Setup:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(42)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=128, num_labels=2, max_position_embeddings=32)
    model = transformers.AutoModelForSequenceClassification.from_config(config)
    optimizer = torch.optim.AdamW(grouped_parameters(model, ["bias", "LayerNorm.weight"], 0.01), lr=2e-5)
    ids = tokens(12 * 16, config.vocab_size).view(16, 12)
    labels = tokens(16, 2, seed=1)
    lengths = [12 - (i % 4) for i in range(16)]  # pairs of several lengths, padded per batch by the collator
    train_dataset = [{"input_ids": ids[i, :n].tolist(), "token_type_ids": [0] * n, "labels": int(labels[i])}
                     for i, n in enumerate(lengths)]

    loader = DataLoader(train_dataset, shuffle=True, collate_fn=pad_to_longest, batch_size=4,
                        generator=torch.Generator().manual_seed(42))
    return Setup(model, optimizer, loader, loop=Train())
