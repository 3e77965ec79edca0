"""A zoo of ordinary user code to test accelerators against: where bugs hide, not the happy path.

``Case(model=..., batch=..., extra=..., loader=..., optimizer=..., loop=...).build()`` returns a ``Setup`` (model,
optimizer, loader, step function, loop behaviour, evaluation) over sklearn's real digits, built the same way from
the same seed every time, for ``check_equivalence``. The names of every choice are in MODELS, BATCHES, EXTRAS,
LOADERS, OPTIMIZERS and LOOPS (zoo.loops).
"""
from __future__ import annotations

import collections
import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    SubsetRandomSampler,
    default_collate,
)

from accel.testing.trace import Setup
from accel.workloads import digits_datasets
from zoo.loops import BY_HAND, LOOPS, SelfSharding
from zoo.models import MODELS, DenseLayer, Net, Residual  # noqa: F401  (the zoo's names)

Pair = collections.namedtuple("Pair", "image label")


class Encoding(collections.UserDict):
    """Like Hugging Face's BatchEncoding: a UserDict that carries attributes of its own."""

    def __init__(self, data=None, source="digits"):
        super().__init__(data)
        self.source = source


BATCHES = ("tuple", "namedtuple", "list", "dict", "ordered_dict", "user_dict")
EXTRAS = ("none", "mask", "soft_targets")
LOADERS = ("plain", "shuffled", "no_batching", "subclass", "stream", "sharded_stream", "sampler", "batch_sampler",
           "collate", "workers")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop", "groups", "extra_tensor")  # and "none",
# for a loop that updates the weights by hand (zoo.loops.BY_HAND)


# --- data --------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=2)
def digits(samples: int = 96):  # the first 96 train, 96-112 are held out for evaluation
    images, labels = digits_datasets(seed=0)[0].tensors
    images, labels = images[:samples], labels[:samples]
    mask = (images > 0.3).float()
    soft = torch.nn.functional.one_hot(labels, 10).float() * 0.9 + 0.01
    return images, labels, mask, soft


def pack(kind: str, image, label, extras: dict) -> Any:
    """One sample (or batch) in the user's container."""
    fields = {"image": image, "label": label, **extras}
    if kind == "tuple":
        return (image, label, *extras.values())
    if kind == "list":
        return [image, label, *extras.values()]
    if kind == "namedtuple":
        return Pair(image, label) if not extras else (Pair(image, label), extras)
    if kind == "dict":
        return fields
    if kind == "ordered_dict":
        return collections.OrderedDict(fields)
    return Encoding(fields)


