"""Hugging Face transformers examples/pytorch/language-modeling/run_clm_no_trainer.py: a GPT-2 built from its config
(AutoModelForCausalLM.from_config), texts tokenized and grouped into blocks (group_texts: labels = input_ids),
default_data_collator's dict batches, AdamW over two groups (no weight decay on biases and LayerNorm weights),
get_scheduler("linear"); each batch: outputs = model(**batch), loss = outputs.loss, backward, optimizer.step(),
lr_scheduler.step(), optimizer.zero_grad(); with the run's calls in the place of Accelerate's.

GPT-2 of 2 layers, width 32, a vocabulary of 128, blocks of 16 random tokens. Its config keeps use_cache=True,
GPT-2's default, which the script leaves as it is: activation_checkpointing refuses it (each block would append to
the KV cache again when recomputed)."""
import torch
from torch.utils.data import DataLoader

from accel.testing import Setup

from . import NoTrainer, grouped_parameters, tokens

REFUSES = {"activation_checkpointing": ("use_cache",)}


def group_texts(ids: torch.Tensor, block_size: int) -> list[dict]:
    """run_clm's group_texts: the tokens cut into blocks of block_size, labels a copy of input_ids."""
    total = (len(ids) // block_size) * block_size
    blocks = ids[:total].view(-1, block_size)
    return [{"input_ids": b, "attention_mask": torch.ones_like(b), "labels": b.clone()} for b in blocks]


class Train(NoTrainer):
    name, schedule = "run_clm", "linear"


def build() -> Setup:
    import transformers
    from transformers import default_data_collator

    transformers.logging.set_verbosity_error()
    torch.manual_seed(42)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(grouped_parameters(model, ["bias", "layer_norm.weight"], 0.0), lr=5e-5)
    train_dataset = group_texts(tokens(16 * 8, config.vocab_size), 16)
    loader = DataLoader(train_dataset, shuffle=True, collate_fn=default_data_collator, batch_size=4,
                        generator=torch.Generator().manual_seed(42))
    return Setup(model, optimizer, loader, loop=Train())
