"""Whether a saved state fits a run, said in words before anything is loaded, for the single file (checkpoint.py)
and the shards (sharded_checkpoint.py) alike: what run.save writes (its layout), each rank's part, the model, the
optimizer and the accelerators."""
from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel.errors import loops_level, named
from accel.files import size_text
from accel.hardware.launcher import rank, world_size
from accel.plan.contract import REGISTRY, Stage
from accel.plan.untrusted import unfolding

SUBCLASS = "a tensor of the class"  # (tensor_kind's words for a tensor subclass)
UNORDERED = "a tensor in a set, which has no order the checksum could read its tensors in"
SAID = (SUBCLASS, UNORDERED)  # (kinds whose words say why: run.save adds nothing)
EXTRA_STATE = "_extra_state"  # the key state_dict gives what a module's get_extra_state returns


def this_rank(saved: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """This rank's accelerator states and random state from a saved checkpoint (rank 0's when the world size
    changed, with a warning), and why it cannot resume here: one saved mid-accumulation holds each rank's own
    gradients, so it resumes only at its world size."""
    per_rank = saved.get("accelerators_per_rank") or [{}]
    rngs = saved["rng"] if isinstance(saved["rng"], list) else [saved["rng"]]
    if len(rngs) != world_size():
        warnings.warn(f"checkpoint saved by {len(rngs)} rank(s), loaded by {world_size()}: every rank takes rank 0's "
                      "random state", stacklevel=loops_level())
    holding = saved.get("holding_gradients")
    if holding is None:  # a file of 0.3: grad_accumulation's count of micro-batches tells
        holding = any(s.get("micro") for part in per_rank for s in part.values() if isinstance(s, dict))
    problems = [f"saved by {len(per_rank)} rank(s) in the middle of accumulating gradients, which differ per rank; "
                f"loaded by {world_size()}: resume from a checkpoint saved on an optimizer step"
                ] if len(per_rank) != world_size() and holding else []
    mine = per_rank[rank()] if len(per_rank) == world_size() else per_rank[0]
    return {"accelerators": {**saved.get("accelerators", {}), **mine},
            "rng": rngs[rank()] if len(rngs) == world_size() else rngs[0]}, problems


SPAN_SLACK = 64 << 20  # bytes a checkpoint's tensors may span beyond their storages (an expanded buffer's)


def spanning(saved: Any) -> str:
    """Why the tensors in saved would make more than their storages hold once made contiguous, as the checksum makes
    them, or "": torch.save keeps a view's strides, so a stride of 0 over a few bytes on disk spans any size."""
    stack, beyond = [saved], 0
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            beyond += max(0, item.numel() * item.element_size() - item.untyped_storage().nbytes())
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return (f"holds views that span {size_text(beyond)} more than their storages (a stride of 0): more than "
            f"{size_text(SPAN_SLACK)}") if beyond > SPAN_SLACK else ""


def tensor_kind(tensor: torch.Tensor) -> str:
    """What of a tensor the checksum or run.load cannot read, or "": it reads a dense tensor's bytes, which a meta
    tensor does not hold and a nested or sparse one holds in no flat order; and torch.load with weights_only rebuilds
    a tensor subclass only of a class the program allowed. (torch.load maps every storage to the CPU: a tensor
    saved on a device this machine lacks loads there.)"""
    if tensor.is_meta:
        return "a meta tensor, without data"
    if tensor.is_nested or tensor.layout is not torch.strided:
        return f"a {'nested' if tensor.is_nested else str(tensor.layout).removeprefix('torch.')} tensor"
    kind = type(tensor)
    if kind not in (torch.Tensor, nn.Parameter) and kind not in torch.serialization.get_safe_globals():
        return (f"{SUBCLASS} {kind.__module__}.{kind.__qualname__}, which torch.load(weights_only=True) reads "
                "only where torch.serialization.add_safe_globals names it")
    return ""


def unreadable(state: Any) -> list[tuple[str, str]]:
    """Each tensor of a state the checksum cannot read (tensor_kind), or cannot reach (in a set): its place
    (``model/2.bias``) and its kind, so that run.save refuses to write it and run.load to read it, each naming it."""
    stack, found = [(state, "")], []
    while stack:
        item, where = stack.pop()
        if isinstance(item, torch.Tensor) and (kind := tensor_kind(item)):
            found.append((where.lstrip("/"), kind))
        elif isinstance(item, dict):
            stack.extend((v, f"{where}/{named(k, 60)}") for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}/{i}") for i, v in enumerate(item))
        elif isinstance(item, (set, frozenset)):  # (no order of its own: the checksum's walk passes it by)
            found += [(f"{where}/{{...}}".lstrip("/"), UNORDERED) for v in item if isinstance(v, torch.Tensor)][:1]
    return sorted(found)


def layout_problems(saved: dict[str, Any]) -> list[str]:
    """What in a checkpoint's state is not of the kind run.save writes (a crafted file whose checksum matches),
    checked before anything else reads it, so that no file can make those raise anything but a CheckpointError."""
    huge = unfolding(saved)
    odd = [] if huge else unreadable(saved)
    if odd:
        more = f" (and {len(odd) - 1} more such tensors)" if len(odd) > 1 else ""
        return [f"its {odd[0][0]} is {odd[0][1]}{more}"]
    huge = huge or spanning(saved)  # (spanning reads storages: a sparse tensor has none)
    if huge:
        return [f"it {huge}"]

    def integer(value):
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    def listing(value, of):
        return isinstance(value, list) and all(of(v) for v in value)

    def mapping(value, of=lambda v: True):
        return isinstance(value, dict) and all(isinstance(k, str) and of(v) for k, v in value.items())

    def model(value):  # tensors, and what a module's get_extra_state gave (read back as plain data)
        return mapping(value) and all(isinstance(v, torch.Tensor) or k.endswith(EXTRA_STATE) for k, v in value.items())

    def optimizer(value):
        if value is None:
            return True
        state, groups = (value.get("state"), value.get("param_groups")) if isinstance(value, dict) else (None, None)
        return (isinstance(state, dict) and all(integer(i) and isinstance(s, dict) or isinstance(i, str)
                                                 for i, s in state.items())  # a name: an optimizer-wide value
                and listing(groups, lambda g: isinstance(g, dict) and listing(g.get("params"), integer)))

    def files(value):  # a sharded checkpoint's manifest: (size, hash) by the name of a file in its folder
        return mapping(value, lambda f: isinstance(f, (list, tuple)) and len(f) == 2 and integer(f[0])
                       and isinstance(f[1], str)) and all(n not in ("", "..") and Path(n).name == n for n in value)

    kinds = {"plan": lambda v: mapping(v, lambda o: isinstance(o, dict)), "model": model, "optimizer": optimizer,
             "optimizer_class": lambda v: v is None or isinstance(v, str), "step": integer, "epoch": integer,
             "optimizer_steps": integer, "world_size": integer, "holding_gradients": lambda v: isinstance(v, bool),
             "fresh_optimizer": lambda v: isinstance(v, bool),
             "sampler": lambda v: mapping(v, seed_value), "files": files,
             "rng": lambda v: isinstance(v, dict) or (listing(v, lambda r: isinstance(r, dict)) and v),
             "accelerators": lambda v: mapping(v, lambda a: isinstance(a, dict)),
             "accelerators_per_rank": lambda v: listing(v, lambda p: mapping(p, lambda a: isinstance(a, dict))),
             "loader_generators": lambda v: listing(v, lambda g: isinstance(g, torch.Tensor))}
    wrong = sorted(name for name, ok in kinds.items() if name in saved and not ok(saved[name]))
    return [f"its {', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not what run.save writes"] if wrong else []


def seed_value(value: Any) -> bool:
    """Whether run.save keeps this sampler value and run.load restores it: None, or an integer
    torch.Generator.manual_seed takes. Another kind (a user sampler's text seed) stays as the user's script sets it."""
    return value is None or isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**64


def model_problems(saved: dict[str, Any], current: dict[str, Any], model: nn.Module | None = None) -> list[str]:
    """Keys and shapes: ``saved`` maps each key to a tensor or a shape (DCP's metadata gives shapes); a saved tensor
    of another shape that the module holding it loads itself (``loaded_as_saved``, of ``model``) fits."""
    def shape(value):
        return tuple(value.shape) if isinstance(value, torch.Tensor) else tuple(value) if value is not None else None

    def some(keys):
        return f"{keys[:5]}{' ...' if len(keys) > 5 else ''}"

    missing, unexpected = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
    other = [k for k, v in current.items()
             if k in saved and isinstance(v, torch.Tensor) and shape(saved[k]) not in (None, tuple(v.shape))]
    taken = loaded_as_saved(model, saved, other) if other and model is not None else set()
    shapes = [f"{k} {shape(saved[k])} vs {tuple(current[k].shape)}" for k in other if k not in taken]
    problems = [f"the model's {some(missing)} are not in the checkpoint"] if missing else []
    problems += [f"the checkpoint's {some(unexpected)} are not in the model"] if unexpected else []
    return problems + (["shapes differ (checkpoint vs model): " + "; ".join(shapes[:5])] if shapes else [])


def loaded_as_saved(model: nn.Module, saved: dict[str, Any], keys: list[str]) -> set[str]:
    """Of these keys, whose saved tensors differ in shape from the model's, those that the module holding them loads
    without an error, as load_state_dict would: a module whose class loads its own state (torch.ao.quantization's
    observers and fake quantizers resize their statistics, empty until they first observe, to the saved ones). Tried
    on a copy of the module alone, its tensors on the meta device (nothing of the model is touched, nothing
    allocated); a Linear's weight of another shape, or a module refusing it, stays a problem."""
    owners = {f"{prefix}{'.' if prefix else ''}{name}": (module, prefix)
              for prefix, module in model.named_modules(remove_duplicate=False)
              for name in (*module._parameters, *module._buffers)}
    held: dict[tuple[int, str], tuple[nn.Module, str, list[str]]] = {}
    for key in keys:
        if (owner := owners.get(key)) and isinstance(saved[key], torch.Tensor) and \
                type(owner[0])._load_from_state_dict is not nn.Module._load_from_state_dict:
            held.setdefault((id(owner[0]), owner[1]), (*owner, []))[2].append(key)
    metadata = getattr(saved, "_metadata", None) or {}
    taken: set[str] = set()
    for module, prefix, own in held.values():
        start = f"{prefix}." if prefix else ""
        mine = {k: v for k, v in saved.items() if k.startswith(start) and "." not in k[len(start):]}
        errors: list[str] = []
        try:
            memo = {id(t): on_meta(t) for t in (*module._parameters.values(), *module._buffers.values())
                    if t is not None} | {id(module._modules): {}}  # its own tensors, as meta ones; no children
            copy.deepcopy(module, memo)._load_from_state_dict(mine, start, dict(metadata.get(prefix, {})), True,
                                                                [], [], errors)
        except Exception:  # noqa: BLE001 (a module that cannot be copied, or refuses the tensor: a problem)
            continue
        if not errors:
            taken.update(own)
    return taken


def on_meta(tensor: torch.Tensor) -> torch.Tensor:
    """An empty tensor like this one on the meta device (a parameter stays a parameter)."""
    meta = torch.empty_like(tensor, device="meta")
    return nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta


def optimizer_problems(optimizer, checkpoint: dict[str, Any]) -> list[str]:
    """The optimizer's class, and, where its saved state is in hand (one file: a sharded checkpoint's accel.pt has
    none, DCP's files hold it), its groups and state shapes."""
    saved_class, saved = checkpoint.get("optimizer_class"), checkpoint.get("optimizer")
    present = saved is not None if "optimizer" in checkpoint else saved_class is not None
    if saved_class and optimizer is not None and saved_class != type(optimizer).__name__:
        return [f"the checkpoint holds a {saved_class}'s state, this run's optimizer is a {type(optimizer).__name__}"]
    if (optimizer is None) == present:
        return [f"the checkpoint has {'an' if present else 'no'} optimizer state, this run has "
                f"{'one' if optimizer is not None else 'none'}"]
    if optimizer is None or saved is None:
        return []
    groups, current = saved.get("param_groups", []), optimizer.param_groups
    sizes, mine = [len(g["params"]) for g in groups], [len(g["params"]) for g in current]
    if sizes != mine:
        return [f"the optimizer's param groups hold {mine} parameters, the checkpoint's {sizes}"]
    settings = [f"group {n}'s {key}={saved_group[key]!r} (this optimizer's: {value!r})"
                for n, (saved_group, group) in enumerate(zip(groups, current)) for key, value in group.items()
                if key != "params" and key in saved_group and not _same_kind(saved_group[key], value)]
    if settings:
        return [f"param group settings of another kind: {'; '.join(settings[:5])}"]
    params = [p for g in current for p in g["params"]]
    index = [i for g in groups for i in g["params"]]
    total = sum(p.numel() for p in params)
    wrong = [f"param {i}" for i, p in zip(index, params)
             for t in saved.get("state", {}).get(i, {}).values()
             if isinstance(t, torch.Tensor) and not _fits(t.shape, p.shape, total)]
    return [f"optimizer state of another shape for {wrong[:5]}"] if wrong else []


def _same_kind(saved: Any, value: Any) -> bool:
    """Whether a saved param group setting can stand for this one: a number for a number (or a scalar tensor), a
    switch for a switch (None, True, False), text for text, a sequence of as many of the same kinds."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, torch.Tensor) and v.numel() == 1

    if value is None:  # unset: what the optimizer takes in its place (LBFGS's line_search_fn, a scheduler's lr)
        return saved is None or isinstance(saved, (bool, str)) or number(saved)
    for kind in (bool, str):
        if isinstance(value, kind):
            return saved is None or isinstance(saved, kind)
    if number(value):
        return number(saved)
    if isinstance(value, (list, tuple)):
        return isinstance(saved, (list, tuple)) and len(saved) == len(value) and all(map(_same_kind, saved, value))
    return True


def _fits(state: torch.Size, param: torch.Size, total: int) -> bool:
    """Whether an optimizer's state tensor fits its parameter: shaped like it, or broadcast over it (Adafactor's
    row and column variances, a scalar), or a flat vector of all the parameters (LBFGS's directions)."""
    try:
        if torch.broadcast_shapes(state, param) == param:
            return True
    except RuntimeError:
        pass
    return len(state) == 1 and state[0] == total


def fit_problems(run, saved: dict[str, Any], model: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Why a saved state does not fit the run, for both formats: the model's keys and shapes (``model``: the saved
    tensors, or the shapes in DCP's metadata, against ``current``), the optimizer (its class; where its state is in
    hand, one file, its groups and state shapes), and no state of an accelerator the run did not apply (less ddp
    and fsdp: one process loads a launched job's checkpoint, their states are its world's)."""
    names = set(saved.get("accelerators", {})) | {n for part in saved.get("accelerators_per_rank", []) for n in part}
    problems = model_problems(model, current, run.unwrap()) + optimizer_problems(run.optimizer, saved)
    stray = sorted(set(training_plan(dict.fromkeys(names))) - {a.name for a in run.accelerators})
    return problems + ([f"state of accelerators this run did not apply: {stray}"] if stray else [])


def training_plan(plan: dict[str, dict]) -> dict[str, dict]:
    """The plan without its distribution accelerators (ddp, fsdp): what decides the model and the training."""
    return {name: options for name, options in plan.items()
            if name not in REGISTRY or REGISTRY[name].stage is not Stage.DISTRIBUTION}
