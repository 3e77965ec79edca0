"""activation_checkpointing: recompute the activations of chosen blocks in backward instead of keeping them.

What it does: each chosen module (``modules="auto"``: the repeated blocks, outermost first) runs its forward under
non-reentrant ``torch.utils.checkpoint``, bound through the run's journal. When it helps: memory limits the batch or
the model; it costs speed (each block's forward runs twice).

What it keeps: the plain loop's training exactly, the recomputation seeing what the first pass saw (a call it cannot
replay runs unchecked, with a warning). Its card: docs/accelerators/activation_checkpointing.md.
"""
from __future__ import annotations

import contextlib
import copy
import enum
import random
import sys
import types
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from accel import modules
from accel.errors import Problem, Skip, loops_level
from accel.plan.contract import EXACT, Accelerator, Capability, Stage, State, register
from accel.plan.options import Options, module_classes

__all__ = ["ActivationCheckpointing", "ActivationCheckpointingOptions"]

# plain values: what a block is handed besides tensors and lists, tuples or dicts of them that a recomputation can see
# again as it was (not a KV cache object, say, which the block's forward may change)
ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, torch.layout,
         torch.memory_format, enum.Enum, slice, type(Ellipsis), types.FunctionType, types.BuiltinFunctionType)
COPIES: WeakIdKeyDictionary = WeakIdKeyDictionary()  # a tensor handed to blocks -> (its version, weakref to the copy)
WARNED: set[str] = set()


def copy_of(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as it is now, in a storage of its own with its strides, shared by the blocks it is handed to while
    its version does not change and a pass that took it waits for its backward (one copy of a mask for 12 blocks)."""
    version, copy_ref = COPIES.get(tensor, (None, None))
    if version == tensor._version and (copied := copy_ref()) is not None:
        return copied
    with torch.no_grad():  # sparse (no strides) or expanded: its values as laid out; else the same strides
        copied = tensor.detach().clone() if tensor.layout != torch.strided or torch._debug_has_internal_overlap(
            tensor) == 1 else torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype,
                                                  device=tensor.device).copy_(tensor)
    copied.requires_grad_(tensor.requires_grad)  # the recomputation saves what the first pass saved
    COPIES[tensor] = (tensor._version, weakref.ref(copied))
    return copied


MODULE_KEYS = frozenset(nn.Module().__dict__)  # every module's own attributes: its parameters, buffers, hooks, mode
MISSING = object()


def generator(value) -> tuple | None:
    """(get, set) of a random generator's state: torch's, Python's or numpy's; None for anything else (and while
    dynamo traces the block: your torch.compile wrapper around the model cannot test against random.Random)."""
    if torch.compiler.is_compiling():
        return None
    numpy = sys.modules.get("numpy")
    if isinstance(value, torch.Generator) or numpy is not None and isinstance(value, numpy.random.RandomState):
        return value.get_state, value.set_state
    if isinstance(value, random.Random) and not isinstance(value, random.SystemRandom):
        return value.getstate, value.setstate
    if numpy is not None and isinstance(value, numpy.random.Generator):
        bits = value.bit_generator
        return (lambda: bits.state), (lambda state: setattr(bits, "state", state))
    return None


def keep(value):
    """What a forward may change in place in a value, copied: a tensor's values (not a computed weight's), a
    container's items, a random generator's state; None for the rest (only rebinding changes a number)."""
    if isinstance(value, torch.Tensor):
        return None if value.requires_grad else value.detach().clone()
    if isinstance(value, (list, dict, set)):
        return copy.copy(value)
    access = generator(value)
    return access[0]() if access else None


def put(value, kept) -> None:
    """Put what keep() copied back into the value itself, where it changed (a value only rebound is left untouched:
    an expanded tensor takes no copy): a tensor's shape too (an observer's min_val, empty until it first observes,
    resized in place by its first pass), an inference tensor under inference_mode, as it was changed."""
    if not changed(value, kept):
        return
    if isinstance(value, torch.Tensor):
        with torch.no_grad(), torch.inference_mode() if value.is_inference() else contextlib.nullcontext():
            if value.shape != kept.shape:
                value.resize_(kept.shape)
            value.copy_(kept)
    elif isinstance(value, list):
        value[:] = kept
    elif isinstance(value, (dict, set)):
        value.clear()
        value.update(kept)
    else:
        generator(value)[1](kept)


def changed(value, kept) -> bool:
    if kept is None:
        return False
    if isinstance(value, torch.Tensor):  # (BatchNorm's statistics change without a new version: compared)
        return value.shape != kept.shape or not torch.equal(value, kept)
    if isinstance(value, list):
        return len(value) != len(kept) or any(a is not b for a, b in zip(value, kept))
    if isinstance(value, dict):
        return value.keys() != kept.keys() or any(value[k] is not kept[k] for k in kept)
    return not isinstance(value, set) or value != kept  # a generator: put back whatever it drew


def moment(parts: list[nn.Module]) -> tuple:
    """The modules' train/eval modes, Python's and numpy's (where imported) random states: set_moment puts them back."""
    numpy = sys.modules.get("numpy")
    return [m.training for m in parts], random.getstate(), numpy.random.get_state() if numpy is not None else None


