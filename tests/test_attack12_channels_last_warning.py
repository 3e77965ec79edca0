"""Attack 12: the warnings filter channels_last adds for its process-wide hook passes torch's "global hooks" warning
by for that hook's sake only: a user's own global hook, and a torch.compile(module) called with it, earn the warning
as they do without a run."""
from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

import accel
from accel.testing import tiny_loader, tiny_optimizer
from accel.workloads import NormCNN


def test_a_users_own_global_hook_keeps_torchs_warning_about_compiled_modules():
    model = NormCNN()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=["channels_last"], device="cpu")
    handle = register_module_forward_hook(lambda module, args, output: None)  # the user's own
    try:
        with warnings.catch_warnings(record=True) as said:
            torch.compile(nn.Linear(2, 2), backend="eager")(torch.ones(2))
    finally:
        handle.remove()
        run.close()
    assert any("global hooks" in str(w.message) for w in said), [str(w.message) for w in said]
