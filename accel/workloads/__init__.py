"""What accel trains, in one place: real data that ships with scikit-learn (the 8x8 digits, optionally upsampled to
the book's CIFAR-shaped 3x32x32: nothing is downloaded where accel is tested), the book's CNNs and small GPT-2- and
ResNet-shaped models (random weights), torchvision's by name (bench, demo), the tiny objects of tests (plumbing, not
accuracy), and in catalog.py the workloads people train today (Hugging Face, timm, torchvision, an LSTM: ``WORKLOADS``).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel.workloads.catalog import SIZES, WORKLOADS, Tagger, Workload

__all__ = ["SIZES", "WORKLOADS", "BookCNN", "NormCNN", "Tagger", "TinyCNN", "TinyGPT", "Workload", "accuracy",
           "build_model", "cifar_shaped", "digits_datasets", "make_optimizer", "model_names", "tiny_loader",
           "tiny_model", "tiny_optimizer"]


class TinyCNN(nn.Module):
    """A small real CNN for 1x8x8 images (the shape of sklearn's digits): 2 convs, pool, 2 linears."""

    def __init__(self, channels: int = 1, classes: int = 10, width: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(2 * width * 4 * 4, 32)
        self.fc2 = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv2(torch.relu(self.conv1(x)))))
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


class BookCNN(nn.Module):
    """The book's CNN (chapters 2 and 6) for 3x32x32 images: two 3x3 conv + ReLU + 2x2 max-pool blocks (3->32->64),
    then Linear 4096->512->10."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * 8 * 8, 512)
        self.fc2 = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


def digits_datasets(seed: int = 0, test_fraction: float = 0.25) -> tuple[TensorDataset, TensorDataset]:
    """sklearn's real 8x8 digits, scaled to [0, 1], split into train and test sets."""
    from sklearn.datasets import load_digits  # a test and demo dependency, not the library's: imported when used

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(labels) * (1 - test_fraction))
    return tuple(TensorDataset(images[part], labels[part]) for part in (order[:cut], order[cut:]))


def cifar_shaped(dataset: TensorDataset, size: int = 32) -> TensorDataset:
    """1x8x8 digits upsampled to 3xSIZExSIZE, the input shape of the book's CIFAR-10 CNN (and of torchvision's)."""
    images, labels = dataset.tensors
    images = nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return TensorDataset(images.expand(-1, 3, -1, -1).contiguous(), labels)


@torch.no_grad()
def accuracy(model: nn.Module, dataset: TensorDataset, autocast=None, batch_size: int = 512) -> float:
    """Test accuracy of a model (on its own device, under an optional autocast context factory)."""
    was_training = model.training
    model.eval()
    images, labels = dataset.tensors
    device, correct = next(model.parameters()).device, 0
    for inputs, targets in zip(images.split(batch_size), labels.split(batch_size)):
        with (autocast or contextlib.nullcontext)():
            output = model(inputs.to(device))
        correct += (output.argmax(1).cpu() == targets).sum().item()
    model.train(was_training)
    return correct / len(labels)


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


def model_names() -> list[str]:
    import torchvision  # slow to import: paid by what builds a torchvision model, not by every `accel` command

    return ["tiny", *torchvision.models.list_models(module=torchvision.models)]


def build_model(name: str, classes: int = 1000) -> torch.nn.Module:
    """A torchvision model by name (random weights), or 'tiny' (TinyCNN on 3x8x8 images)."""
    if name == "tiny":
        return TinyCNN(channels=3, classes=classes)
    import torchvision  # slow to import (see model_names)

    return torchvision.models.get_model(name, weights=None, num_classes=classes)


def make_optimizer(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r} (allowed: 'adam', 'sgd')")