def set_moment(parts: list[nn.Module], moment: tuple) -> None:
    for m, mode in zip(parts, moment[0]):
        m.training = mode
    random.setstate(moment[1])
    if moment[2] is not None:
        sys.modules["numpy"].random.set_state(moment[2])


class FirstPass:
    """What a block's first pass saw besides its inputs, for the recomputation to see it again: its modules' buffers
    and attributes (only those the pass changed are kept), their modes, Python's and numpy's random states."""

    def __init__(self, module: nn.Module):
        self.parts = list(module.modules())
        places = [d for m in self.parts for d in (m._buffers, m.__dict__)]
        self.state = [(d, key, value, keep(value)) for d in places for key, value in d.items()
                      if key not in MODULE_KEYS]
        self.keys = [(d, set(d)) for d in places]
        self.moment = moment(self.parts)

    def done(self) -> None:
        """Keep what the pass changed: rebound, changed in place, or added."""
        added = [(d, key, MISSING, None) for d, keys in self.keys for key in d.keys() - keys - MODULE_KEYS]
        self.state = [(d, key, value, kept) for d, key, value, kept in self.state
                      if d.get(key, MISSING) is not value or changed(value, kept)] + added
        self.keys = []

    @contextlib.contextmanager
    def again(self):
        """The block as the first pass found it; afterwards, as it is now (BatchNorm counts a batch once), whatever
        raised on the way: every place set back, all or nothing (the first error raised once all were tried)."""
        now, later = moment(self.parts), []  # each place as the first pass left it: what it holds, and its contents
        try:
            for d, key, value, kept in self.state:
                current = d.get(key, MISSING)
                later.append((current, keep(current), keep(value) if value is not current else None))
                place(d, key, value)
                put(value, kept)
            set_moment(self.parts, self.moment)
            yield
        finally:
            errors = []
            for (d, key, value, _), (current, current_kept, value_kept) in zip(self.state, later):
                for undo in (lambda: put(value, value_kept), lambda: place(d, key, current),
                             lambda: put(current, current_kept)):
                    try:
                        undo()
                    except Exception as error:  # noqa: BLE001 (the rest is set back first, then it is raised)
                        errors.append(error)
            set_moment(self.parts, now)
            if errors:
                raise errors[0]


def place(holder: dict, key: str, value) -> None:
    if value is MISSING:
        holder.pop(key, None)
    else:
        holder[key] = value


def checkpointed_forward(self: nn.Module, *args, **kwargs):
    """The class's forward, recomputed in backward from what the first pass saw (``FirstPass``, copies of the
    inputs). Bound to the module (``types.MethodType``), so a deep copy of the model binds it to the copy."""
    cls_forward = type(self).forward  # called with self, never bound: dynamo's resume function after a graph break

    def forward(*args, **kwargs):  # rebuilds a bound method as self.forward, which is this function again
        return cls_forward(self, *args, **kwargs)

    if not (torch.is_grad_enabled() and self.training):  # eval or no_grad: nothing to keep for backward
        return forward(*args, **kwargs)
    leaves, spec = tree_flatten((args, kwargs))
    others = sorted({type(v).__name__ for v in leaves if not isinstance(v, (torch.Tensor, *ATOMS))})
    hooks = modules.rerun_hooks(self)
    if others or hooks:
        why = (f"is handed {', '.join(others)}, which its forward may change and a recomputation could not see as it "
               "was" if others else f"holds forward hooks on its layers ({modules.listed(hooks, 3)}), which a "
               "recomputation in backward would run a second time (mark a hook that computes only from its arguments "
               "with accel.modules.recomputable)")
        if (said := f"{modules.qualified(type(self))}: {others or hooks}") not in WARNED:
            WARNED.add(said)
            warnings.warn(f"accel activation_checkpointing: a {type(self).__name__} {why}: those calls run without "
                          "checkpointing", stacklevel=loops_level())
        return forward(*args, **kwargs)
    versions = {i: v._version for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)}
    copies = {i: copy_of(leaves[i]) for i in versions}
    first = FirstPass(self)
    call = [(args, kwargs)]  # the first pass's own arguments, let go once it ran: the copies stand in for them

    def once_then_recompute(*_):
        if call:  # the first pass, on your tensors themselves: gradients reach them, in-place ops too
            given, named = call.pop()
            output = forward(*given, **named)
            first.done()
            changed = {i for i, version in versions.items() if leaves[i]._version != version}
            copies.update({i: copies[i].clone() for i in changed})  # its own in-place ops: a copy to change
            leaves[:] = [None if i in copies else v for i, v in enumerate(leaves)]
            return output
        again, named = tree_unflatten([copies.get(i, v) for i, v in enumerate(leaves)], spec)  # new containers
        with first.again():
            return forward(*again, **named)

    return torch.utils.checkpoint.checkpoint(once_then_recompute, *copies.values(), use_reentrant=False,
                                             preserve_rng_state=True)  # (the copies kept, and their devices' RNG)


