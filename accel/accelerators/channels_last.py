"""channels_last: NHWC memory format for the inputs of a model's 2-D convolutions.

What it does: one process-wide forward pre-hook turns the input of each of the model's Conv2d into channels_last, so
oneDNN and cuDNN run their NHWC kernels; process-wide, as a hook on the user's modules would be pickled and deep-copied
with them. When it helps depends on the model and the CPU, which is why tune and ``plan="auto"`` measure it.

What it keeps: the same math in another memory order (``SAME_MATH``); dropout gets its input in the plain loop's
order, so it draws the plain loop's masks. Its card: docs/accelerators/channels_last.md.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref

import torch
from torch.nn.modules import module as nn_module
from torch.nn.modules.module import register_module_forward_pre_hook

from accel.errors import Skip
from accel.modules import recomputable
from accel.plan.contract import SAME_MATH, Accelerator, Capability, Stage, register

__all__ = ["ChannelsLast"]

def to_channels_last(args: tuple) -> tuple | None:
    """A conv's 4-D floating input in NHWC (a no-op when it already is); left as it is under a torch.func transform
    (vmap has no channels_last copy: per-sample gradients by vmap over grad would raise)."""
    if (args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4 and args[0].is_floating_point()
            and (torch.compiler.is_compiling() or not torch._C._functorch.is_functorch_wrapped_tensor(args[0]))):
        return (args[0].contiguous(memory_format=torch.channels_last), *args[1:])
    return None


def to_contiguous(args: tuple) -> tuple | None:
    """A dropout layer's input in the plain loop's memory order, since dropout draws its mask in memory order (an
    NHWC input would get another mask than the plain loop's)."""
    if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:])
    return None


@recomputable
class Layouts:
    """The forward pre-hook of every module in the process, changing the inputs of one run's convolutions and
    dropout layers and of no other module (keyed by id: dynamo traces that without a graph break). All held weakly:
    a layer that dies takes its key along (no other object is changed for taking its id), a model that dies
    unclosed the hook."""

    def __init__(self, model: torch.nn.Module, convs: list[torch.nn.Module], drops: list[torch.nn.Module]):
        self.layers = [(weakref.ref(m), change) for modules, change in ((convs, to_channels_last),
                                                                          (drops, to_contiguous)) for m in modules]
        self.model, self.changes, self.handle, self.ends = weakref.ref(model), {}, None, []
        self.ignored = ("ignore", self, UserWarning, None, 0)

    def __call__(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        change = self.changes.get(id(module))
        return None if change is None else change(args)

    def match(self, text: str) -> bool:
        """As the message of its own warnings filter: torch's warning at each call of a ``torch.compile(module)``
        wrapper while a global hook is registered, when the only ones are these (they pass the wrapper by; a user's
        own global hook earns the warning)."""
        return (text.startswith("Using `torch.compile(module)` when there are global hooks") and not (
            nn_module._global_forward_hooks or nn_module._global_backward_hooks or nn_module._global_backward_pre_hooks)
            and all(isinstance(hook, Layouts) for hook in nn_module._global_forward_pre_hooks.values()))

    def register(self) -> None:
        if self.handle is None:
            live = [(layer, change) for ref, change in self.layers if (layer := ref()) is not None]
            self.changes = {id(layer): change for layer, change in live}
            self.ends = [weakref.finalize(layer, self.changes.pop, id(layer), None) for layer, _ in live]
            self.ends.append(weakref.finalize(self.model(), self.remove))
            self.handle = register_module_forward_pre_hook(self)
            warnings.filters.insert(0, self.ignored)
            warnings._filters_mutated()

    def remove(self) -> None:
        if self.handle is not None:
            self.handle, handle = None, self.handle
            handle.remove()
            for end in self.ends:
                end.detach()
            with contextlib.suppress(ValueError):  # the user may have reset the filters meanwhile
                warnings.filters.remove(self.ignored)
            warnings._filters_mutated()


def has_conv2d(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


@register
class ChannelsLast(Accelerator):
    name = "channels_last"
    stage = Stage.KERNELS
    provides = (Capability.MODEL_LAYOUT,)
    keeps = SAME_MATH

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}] if has_conv2d(model) else []

    def decide(self, ctx):
        if not has_conv2d(ctx.model):
            raise Skip("the model has no Conv2d: channels_last only changes 2-D convolutions")

    def apply(self, ctx):
        convs = [m for m in ctx.model.modules() if isinstance(m, torch.nn.Conv2d)]
        drops = [m for m in ctx.model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
        hook = Layouts(ctx.model, convs, drops)
        ctx.journal.change(f"channels_last: the inputs of {len(convs)} Conv2d in NHWC, of {len(drops)} dropout "
                           "layer(s) in your memory order (their masks), by a process-wide forward pre-hook",
                           hook.register, hook.remove, kind="object")
        return {"memory_format": "channels_last", "conv2d_layers": len(convs),
                "inputs": "each Conv2d's input converted (the batch itself and your parameters unchanged)"}
