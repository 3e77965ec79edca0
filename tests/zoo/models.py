"""The zoo's model (zoo): a small CNN on 1x8x8 digits whose variants hold what ordinary models hold,
and the patterns of real code that trip accelerators up: a list handed to each layer and appended to afterwards
(torchvision's DenseNet), a weight computed by a parametrization that updates its buffers in every forward
(spectral_norm, a GAN discriminator's), and a model that checkpoints its own blocks (timm's
``set_grad_checkpointing()``, whose recomputation counts BatchNorm's batches twice: the plain loop's training)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrizations
from torch.utils.checkpoint import checkpoint


class Residual(nn.Module):
    """A conv and a BatchNorm with a skip connection: the repeated block of a ResNet stage or a transformer."""

    def __init__(self, width: int):
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(width)

    def forward(self, x):
        return torch.relu(x + self.norm(self.conv(x)))


class DenseLayer(nn.Module):
    """torchvision's _DenseLayer in miniature: handed the list of every earlier feature map, which its block appends
    this layer's output to afterwards."""

    def __init__(self, inputs: int, growth: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(inputs)
        self.conv = nn.Conv2d(inputs, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return self.conv(torch.relu(self.norm(torch.cat(features, 1))))


class Net(nn.Module):
    """2 convs and a linear head on 1x8x8 digits; variants add what ordinary models have."""

    def __init__(self, batchnorm=False, heads=1, masked=False, tied=False, width=8, blocks=0, dense=0,
                 spectral=False, checkpoints_itself=False):
        super().__init__()
        self.masked = masked
        self.conv1 = nn.Conv2d(2 if masked else 1, width, 3, padding=1, bias=not batchnorm)  # as torchvision
        self.norm = nn.BatchNorm2d(width) if batchnorm else nn.Identity()
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        if spectral:  # a GAN discriminator's: its power iteration updates _u and _v in every training forward
            self.conv2 = parametrizations.spectral_norm(self.conv2)
        self.blocks = nn.Sequential(*[Residual(width) for _ in range(blocks)])  # what fsdp, activation
        # checkpointing and regional compile find by themselves
        self.grad_checkpointing = checkpoints_itself  # timm's flag, set by set_grad_checkpointing()
        growth = width // 2
        self.dense = nn.ModuleList([DenseLayer(width + i * growth, growth) for i in range(dense)])
        self.transition = nn.Conv2d(width + dense * growth, width, 1) if dense else nn.Identity()
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(width * 4, 10)
        self.heads = nn.ModuleList([nn.Linear(width * 4, 10) for _ in range(heads - 1)])
        if tied:  # one tensor under two names, as tied embeddings are
            self.heads[0].weight = self.fc.weight

    def forward(self, image, mask=None):
        x = torch.cat([image, mask], 1) if self.masked else image
        x = torch.relu(self.conv2(torch.relu(self.norm(self.conv1(x)))))
        if self.grad_checkpointing and self.training and torch.is_grad_enabled():  # timm's checkpoint_seq
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
        else:
            x = self.blocks(x)
        features = [x]  # torchvision's _DenseBlock: one list, appended to after each layer saw it
        for layer in self.dense:
            features.append(layer(features))
        x = torch.flatten(self.pool(self.transition(torch.cat(features, 1))), 1)
        out = self.fc(x)
        if not self.heads:
            return out
        return {"main": out, **{f"aux{i}": head(x) for i, head in enumerate(self.heads)}}


MODELS = {
    "cnn": dict(),
    "batchnorm": dict(batchnorm=True),
    "two_heads": dict(heads=2),
    "tied": dict(heads=2, tied=True),
    "frozen": dict(batchnorm=True),  # conv1 and the norm frozen
    "masked": dict(masked=True),  # takes the mask beside the image
    "blocks": dict(blocks=2),  # two repeated residual blocks with BatchNorm
    "dense": dict(dense=2),  # two DenseLayers handed one growing list
    "spectral": dict(spectral=True),  # conv2's weight from spectral_norm's power iteration, buffers updated in forward
    "self_checkpointing": dict(blocks=2, checkpoints_itself=True),  # its own blocks checkpointed, BatchNorm inside
}
