"""The book's models and real data that ships with scikit-learn (nothing can be downloaded where accel is tested):
sklearn's bundled 8x8 digits, optionally upsampled to the book's CIFAR-shaped 3x32x32. The demo, env and tests train
on them."""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.data import TensorDataset


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
    train, test = order[:cut], order[cut:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


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
    device = next(model.parameters()).device
    correct = 0
    for start in range(0, len(labels), batch_size):
        with (autocast or contextlib.nullcontext)():
            output = model(images[start:start + batch_size].to(device))
        correct += (output.argmax(1).cpu() == labels[start:start + batch_size]).sum().item()
    model.train(was_training)
    return correct / len(labels)
