"""activation_checkpointing: recompute the activations of chosen blocks in backward instead of keeping them.

What it does: the forward of each chosen module of your model runs under ``torch.utils.checkpoint``
(non-reentrant): its inner activations are freed after the forward and recomputed during backward. The
checkpointed forward is a method bound to the module (recorded in the run's journal; ``run.close()`` takes it
away), so your ``train()``/``eval()``, hooks and a deep copy of the model (an EMA, ``AveragedModel``) keep
working: a copy's forward is bound to the copy. ``modules="auto"`` picks the repeated blocks (a class with
child modules that occurs at least twice and is not a container, such as resnet's BasicBlock or mobilenet's
InvertedResidual), outermost first; or name the classes (``modules=["Bottleneck"]``). Outside training with
gradients (eval, no_grad) the forward runs as it is.

When it helps: memory. Peak memory falls with the activations of the checkpointed blocks, which lets a larger
batch or model fit (benchmarks/bench_activation_checkpointing.py measures the peak saved and the time paid).
When it hurts: speed; every checkpointed block runs its forward twice, about a third more compute a step.

What it keeps: exactly the plain loop's training: the recomputation is the same computation, dropout draws
the same masks (the RNG state is kept), and BatchNorm statistics are updated once, as without it (the
recomputation's updates of a block's buffers are undone).
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from torch import nn

from accel.plan.contract import EXACT, Accelerator, Capability, Stage, register
from accel.plan.options import Options, option
from accel.errors import Problem, Skip
from accel.modules import compiled_problem, listed, outermost, repeated_blocks

def names_problem(value) -> str | None:
    ok = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    return None if ok else "must be a non-empty list of module class names"


def checkpointed_forward(self: nn.Module, *args, **kwargs):
    """The class's forward, recomputed in backward: it leaves the buffers as one forward leaves them and draws the
    same random numbers (dropout masks) as the first pass: the same training, less memory. Bound to the module
    (``types.MethodType``), so a deep copy of the model binds it to the copy."""
    forward = type(self).forward.__get__(self)
    if not (torch.is_grad_enabled() and self.training):  # eval or no_grad: nothing to keep for backward
        return forward(*args, **kwargs)
    buffers = list(self.buffers())
    calls = [0]

    def once_then_recompute(*a, **k):
        calls[0] += 1
        if calls[0] == 1:
            return forward(*a, **k)
        saved = [b.detach().clone() for b in buffers]  # the recomputation must not count a batch twice
        try:
            return forward(*a, **k)
        finally:
            with torch.no_grad():
                for buffer, value in zip(buffers, saved):
                    buffer.copy_(value)

    return torch.utils.checkpoint.checkpoint(once_then_recompute, *args, use_reentrant=False,
                                             preserve_rng_state=True, **kwargs)


def is_checkpointed(module: nn.Module) -> bool:
    forward = module.__dict__.get("forward")
    return getattr(forward, "__func__", None) is checkpointed_forward


@dataclass(frozen=True, kw_only=True)
class ActivationCheckpointingOptions(Options):
    modules: str | list = option("auto", (str, list), choices=("auto",), check=names_problem,
                                 help="class names of the modules to checkpoint; auto = the repeated blocks")


@register
class ActivationCheckpointing(Accelerator):
    name = "activation_checkpointing"
    stage = Stage.KERNELS
    provides = (Capability.MODEL_RECOMPUTE,)
    after = (Capability.MODEL_KERNELS, Capability.MODEL_LAYOUT)
    keeps = EXACT
    Options = ActivationCheckpointingOptions
    config: ActivationCheckpointingOptions

    def chosen_classes(self, model: nn.Module) -> tuple[set[str], list[str]]:
        """The classes to checkpoint in the model as the user gave it (decide's, check's and apply's alike: the
        plan's model may be another by apply, e.g. IPEX's), and the named classes it does not have."""
        if self.config.modules == "auto":
            return repeated_blocks(model), []
        present = {type(m).__name__ for m in model.modules()}
        return set(self.config.modules) & present, sorted(set(self.config.modules) - present)

    def decide(self, ctx):
        classes, _ = self.chosen_classes(ctx.model)
        if self.config.modules == "auto" and not classes:
            raise Skip("the model has no repeated block (a class with children occurring twice): name the "
                       "modules to checkpoint with modules=[...]")

    def check(self, ctx):
        why = compiled_problem(ctx.model)
        if why:
            return [Problem(self.name, why, field="model", kind="conflict")]
        _, missing = self.chosen_classes(ctx.model)
        if missing:
            return [Problem(self.name, f"no module of class {missing} in the model", field="modules",
                            value=self.config.modules, allowed="class names of the model's modules, e.g. "
                            + ", ".join(sorted(repeated_blocks(ctx.model)) or ["Bottleneck"]))]
        return []

    def apply(self, ctx):
        classes, _ = self.chosen_classes(ctx.user_model)  # what decide() chose, on the model it saw
        chosen = outermost(ctx.model, classes)
        if not chosen:  # e.g. IPEX replaced the named classes with its own
            raise Skip(f"no module of class {sorted(classes)} left in the model to checkpoint "
                       f"(found: {sorted({type(m).__name__ for m in ctx.model.modules()})[:6]})")
        names = {id(m): name for name, m in ctx.model.named_modules()}
        replaced = [names[id(m)] for m in chosen if "forward" in m.__dict__ and not is_checkpointed(m)]
        if replaced:
            raise Skip(f"the forward of {replaced[:4]} is already replaced on the instance (by your code or another "
                       "tool): checkpointing it would hide that")
        for module in chosen:
            if not is_checkpointed(module):
                ctx.journal.change(f"checkpointed forward on {names[id(module)]}",
                                   lambda m=module: setattr(m, "forward", types.MethodType(checkpointed_forward, m)),
                                   lambda m=module: m.__dict__.pop("forward", None), kind="object")
        return {"modules": f"{len(chosen)} x {', '.join(sorted(classes))}: " + listed([names[id(m)] for m in chosen]),
                "recompute": "their activations in backward (non-reentrant torch.utils.checkpoint)"}
