"""The corpus: faithful small ports of the training loops people run (pytorch/examples, Hugging Face's examples,
timm's train.py, torchvision's references, diffusers' training example, peft, nanoGPT), each held to accel's cards
through every plan it admits (test_corpus.py).

Each module ports one upstream loop, named with its file in the module's docstring, and defines ``build()``: the
model, optimizer and loader as the upstream code builds them (from configs, tiny, with real digits or random
tokens: nothing is downloaded), and the loop's own body as an ``accel.testing.Loop`` whose ``step`` is the
upstream body with the run's calls (run.model, run.autocast(), run.backward(), run.step()); and ``REFUSES``, the
refusals it expects, by accelerator, as words of the PlanError.
"""
from __future__ import annotations

import functools

import torch
from torch.nn import functional as F

from accel.testing import Loop
from accel.workloads import digits_datasets


@functools.lru_cache(maxsize=8)
def digits(size: int = 8, samples: int = 48, channels: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn's real 8x8 digits in [0, 1], resized to size x size (MNIST's 28, DCGAN's 64) and repeated over
    ``channels``: the images and their labels."""
    images, labels = digits_datasets(seed=0)[0].tensors
    images = images[:samples]
    if size != 8:
        images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    return images.expand(-1, channels, -1, -1).contiguous(), labels[:samples]


def tokens(count: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """A stream of random token ids (what a tokenizer would give), the same for the same seed."""
    return torch.randint(0, vocab, (count,), generator=torch.Generator().manual_seed(seed))


def grouped_parameters(model, no_decay: list[str], weight_decay: float) -> list[dict]:
    """The no_trainer scripts' optimizer_grouped_parameters: weight decay off the biases and LayerNorm weights."""
    return [{"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
             "weight_decay": weight_decay},
            {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
             "weight_decay": 0.0}]


class NoTrainer(Loop):
    """The loop of Hugging Face's *_no_trainer examples (and peft's): outputs = model(**batch), loss = outputs.loss,
    the loss divided by gradient_accumulation_steps when it is more than 1, backward, and at each accumulation's end
    optimizer.step(), lr_scheduler.step() (get_scheduler's, on run.optimizer, where ``schedule`` names one)."""

    schedule: str | None = None
    warmup, accumulation = 0, 1

    def start(self, held, run):
        if self.schedule is not None:
            from transformers import get_scheduler

            self.lr_scheduler = get_scheduler(name=self.schedule, optimizer=run.optimizer,
                                              num_warmup_steps=self.warmup, num_training_steps=8)

    def step(self, index, run, held, batch, loss_of):
        with run.autocast():
            outputs = run.model(**batch)
            loss = outputs.loss
        if self.accumulation > 1:
            loss = loss / self.accumulation
        run.backward(loss)
        if (index + 1) % self.accumulation == 0:
            run.step()
            if self.schedule is not None:
                self.lr_scheduler.step()
        return loss.detach()
