"""fused_optimizer: step your own Adam, AdamW, SGD or Adagrad with ``fused=True``, one kernel for the update.

What it does: sets ``fused=True`` in the param groups of the optimizer you hold, so schedulers, ``param_groups`` and
your checkpoints stay live; ``run.close()`` puts them back. Other classes are skipped with the reason. When it helps:
the update is a large share of the step.

What it keeps: the same update (``SAME_MATH``). Its card: docs/accelerators/fused_optimizer.md.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from accel.errors import Skip
from accel.optim import describe_optimizer
from accel.plan.contract import SAME_MATH, Accelerator, Capability, Stage, State, register
from accel.plan.options import Options

__all__ = ["FusedOptimizer", "FusedOptimizerState"]

FUSABLE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad)


def sparse_makers(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer) -> list[str]:
    """The modules whose parameters this optimizer steps and whose backward gives sparse gradients (an Embedding or
    EmbeddingBag with ``sparse=True``, DLRM's tables), and the parameters that are sparse tensors themselves: torch's
    fused kernels take no sparse gradient."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    found = [name or type(model).__name__ for name, m in (model.named_modules() if model is not None else ())
             if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse
             and any(id(p) in stepped for p in m.parameters(recurse=False))]
    return found + [f"parameter {n} (a {p.layout} tensor)" for n, p in enumerate(
        p for group in optimizer.param_groups for p in group["params"]) if p.layout != torch.strided]


def fused_problem(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None = None) -> str | None:
    """Why this optimizer cannot take ``fused=True`` here (for the parameters of ``model``, where given), or None."""
    if optimizer.defaults.get("fused"):
        return f"{type(optimizer).__name__} is already fused"
    if type(optimizer) not in FUSABLE:
        return (f"{type(optimizer).__name__} has no fused implementation in torch "
                f"(fused: {', '.join(c.__name__ for c in FUSABLE)})")
    if optimizer.defaults.get("differentiable"):
        return "a differentiable optimizer cannot be fused"
    if sparse := sparse_makers(model, optimizer):
        return (f"sparse gradients from {', '.join(sparse[:3])}{' ...' if len(sparse) > 3 else ''} (an embedding "
                f"with sparse=True, or a sparse parameter): torch's fused {type(optimizer).__name__} cannot step them; "
                "the unfused step runs")
    from torch.optim.optimizer import _device_dtype_check_for_fused

    cuda_unsupported = isinstance(optimizer, torch.optim.Adagrad)  # torch fuses Adagrad on CPU only
    for group in optimizer.param_groups:
        for param in group["params"]:
            try:
                _device_dtype_check_for_fused(param, cuda_unsupported=cuda_unsupported)
            except RuntimeError as error:
                return f"{type(optimizer).__name__}: {error}"
    return None


KERNEL_KEYS = ("fused", "foreach")


def kernel_settings(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each param group's fused/foreach values, then the defaults' (what add_param_group gives a new group)."""
    return [{k: group.get(k) for k in KERNEL_KEYS} for group in [*optimizer.param_groups, optimizer.defaults]]


def as_yours(settings: list[dict], optimizer: torch.optim.Optimizer, state_dict: dict | None = None) -> dict | None:
    """Your own fused/foreach values (``settings``: kernel_settings() before the run) in the optimizer's groups and
    defaults, or in its ``state_dict`` (a state-dict post-hook, bound to your settings with functools.partial: a
    checkpoint as the plain loop's); a group added later takes your defaults' values."""
    *own, own_defaults = settings
    for index, group in enumerate(optimizer.param_groups if state_dict is None else state_dict["param_groups"]):
        group.update(own[index] if index < len(own) else own_defaults)
    if state_dict is None:
        optimizer.defaults.update(own_defaults)
    return state_dict


def fused_again(optimizer: torch.optim.Optimizer) -> None:
    """load_state_dict() restores the saved param groups, fused=False among them: the run stays fused. A fused step
    reads each parameter's step count on the parameter's device, as float32 (torch's own rule for fused and
    capturable states in load_state_dict): those tensors are replaced in the state."""
    for group in [*optimizer.param_groups, optimizer.defaults]:
        group["foreach"], group["fused"] = None, True
    for param, state in optimizer.state.items():
        step = state.get("step")
        if isinstance(step, torch.Tensor) and (step.device != param.device or step.dtype != torch.float32):
            state["step"] = step.to(param.device, torch.float32)


@dataclass
class FusedOptimizerState(State):
    user_settings: list[dict]  # kernel_settings() of your optimizer before the run: what close() and a save put back


@register
class FusedOptimizer(Accelerator[Options, FusedOptimizerState]):
    name = "fused_optimizer"
    stage = Stage.KERNELS  # after surgery, which rebuilds the optimizer on the new parameters
    requires = ("optimizer",)
    provides = (Capability.OPTIMIZER_UPDATE,)
    conflicts = (Capability.OPTIMIZER_UPDATE,)
    keeps = SAME_MATH

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}] if optimizer is not None and not fused_problem(optimizer, model) else []

    def apply(self, ctx):
        optimizer = ctx.optimizer
        if why := fused_problem(optimizer, ctx.model):
            raise Skip(why)
        sharded = ctx.plan.providing(Capability.MODEL_SHARDED)  # DTensor has fused kernels for Adam and AdamW only
        if sharded and not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            raise Skip(f"{sharded[0]} trains DTensor shards, and torch has no sharded fused kernel for "
                       f"{type(optimizer).__name__} (aten._fused_{type(optimizer).__name__.lower()}_ has no sharding "
                       "strategy; fused Adam and AdamW have one): the foreach step runs")
        journal, settings = ctx.journal, kernel_settings(optimizer)
        journal.change(f"your {type(optimizer).__name__}: fused=True", lambda: fused_again(optimizer),
                       lambda: as_yours(settings, optimizer), kind="object")
        journal.hook("optimizer state_dict hook: saves your fused/foreach",
                     lambda: optimizer.register_state_dict_post_hook(functools.partial(as_yours, settings)))
        journal.hook("optimizer load_state_dict hook: stays fused",
                     lambda: optimizer.register_load_state_dict_post_hook(fused_again))
        return FusedOptimizerState(settings, changes={
            "optimizer": f"your {type(optimizer).__name__} steps with fused=True (its param groups; "
                         "run.close() puts them back)",
            "state": "kept" if optimizer.state else "empty (no step taken yet)",
            "now": describe_optimizer(optimizer)})

    def optimizer_step(self, run, state, optimizer, proceed):
        """A step torch's fused kernels cannot take runs unfused, that step only, in the groups it concerns, as the
        plain loop: a group holding a sparse gradient (from your own code: ``F.embedding(..., sparse=True)``), and
        fused SGD with momentum where some parameters have a momentum buffer and others have none yet (a layer just
        unfrozen: TypeError)."""
        unfused = [group for group in optimizer.param_groups if group.get("fused") and (
            any(p.grad is not None and p.grad.layout != torch.strided for p in group["params"])
            or isinstance(optimizer, torch.optim.SGD) and group["momentum"]
            and len({optimizer.state.get(p, {}).get("momentum_buffer") is None
                     for p in group["params"] if p.grad is not None}) > 1)]
        for group in unfused:
            group["fused"] = False
        try:
            return proceed(optimizer)
        finally:
            for group in unfused:
                group["fused"] = True