@dataclass(frozen=True, kw_only=True)
class ActivationCheckpointingOptions(Options):
    modules: str | list = module_classes("class names of the modules to checkpoint; auto = the repeated blocks")


@register
class ActivationCheckpointing(Accelerator[ActivationCheckpointingOptions, State]):
    name = "activation_checkpointing"
    stage = Stage.KERNELS
    provides = (Capability.MODEL_RECOMPUTE,)
    after = (Capability.MODEL_KERNELS, Capability.MODEL_LAYOUT)
    keeps = EXACT

    def decide(self, ctx):
        if own := modules.checkpoints_itself(ctx.model):
            raise Skip(f"the model checkpoints its own activations already ({modules.listed(own, 3)}): checkpointing "
                       "them again would recompute them twice (and, under timm's, count BatchNorm's batches "
                       "otherwise); nothing to add")
        classes, _ = modules.chosen_classes(ctx.model, self.config.modules)
        if self.config.modules == "auto" and not classes:
            raise Skip("the model has no repeated block (a class with children occurring twice): name the "
                       "modules to checkpoint with modules=[...]")

    def check(self, ctx):
        if modules.hands_blocks_a_cache(ctx.model):
            return [Problem(self.name, "the model's config.use_cache is True: Hugging Face hands every block its KV "
                            "cache, which each block's forward appends to, and a recomputation would append again",
                            field="model", value=type(ctx.model).__name__,
                            allowed="model.config.use_cache = False for training (as Hugging Face's own "
                            "gradient_checkpointing_enable() does)", kind="conflict")]
        return modules.absent_classes(self.name, "modules", self.config.modules, ctx.model)

    def apply(self, ctx):
        classes, _ = modules.chosen_classes(ctx.user_model, self.config.modules)  # what decide() chose, on its model
        chosen = [ctx.model] if modules.of_class(ctx.model, classes) else modules.outermost(ctx.model, classes)
        if not chosen:  # e.g. IPEX replaced the named classes with its own
            raise Skip(f"no module of class {sorted(classes)} left in the model to checkpoint "
                       f"(found: {sorted({type(m).__name__ for m in ctx.model.modules()})[:6]})")
        names = {id(m): name or "(the whole model)" for name, m in ctx.model.named_modules()}
        new = [m for m in chosen if getattr(m.__dict__.get("forward"), "__func__", None) is not checkpointed_forward]
        if replaced := [names[id(m)] for m in new if "forward" in m.__dict__]:
            raise Skip(f"the forward of {replaced[:4]} is already replaced on the instance (by your code or another "
                       "tool): checkpointing it would hide that")
        for module in new:  # (one checkpointed by an earlier run on this model stays so)
            ctx.journal.change(f"checkpointed forward on {names[id(module)]}",
                               lambda m=module: setattr(m, "forward", types.MethodType(checkpointed_forward, m)),
                               lambda m=module: m.__dict__.pop("forward", None), kind="object")
        kinds = modules.class_names(ctx.model)
        return {"modules": f"{len(chosen)} x {', '.join(sorted({kinds[modules.own_class(m)] for m in chosen}))}: "
                           + modules.listed([names[id(m)] for m in chosen]),
                "recompute": "their activations in backward (non-reentrant torch.utils.checkpoint), from copies "
                             "of what each block was handed"}
