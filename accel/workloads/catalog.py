"""A workload zoo of what people train today, each with its users' loss: the book's five seed CNNs, Hugging Face
BERT, GPT-2 and ViT built from configs, a timm CNN, a torchvision detector, an LSTM on packed sequences. Random
weights and data of the right shapes; transformers and timm are imported only when their workload is built.

    model, optimizer, loader = WORKLOADS["bert"].build("tiny")   # "tiny" for tests, "real" for benchmarks
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader

SIZES = ("tiny", "real")


@dataclass(frozen=True)
class Workload:
    name: str
    make: Callable[[str], tuple[nn.Module, Any]]  # size -> (model, dataset)
    loss: Callable[[nn.Module, Any], torch.Tensor]  # the user's loss on a batch
    requires: tuple[str, ...] = ()  # packages it needs (skipped where they are missing)
    batch_size: dict[str, int] | None = None
    collate: Callable | None = None
    lr: float = 1e-3

    def build(self, size: str = "tiny", seed: int = 0, steps: int = 64, batch: int | None = None):
        """The model, an AdamW over it and a shuffled loader of `steps` batches, all from `seed`. `batch` overrides
        the size's batch (a real-size step takes seconds on a few cores)."""
        if size not in SIZES:
            raise ValueError(f"size {size!r}: one of {SIZES}")
        torch.manual_seed(seed)
        model, make_data = self.make(size)
        batch = batch or (self.batch_size or {"tiny": 4, "real": 16})[size]
        loader = DataLoader(make_data(batch * steps), batch_size=batch, shuffle=True, collate_fn=self.collate,
                            generator=torch.Generator().manual_seed(seed))
        return model, torch.optim.AdamW(model.parameters(), lr=self.lr), loader


def _images(channels: int, size: int, classes: int) -> Callable[[int], list]:
    def make(count: int) -> list:
        generator = torch.Generator().manual_seed(1)
        images = torch.randn(count, channels, size, size, generator=generator)
        labels = torch.randint(0, classes, (count,), generator=generator)
        return list(zip(images, labels))
    return make


def _classify(model: nn.Module, batch: Any) -> torch.Tensor:
    """Cross-entropy of the model on a batch's inputs (images; an LSTM's ids and lengths) against its last item."""
    *inputs, labels = batch
    return nn.functional.cross_entropy(model(*inputs), labels)


def _torchvision(name: str) -> Callable[[str], tuple]:
    def make(size: str):
        import torchvision  # slow to import: paid when a torchvision workload is built, as transformers and timm

        classes = 10 if size == "tiny" else 1000
        model = getattr(torchvision.models, name)(weights=None, num_classes=classes)
        return model, _images(3, 64 if size == "tiny" else 224, classes)
    return make


def _tokens(vocab: int, length: int, labels: Callable[[torch.Tensor, torch.Generator], torch.Tensor]):
    def make(count: int) -> list:
        generator = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab, (count, length), generator=generator)
        lengths = torch.randint(length // 2, length + 1, (count,), generator=generator)
        mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        target = labels(ids, generator)
        return [{"input_ids": ids[i], "attention_mask": mask[i], "labels": target[i]} for i in range(count)]
    return make


# the tiny transformers' sizes (BERT's and ViT's names); their real size is the config's default (the -base model)
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _bert(size: str):
    from transformers import BertConfig, BertForSequenceClassification

    tiny = size == "tiny"
    config = BertConfig(num_labels=3, **(dict(TINY, vocab_size=200, max_position_embeddings=128) if tiny else {}))
    data = _tokens(config.vocab_size, 16 if tiny else 128, lambda ids, g: torch.randint(0, 3, (len(ids),), generator=g))
    return BertForSequenceClassification(config), data


def _gpt2(size: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    tiny = size == "tiny"
    config = GPT2Config(**({"vocab_size": 200, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64} if tiny
                           else {}))
    return GPT2LMHeadModel(config), _tokens(config.vocab_size, 16 if tiny else 256, lambda ids, g: ids.clone())


def _vit(size: str):
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(num_labels=10, **(dict(TINY, image_size=32, patch_size=8) if size == "tiny" else {}))
    images = _images(3, config.image_size, 10)
    return ViTForImageClassification(config), lambda count: [{"pixel_values": x, "labels": y} for x, y in images(count)]


def _hf_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss  # what Hugging Face users write


def _timm(size: str):
    import timm

    classes = 10 if size == "tiny" else 1000
    model = timm.create_model("resnet10t" if size == "tiny" else "resnet50", pretrained=False, num_classes=classes)
    return model, _images(3, 64 if size == "tiny" else 224, classes)


def _detector(size: str):
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    side = 128 if size == "tiny" else 320
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=4, min_size=side,
                                                  max_size=side)

    def make(count: int) -> list:
        generator = torch.Generator().manual_seed(1)
        items = []
        for _ in range(count):
            boxes = torch.rand(2, 2, generator=generator) * side * 0.5
            boxes = torch.cat([boxes, boxes + 8 + torch.rand(2, 2, generator=generator) * side * 0.4], dim=1)
            items.append((torch.rand(3, side, side, generator=generator),
                          {"boxes": boxes, "labels": torch.randint(1, 4, (2,), generator=generator)}))
        return items
    return model, make


def _detection_batch(items: list) -> tuple[list, list]:
    return [image for image, _ in items], [target for _, target in items]  # torchvision's (images, targets)


def _detection_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
    images, targets = batch
    return sum(model(images, targets).values())  # the detector returns its losses in training mode


class Tagger(nn.Module):
    """An LSTM over packed sequences: (ids, lengths) -> classes."""

    def __init__(self, vocab: int, width: int, classes: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(self.embed(ids), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)
        return self.head(hidden[-1])


def _lstm(size: str):
    tiny = size == "tiny"
    vocab, length = (100, 12) if tiny else (10000, 64)

    def make(count: int) -> list:
        generator = torch.Generator().manual_seed(1)
        ids = torch.randint(1, vocab, (count, length), generator=generator)
        lengths = torch.randint(2, length + 1, (count,), generator=generator)
        labels = torch.randint(0, 5, (count,), generator=generator)
        return list(zip(ids, lengths, labels))
    return Tagger(vocab, 16 if tiny else 256), make


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    *(Workload(name, _torchvision(model), _classify, ("torchvision",))
      for name, model in (("alexnet", "alexnet"), ("resnet18", "resnet18"), ("resnet50", "resnet50"),
                          ("vgg16", "vgg16"), ("mobilenet", "mobilenet_v2"))),
    Workload("bert", _bert, _hf_loss, ("transformers",), lr=5e-5),
    Workload("gpt2", _gpt2, _hf_loss, ("transformers",), batch_size={"tiny": 4, "real": 8}, lr=5e-5),
    Workload("vit", _vit, _hf_loss, ("transformers",), lr=5e-5),
    Workload("timm", _timm, _classify, ("timm",)),
    Workload("detector", _detector, _detection_loss, ("torchvision",), batch_size={"tiny": 2, "real": 4},
             collate=_detection_batch, lr=1e-4),
    Workload("lstm", _lstm, _classify, batch_size={"tiny": 8, "real": 64}),
)}
