"""Rebuild an optimizer: same class, same param-group hyperparameters, new parameters or new options.

Model surgery (prune) gives the model new parameter tensors and fused_optimizer changes one option; both
need an optimizer equal to the user's in everything else. The user's optimizer is never changed.
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any

import torch


def init_kwargs(optimizer: torch.optim.Optimizer, **overrides: Any) -> dict[str, Any]:
    """The optimizer's defaults that its class's __init__ accepts (AdamW stores Adam's decoupled_weight_decay
    in its defaults but takes no such argument; each param group still carries it)."""
    defaults = {**optimizer.defaults, **overrides}
    accepted = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        return defaults
    return {k: v for k, v in defaults.items() if k in accepted}


def rebuild_optimizer(optimizer: torch.optim.Optimizer, params: Sequence[Sequence[torch.Tensor]] | None = None,
                      keep_state: bool = True, **overrides: Any) -> torch.optim.Optimizer:
    """A new optimizer of ``type(optimizer)`` with its param groups' hyperparameters updated by ``overrides``, over
    ``params`` (one list per group; None: the current ones). ``keep_state`` copies the state through load_state_dict
    (cast and placed as the new options want); it needs the same shapes, so surgery passes False."""
    groups = optimizer.param_groups
    params = [list(p) for p in (params if params is not None else [group["params"] for group in groups])]
    if len(params) != len(groups):
        raise ValueError(f"rebuild_optimizer: {len(params)} parameter lists for {len(groups)} param groups")
    new_groups = [{**{k: v for k, v in group.items() if k not in ("params", "param_names")}, **overrides, "params": p}
                  for group, p in zip(groups, params)]
    try:
        new = type(optimizer)(new_groups, **init_kwargs(optimizer, **overrides))
    except TypeError as error:  # a custom optimizer whose __init__ does not take its own defaults back
        raise TypeError(f"cannot rebuild {type(optimizer).__name__} from its param groups and defaults: "
                        f"{error}") from error
    if keep_state and optimizer.state:
        state = copy.deepcopy(optimizer.state_dict())
        for saved in state["param_groups"]:
            saved.update(overrides)  # load_state_dict restores the saved options; keep the new ones
        new.load_state_dict(state)
    return new


def foreign_tensors(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[tuple[int, tuple[int, ...]]]:
    """(param group, shape) of every tensor the optimizer trains that is not a parameter of the model."""
    owned = {id(p) for p in model.parameters()}
    return [(i, tuple(p.shape)) for i, group in enumerate(optimizer.param_groups) for p in group["params"]
            if id(p) not in owned]


def same_params(optimizer: torch.optim.Optimizer, old: torch.nn.Module,
                new: torch.nn.Module) -> list[list[torch.Tensor]]:
    """Each param group's parameters, looked up by name in ``new`` (a copy of ``old``, or old after surgery); tied
    ones map to the copy's one tensor, tensors that are no parameter of the model stay the same objects."""
    names = {}
    for name, param in old.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), name)
    params = dict(new.named_parameters(remove_duplicate=False))
    return [[params[names[id(p)]] if id(p) in names else p for p in group["params"]]
            for group in optimizer.param_groups]


def copy_with_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
    """A deep copy of the model and the optimizer rebuilt on it (state kept), for tools that work in place."""
    clone = copy.deepcopy(model)
    return clone, rebuild_optimizer(optimizer, same_params(optimizer, model, clone)) if optimizer is not None else None


def describe_optimizer(optimizer: torch.optim.Optimizer) -> str:
    """'Adam(lr=0.001, fused=True), 2 groups' for the report."""
    keys = ("lr", "momentum", "weight_decay", "fused", "foreach")
    shown = ", ".join(f"{k}={optimizer.defaults[k]}" for k in keys if optimizer.defaults.get(k) is not None)
    groups = len(optimizer.param_groups)
    return f"{type(optimizer).__name__}({shown})" + (f", {groups} param groups" if groups > 1 else "")


def optimizer_moment(optimizer: torch.optim.Optimizer, whole: bool = False) -> dict:
    """A copy of what the optimizer's steps change: its state (lists of tensors too: LBFGS's history) and what its
    param groups hold besides the hyperparameters a scheduler moves (``defaults``' keys): timm's Lamb and Adan count
    their steps in ``group["step"]``, in place or not. ``whole``: the hyperparameters and the gradients too (torch's
    step with lr 0 and zero gradients that creates a state, which leaves them so where the step raises)."""
    moment = {"state": {p: copy.deepcopy(state) for p, state in optimizer.state.items()},
              "groups": [{k: copy.deepcopy(v) for k, v in group.items() if k != "params" and k not in
                          optimizer.defaults} for group in optimizer.param_groups]}
    if whole:
        moment["whole"] = [({k: v for k, v in group.items() if k in optimizer.defaults},
                            [(p, p.grad) for p in group["params"]]) for group in optimizer.param_groups]
    return moment


def set_optimizer_moment(optimizer: torch.optim.Optimizer, moment: dict) -> None:
    """Put back what ``optimizer_moment`` kept (its state objects become the optimizer's)."""
    optimizer.state.clear()
    optimizer.state.update(moment["state"])
    put_groups(optimizer.param_groups, moment["groups"], optimizer.defaults)
    for group, (hyperparameters, grads) in zip(optimizer.param_groups, moment.get("whole", ())):
        group.update(hyperparameters)
        for p, grad in grads:
            p.grad = grad


def put_groups(groups: list[dict], kept: list[dict], defaults: dict) -> None:
    """Each group's entries besides its hyperparameters as kept: one a step added since is removed (a group added
    since, and the hyperparameters, are left as they are)."""
    for group, entries in zip(groups, kept):
        for key in [k for k in group if k not in ("params", "param_names") and k not in defaults and k not in entries]:
            del group[key]
        group.update(copy.deepcopy(entries))
