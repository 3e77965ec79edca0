"""A run's own copy of the user's module tree that shares every parameter and buffer with it.

Accelerators that change how modules run (a hook converting a conv's input to channels_last, a checkpointed
forward) change this copy, never the user's modules. The tensors are the same objects, so the user's model
and optimizer are trained as in a plain loop: in-place updates (weights, BatchNorm statistics) land in the
user's tensors, tied weights stay tied and frozen ones stay frozen.
"""
from __future__ import annotations

import copy
import sys
import types
import weakref
from collections import OrderedDict

from torch import nn

_ORIGINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # shared copy -> the user's module (a deep
# copy of a shared copy is a model of its own, so the link is kept here, not in an attribute deepcopy would copy)
HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
              "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
              "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


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


def shared_copy(module: nn.Module) -> nn.Module:
    """A new module tree of the same classes whose parameters and buffers are the user's own tensors.

    Hooks and attributes are copied, so adding a hook or replacing a forward on the copy leaves the user's
    modules as they were. A submodule used twice stays one module (used twice) in the copy.
    """
    memo: dict[int, nn.Module] = {}

    def copy_one(original: nn.Module) -> nn.Module:
        if id(original) in memo:
            return memo[id(original)]
        clone = copy.copy(original)  # a new __dict__ holding the same values
        memo[id(original)] = clone
        clone._parameters = OrderedDict(original._parameters)  # the same Parameter objects
        clone._buffers = OrderedDict(original._buffers)
        clone._non_persistent_buffers_set = set(original._non_persistent_buffers_set)
        for name in HOOK_DICTS:
            if name in original.__dict__:
                clone.__dict__[name] = OrderedDict(original.__dict__[name])
        clone._modules = OrderedDict((k, None if m is None else copy_one(m)) for k, m in original._modules.items())
        return clone

    clone = copy_one(module)
    _ORIGINS[clone] = _ORIGINS.get(module, module)
    clone.train = types.MethodType(_train_both, clone)  # run.model.eval() / .train() reach the user's modules too
    return clone


def _train_both(self: nn.Module, mode: bool = True) -> nn.Module:
    """train()/eval() on the run's copy also switches the user's modules: one model, one mode (dropout, BatchNorm
    statistics). Switch modes through the run's model: the user's own model.eval() does not reach the copy."""
    user = origin(self)
    if user is not self:
        nn.Module.train(user, mode)
    return nn.Module.train(self, mode)


def origin(module: nn.Module) -> nn.Module:
    """The user's module a shared copy was made from (the module itself otherwise)."""
    return _ORIGINS.get(module, module)


def tied_groups(model: nn.Module) -> list[list[str]]:
    """Names of the parameters that are one tensor (model.b.weight = model.a.weight), one list per tensor."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]
