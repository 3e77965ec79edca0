"""What can be compared of a user's model, optimizer and loader, taken without changing them (``how``: also how they
run: hooks, forwards, kernel flags, which accelerators may change and run.close() puts back)."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from accel.accelerators.fsdp.surgery import gather_state
from accel.accelerators.fused_optimizer import KERNEL_KEYS, kernel_settings
from accel.batches import map_tensors
from accel.plan import same_options


@dataclass
class Snapshot:
    """What can be compared of a model, optimizer and loader, taken without changing them."""

    model_id: int
    tensors: dict[str, torch.Tensor]
    formats: dict[str, bool]
    param_ids: list[int]
    modules: list[str]
    trainable: dict[str, bool]
    optimizer: Any = None
    loader: dict[str, Any] = field(default_factory=dict)
    hooks: list[str] = field(default_factory=list)  # hooks and replaced forwards of every module
    grads: dict[str, Any] = field(default_factory=dict)
    kernels: list[dict] = field(default_factory=list)  # the optimizer's fused/foreach flags, per group + defaults
    optimizer_params: list[list[int]] = field(default_factory=list)  # ids of the parameters in each group

    def changes(self, other: Snapshot, how: bool = True, sharded: bool = False) -> list[str]:
        """Readable differences from this snapshot to another (``how=False``: not hooks, forwards, kernel flags;
        ``sharded``: not the parameters held as shards in place, with FSDP's classes, which run.close() undoes;
        their values are compared whole)."""
        out = []
        if self.model_id != other.model_id:
            out.append("model: a different object")
        for name in sorted(set(self.tensors) | set(other.tensors)):
            a, b = self.tensors.get(name), other.tensors.get(name)
            if a is None or b is None:
                out.append(f"model.{name}: {'added' if a is None else 'removed'}")
            elif a.shape != b.shape:
                out.append(f"model.{name}: shape {tuple(a.shape)} -> {tuple(b.shape)}")
            elif a.dtype != b.dtype or a.device != b.device:
                out.append(f"model.{name}: {a.dtype}@{a.device} -> {b.dtype}@{b.device}")
            elif not torch.equal(a, b):
                out.append(f"model.{name}: values changed")
            if a is not None and b is not None and self.formats[name] != other.formats[name]:
                out.append(f"model.{name}: memory format {'channels_last' if other.formats[name] else 'contiguous'}")
        for name, flag in other.trainable.items():
            if name in self.trainable and self.trainable[name] != flag:
                out.append(f"model.{name}: requires_grad {flag}")
        if self.param_ids != other.param_ids and not sharded:
            out.append("model: parameters replaced")
        if self.optimizer_params != other.optimizer_params and not sharded:
            out.append("optimizer: holds other parameters")
        if self.modules != (other.modules if not sharded else [m.removeprefix("FSDP") for m in other.modules]):
            out.append("model: module types changed")
        if how and self.kernels != other.kernels:
            out.append(f"optimizer: kernel flags {other.kernels} instead of {self.kernels}")
        if how and self.hooks != other.hooks:
            out.append(f"model: hooks or forwards changed: {sorted(set(self.hooks) ^ set(other.hooks))[:3]}")
        for name in sorted(set(self.grads) | set(other.grads)):
            a, b = self.grads.get(name), other.grads.get(name)
            if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                out.append(f"model.{name}.grad: changed")
        if not same_options(self.optimizer, other.optimizer):
            out.append("optimizer: changed")
        for key in sorted(set(self.loader) | set(other.loader)):
            if not same_options(self.loader.get(key), other.loader.get(key)):
                out.append(f"loader.{key}: {self.loader.get(key)!r} -> {other.loader.get(key)!r}")
        return out


def whole(value: Any) -> Any:
    """Tensors as one process sees them whole: DTensor shards gathered (fsdp), the rest as they are."""
    return map_tensors(gather_state, value)


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer | None = None, loader: Any = None) -> Snapshot:
    state = {k: whole(v).detach().clone() for k, v in model.state_dict().items()}
    formats = {k: v.dim() == 4 and v.is_contiguous(memory_format=torch.channels_last) and not v.is_contiguous()
               for k, v in model.state_dict().items()}
    opt, kernels = None, []
    if optimizer is not None:
        kernels = kernel_settings(optimizer)
        held = whole(optimizer.state_dict()["state"])  # its devices too: same_options compares across devices
        opt = (type(optimizer).__name__,
               [{k: v for k, v in g.items() if k not in ("params", *KERNEL_KEYS)} for g in optimizer.param_groups],
               copy.deepcopy(held), map_tensors(lambda tensor: tensor.device, held))
    loader_attrs = {}
    if loader is not None:
        loader_attrs = {k: getattr(loader, k, None) for k in
                        ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size",
                         "drop_last", "collate_fn", "sampler", "batch_sampler", "dataset", "worker_init_fn", "timeout")}
        loader_attrs["id"] = id(loader)
        generator = getattr(loader, "generator", None)
        loader_attrs["generator_state"] = generator.get_state().tolist() if generator is not None else None
    hooks = [f"{name}:{hook_dict}:{len(getattr(m, hook_dict))}" for name, m in model.named_modules()
             for hook_dict in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
             if getattr(m, hook_dict, None)]
    hooks += [f"{name}: forward replaced" for name, m in model.named_modules() if "forward" in m.__dict__]
    grads = {n: whole(p.grad).detach().clone() if p.grad is not None else None for n, p in model.named_parameters()}
    return Snapshot(id(model), state, formats, [id(p) for p in model.parameters()],
                    [type(m).__name__ for m in model.modules()],
                    {n: p.requires_grad for n, p in model.named_parameters()}, opt, loader_attrs, hooks, grads, kernels,
                    [[id(p) for p in g["params"]] for g in optimizer.param_groups] if optimizer is not None else [])