def unpack(batch: Any, extra: str) -> dict:
    """image, label and the extra ("mask" or "soft") back from any container."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], Pair):  # collate lists tuples
        return {"image": batch[0].image, "label": batch[0].label, **batch[1]}
    if isinstance(batch, Pair):
        return {"image": batch.image, "label": batch.label}
    if isinstance(batch, (tuple, list)):
        return dict(zip(("image", "label", EXTRA_KEYS.get(extra, "")), batch))
    return dict(batch)


EXTRA_KEYS = {"mask": "mask", "soft_targets": "soft"}


class Samples(Dataset):
    def __init__(self, container: str, extra: str):
        self.container, self.extra = container, extra
        self.images, self.labels, self.mask, self.soft = digits()

    def extras(self, index) -> dict:
        values = {"mask": self.mask, "soft": self.soft}
        key = EXTRA_KEYS.get(self.extra)
        return {key: values[key][index]} if key else {}

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return pack(self.container, self.images[index], self.labels[index], self.extras(index))


class Batches(Samples):
    """Already batched: for DataLoader(batch_size=None), which does no batching of its own."""

    def __len__(self):
        return len(self.labels) // 16

    def __getitem__(self, index):
        window = slice(16 * index, 16 * index + 16)
        return pack(self.container, self.images[window], self.labels[window], self.extras(window))


class Stream(IterableDataset):
    """A stream of samples that does not know about DataLoader workers (each worker would repeat it)."""

    def __init__(self, samples: Samples):
        self.samples = samples

    def __iter__(self):
        yield from (self.samples[i] for i in range(len(self.samples)))


class ShardedStream(SelfSharding):
    """A stream split between DataLoader workers by turns, as torch documents."""


class UserLoader(DataLoader):
    """A DataLoader subclass, as libraries ship them."""


def counting_collate(batch):
    return default_collate(batch)


def seed_worker(worker_id: int) -> None:
    torch.manual_seed(1000 + worker_id)


def loader_for(kind: str, container: str, extra: str, seed: int) -> DataLoader:
    samples = Samples(container, extra)
    generator = torch.Generator().manual_seed(seed)
    if kind == "plain":
        return DataLoader(samples, batch_size=16)
    if kind == "shuffled":
        return DataLoader(samples, batch_size=16, shuffle=True, generator=generator, drop_last=True)
    if kind == "no_batching":
        return DataLoader(Batches(container, extra), batch_size=None, shuffle=True, generator=generator)
    if kind == "subclass":
        return UserLoader(samples, batch_size=16, shuffle=True, generator=generator)
    if kind == "stream":
        return DataLoader(Stream(samples), batch_size=16)
    if kind == "sharded_stream":
        return DataLoader(ShardedStream(samples), batch_size=16)
    if kind == "sampler":
        return DataLoader(samples, batch_size=16, sampler=SubsetRandomSampler(range(80), generator=generator))
    if kind == "batch_sampler":
        return DataLoader(samples, batch_sampler=BatchSampler(SequentialSampler(samples), 12, drop_last=False))
    if kind == "collate":
        return DataLoader(samples, batch_size=16, collate_fn=counting_collate)
    return DataLoader(samples, batch_size=16, num_workers=1, prefetch_factor=4, timeout=30, persistent_workers=True,
                      multiprocessing_context="fork", generator=generator, shuffle=True,
                      worker_init_fn=seed_worker)


# --- optimizers and the step ---------------------------------------------------------------------------------------

def optimizer_for(kind: str, model: nn.Module, temperature: torch.Tensor):
    params = list(model.parameters())
    if kind == "none":
        return None
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05)
    if kind == "momentum":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=0.05)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=0.005)
    if kind == "groups":
        head = [p for n, p in model.named_parameters() if n.startswith(("fc", "heads"))]
        rest = [p for n, p in model.named_parameters() if not n.startswith(("fc", "heads"))]
        return torch.optim.SGD([{"params": rest, "lr": 0.02}, {"params": head, "lr": 0.1, "momentum": 0.5}], lr=0.05)
    return torch.optim.Adam([{"params": params}, {"params": [temperature], "lr": 0.05}], lr=0.01)


def step_fn(run, batch: Any, extra: str, masked: bool, temperature: torch.Tensor,
            inplace: bool = False) -> torch.Tensor:
    """The user's loss: the mask beside the image weighs it (viewed flat), soft targets replace labels. ``inplace``:
    then the mask is normalised in place (zoo.loops.InplaceInput), unless it is a view of the data."""
    fields = unpack(batch, extra)
    image, label, mask, soft = fields["image"], fields["label"], fields.get("mask"), fields.get("soft")
    output = run.model(image, mask) if masked else run.model(image)
    logits = (output["main"] if isinstance(output, dict) else output) / temperature
    loss = nn.functional.cross_entropy(logits, soft if soft is not None else label)
    if isinstance(output, dict):
        loss = loss + 0.5 * sum(nn.functional.cross_entropy(v, label) for k, v in output.items() if k != "main")
    if mask is not None:
        flat = mask.view(mask.shape[0], -1)  # a view: a mask converted to channels_last would fail here
        loss = loss * (1 + 0.1 * flat.mean())
        if inplace and mask._base is None:  # (the no_batching loader's masks are views of the dataset's)
            mask.sub_(0.5)
    return loss


def evaluate(model: nn.Module, masked: bool) -> torch.Tensor:
    """The user's evaluation: the main output on held-out digits."""
    images, _, mask, _ = digits(samples=128)
    images, mask = images[96:112], mask[96:112]
    output = model(images, mask) if masked else model(images)
    return output["main"] if isinstance(output, dict) else output


@dataclass(frozen=True)
class Case:
    """One user's code: a model, its batches' container and extras, a DataLoader and an optimizer."""

    model: str = "cnn"
    batch: str = "tuple"
    extra: str = "none"
    loader: str = "plain"
    optimizer: str = "sgd"
    loop: str = "plain"
    seed: int = 0

    def build(self) -> Setup:
        extra = "mask" if self.model == "masked" else self.extra
        torch.manual_seed(self.seed)
        model = Net(**MODELS[self.model])
        if self.model == "frozen":
            for module in (model.conv1, model.norm):
                module.requires_grad_(False)
        temperature = torch.tensor(1.5, requires_grad=self.optimizer == "extra_tensor")
        optimizer = optimizer_for(self.optimizer, model, temperature)
        loader = loader_for(self.loader, self.batch, extra, self.seed)
        masked = self.model == "masked"
        loop = {**LOOPS, **BY_HAND}[self.loop]()
        step = functools.partial(step_fn, extra=extra, masked=masked, temperature=temperature,
                                 inplace=getattr(loop, "changes_inputs", False))
        return Setup(model, optimizer, loader, step_fn=step, loop=loop,
                     evaluate=functools.partial(evaluate, masked=masked))

    def __str__(self) -> str:
        return f"{self.model}/{self.batch}+{self.extra}/{self.loader}/{self.optimizer}/{self.loop}"
