"""Small models shaped like what people train, for tests and benchmarks: a GPT-style decoder and a CNN with
BatchNorm in repeated stages (random weights, sizes from arguments); and the tiny real objects of accel's tests and
of tests of your accelerator (the book's TinyCNN, an Adam over it, random 1x8x8 images), for plumbing, not accuracy."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel.workloads.book import TinyCNN


class Block(nn.Module):
    """A pre-norm transformer decoder block: causal self-attention, then an MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, bias=False, batch_first=True)  # no biases: a key's
        # bias has a zero gradient in exact math, and Adam would turn its rounding noise into steps
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool, device=x.device), 1)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, repeated Blocks, a final norm and a head tied to the token embedding."""

    def __init__(self, vocab: int = 64, width: int = 32, layers: int = 2, heads: int = 2, context: int = 16):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2's
        for embedding in (self.tokens, self.positions):
            nn.init.normal_(embedding.weight, std=0.02)  # GPT-2's initialisation

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class Stage(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual: a ResNet stage in miniature."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1, self.norm1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.conv2, self.norm2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.norm2(self.conv2(torch.relu(self.norm1(self.conv1(x))))))


class NormCNN(nn.Module):
    """A stem, repeated Stages with BatchNorm, a pooled linear head: for 1-channel 8x8 digits by default."""

    def __init__(self, channels: int = 8, stages: int = 2, classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU())
        self.stages = nn.Sequential(*[Stage(channels) for _ in range(stages)])
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


def tiny_model(seed: int = 0) -> TinyCNN:
    torch.manual_seed(seed)
    return TinyCNN()


def tiny_optimizer(model: nn.Module, lr: float = 0.01) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def tiny_loader(samples: int = 64, batch_size: int = 16, seed: int = 0, **kwargs: Any) -> DataLoader:
    """Random 1x8x8 images with labels 0-9."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, **kwargs)
