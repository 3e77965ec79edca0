"""Batches as users build them: any nesting of tuples, namedtuples, lists, dicts, UserDicts and dataclasses.

A leaf module (torch only): the run, the accelerators, the measurement code and the harness all walk batches
with these helpers, and none of them needs to import another to do it.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence
from typing import Any

import torch


def map_tensors(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """fn applied to every tensor of a batch, each container (tuples, namedtuples, lists, dicts, defaultdicts,
    UserDicts such as Hugging Face's BatchEncoding, dataclasses) keeping its type; anything else passes unchanged."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(fn, item) for item in batch))
    if isinstance(batch, (list, tuple)):
        items = [map_tensors(fn, item) for item in batch]
        if type(batch) in (list, tuple) or not isinstance(batch, MutableSequence):
            return type(batch)(items)
        clone = copy.copy(batch)  # a list subclass keeps its type and attributes
        clone[:] = items
        return clone
    if isinstance(batch, Mapping):
        if not isinstance(batch, MutableMapping):
            return {key: map_tensors(fn, value) for key, value in batch.items()}
        clone = copy.copy(batch)  # keeps the type, a defaultdict's factory, a BatchEncoding's attributes
        for key, value in batch.items():
            clone[key] = map_tensors(fn, value)
        return clone
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = {f.name: map_tensors(fn, getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **fields)
    return batch


def describe_batch(batch: Any) -> str:
    """'a dict with keys ['image', 'label']' / 'a tuple of [Tensor, Tensor]' / 'a Tensor of shape (16, 3, 8, 8)':
    what a batch is, for the messages that say what was expected instead."""
    if isinstance(batch, torch.Tensor):
        return f"a Tensor of shape {tuple(batch.shape)}"
    if isinstance(batch, Mapping) or hasattr(batch, "keys"):
        return f"a {type(batch).__name__} with keys {list(batch.keys())}"
    if isinstance(batch, (list, tuple)):
        return f"a {type(batch).__name__} of {[type(item).__name__ for item in batch]}"
    return f"a {type(batch).__name__}"


def move(batch: Any, device: torch.device, non_blocking: bool = False, transforms=()) -> Any:
    """Every tensor of a batch on the device (then each per-tensor transform), containers kept."""
    def one(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(device, non_blocking=non_blocking)
        for transform in transforms:
            tensor = transform(tensor)
        return tensor

    return map_tensors(one, batch)
