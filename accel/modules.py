"""What accelerators need to know of a user's module tree: whether it is compiled, which parameters are tied,
which train, and which modules are its repeated blocks (what activation_checkpointing, fsdp and compile work on)."""
from __future__ import annotations

import collections
import sys

from torch import nn


def compiled(module: nn.Module) -> bool:
    """A torch.compile wrapper (OptimizedModule), whose module tree cannot be copied and hooked."""
    dynamo = sys.modules.get("torch._dynamo")  # never imported: nothing can be compiled (and importing costs 1 s)
    return dynamo is not None and isinstance(module, dynamo.eval_frame.OptimizedModule)


def compiled_problem(module: nn.Module) -> str | None:
    """Why an accelerator that changes how the user's modules run cannot take this model, or None."""
    if compiled(module):
        return ("the model is already compiled (torch.compile's OptimizedModule), so its modules cannot be given "
                "hooks: pass the module itself (model._orig_mod) and add 'compile' to the plan")
    return None


def tied_groups(model: nn.Module) -> list[list[str]]:
    """Names of the parameters that are one tensor (model.b.weight = model.a.weight), one list per tensor."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def trainable(params: list[nn.Parameter]) -> tuple[bool, ...]:
    """Which of these parameters require gradients now: what DDP registered and a compiled graph was built for; a
    change of it is unfreezing, which wrappers built earlier do not see by themselves. Checked every step, so it
    takes a parameter list made once rather than walking model.parameters() each time."""
    return tuple(p.requires_grad for p in params)


CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def repeated_blocks(model: nn.Module) -> set[str]:
    """Class names of modules with children, no container, occurring at least twice: the model's blocks."""
    counts = collections.Counter(type(m).__name__ for m in model.modules()
                                 if m is not model and next(m.children(), None) is not None
                                 and not isinstance(m, CONTAINERS))
    return {name for name, count in counts.items() if count >= 2}


def listed(names: list[str], most: int = 8) -> str:
    """'layer1.0, layer1.1, ... (12 in all)': which modules, without a wall of text."""
    shown = ", ".join(names[:most])
    return shown + (f", ... ({len(names)} in all)" if len(names) > most else "")


def outermost(model: nn.Module, classes: set[str]) -> list[nn.Module]:
    """The modules of these classes that are not inside another one of them."""
    found: list[nn.Module] = []

    def walk(module: nn.Module) -> None:
        for child in module.children():
            if type(child).__name__ in classes:
                found.append(child)
            else:
                walk(child)

    walk(model)
    return found
