"""The tiny real objects of accel's own tests (and of tests of your accelerator): the book's TinyCNN, an Adam over
it, random 1x8x8 images. For checking plumbing, not accuracy."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel.workloads.book import TinyCNN


def tiny_model(seed: int = 0) -> TinyCNN:
    torch.manual_seed(seed)
    return TinyCNN()


def tiny_optimizer(model: nn.Module, lr: float = 0.01) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def tiny_loader(samples: int = 64, batch_size: int = 16, seed: int = 0, **kwargs: Any) -> DataLoader:
    """Random 1x8x8 images with labels 0-9: for checking plumbing, not accuracy."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, **kwargs)
