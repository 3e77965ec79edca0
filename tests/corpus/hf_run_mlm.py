"""Hugging Face transformers examples/pytorch/language-modeling/run_mlm_no_trainer.py: a BERT built from its config
(AutoModelForMaskedLM.from_config), texts tokenized with their special tokens mask and grouped into blocks
(group_texts), DataCollatorForLanguageModeling(mlm_probability=0.15) as the loader's collate_fn (it draws which
tokens to mask from torch's random state, in the process or the worker that collates), AdamW over two groups (no
weight decay on biases and LayerNorm weights), get_scheduler("linear"); each batch: outputs = model(**batch),
loss = outputs.loss, backward, optimizer.step(), lr_scheduler.step(), optimizer.zero_grad(); with the run's calls in
the place of Accelerate's.

BERT of 2 layers, width 32, a vocabulary of 64 (a word-level tokenizer built in memory: [PAD], [UNK], [CLS], [SEP],
[MASK] and 59 words), blocks of 16 random words."""
import torch
from torch.utils.data import DataLoader

from accel.testing import Setup

from . import NoTrainer, grouped_parameters, tokens

REFUSES = {}
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tokenizer(vocab: int):
    """A fast word-level tokenizer with BERT's special tokens (run_mlm loads one with AutoTokenizer)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {w: i for i, w in enumerate(SPECIAL + [f"w{i}" for i in range(vocab - len(SPECIAL))])}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="[UNK]")),
                                   pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                   mask_token="[MASK]")


def group_texts(ids: torch.Tensor, block_size: int) -> list[dict]:
    """run_mlm's tokenize_function (return_special_tokens_mask=True) and group_texts: blocks of block_size, each
    with its attention and special tokens masks."""
    total = (len(ids) // block_size) * block_size
    return [{"input_ids": b.tolist(), "attention_mask": [1] * block_size, "special_tokens_mask": [0] * block_size}
            for b in ids[:total].view(-1, block_size)]


class Train(NoTrainer):
    name, schedule = "run_mlm", "linear"


def build() -> Setup:
    import transformers
    from transformers import DataCollatorForLanguageModeling

    transformers.logging.set_verbosity_error()
    torch.manual_seed(42)
    tok = tokenizer(64)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=len(tok), max_position_embeddings=16)
    model = transformers.AutoModelForMaskedLM.from_config(config)
    optimizer = torch.optim.AdamW(grouped_parameters(model, ["bias", "LayerNorm.weight"], 0.0), lr=5e-5)
    train_dataset = group_texts(tokens(16 * 8, len(tok) - len(SPECIAL)) + len(SPECIAL), 16)  # words, no specials
    collator = DataCollatorForLanguageModeling(tokenizer=tok, mlm_probability=0.15)
    loader = DataLoader(train_dataset, shuffle=True, collate_fn=collator, batch_size=4,
                        generator=torch.Generator().manual_seed(42))
    return Setup(model, optimizer, loader, loop=Train())
