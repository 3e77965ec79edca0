"""ipex: ``ipex.optimize(model, optimizer=..., dtype=..., level=...)`` for training on cpu and xpu.

IPEX returns a new model and optimizer (prepacked weights, its own fused optimizer step) and the run uses
them. Its dtype follows the amp accelerator: bf16 training means bf16 autocast plus IPEX's bf16 kernels, so
a dtype that contradicts amp's is a plan error. IPEX kills the process on import when its major.minor
differs from torch's, so it is imported only after accel.hardware.ipex_problem() says it is safe.
IPEX is retired upstream after 2.8; on a 2-core Zen 3 it made resnet18 14% slower (docs/accelerators/ipex.md).
"""
from __future__ import annotations

import torch

from accel.accelerator import Accelerator, Option, Stage, register
from accel.accelerators.amp import DTYPES, auto_dtype
from accel.errors import Problem
from accel.hardware import ipex_problem
from accel.optim import copy_with_optimizer

IPEX_DTYPES = {**DTYPES, "float32": torch.float32, "fp32": torch.float32}


def amp_dtype(ctx) -> tuple[torch.dtype, str]:
    """The dtype the plan's amp will autocast to (float32 when there is no amp, or it will skip)."""
    amp = ctx.get("amp")
    if amp is None:
        return torch.float32, "no amp in the plan"
    if amp.dtype != "auto":
        return DTYPES[amp.dtype], f"amp dtype {amp.dtype!r}"
    dtype, why = auto_dtype(ctx.device, ctx.hardware)
    return (dtype or torch.float32), f"amp 'auto' on this {ctx.device.type}: {why}"


def short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@register
class Ipex(Accelerator):
    name = "ipex"
    stage = Stage.KERNELS
    options = {
        "dtype": Option("auto", (str,), choices=("auto", *IPEX_DTYPES), help="auto = follow amp (float32 without it)"),
        "level": Option("O1", (str,), choices=("O0", "O1"), help="ipex.optimize level: O1 fuses and prepacks"),
    }

    def check(self, ctx):
        problems = []
        why = ipex_problem()
        if why:  # e.g. "IPEX 2.8 needs torch 2.8.*, found 2.14.1": refused here, never imported
            problems.append(Problem(self.name, why, kind="missing"))
        if ctx.device.type not in ("cpu", "xpu"):
            problems.append(Problem(self.name, "IPEX optimizes for Intel CPUs and GPUs only", field="device",
                                    value=str(ctx.device), allowed="cpu, xpu", kind="missing"))
        if ctx.optimizer is None:
            problems.append(Problem(self.name, "ipex.optimize for training needs the optimizer: pass one to "
                                    "accel.accelerate(model, optimizer, ...)", kind="missing"))
        if self.dtype != "auto":
            follows, reason = amp_dtype(ctx)
            if IPEX_DTYPES[self.dtype] is not follows:
                problems.append(Problem(
                    self.name, f"contradicts the plan's precision ({reason}, so the model trains in "
                    f"{short(follows)}); IPEX's dtype must match amp's", field="dtype", value=self.dtype,
                    allowed=f"'auto' or {short(follows)!r}", kind="conflict"))
        return problems

    def apply(self, ctx):
        import intel_extension_for_pytorch as ipex  # safe: check() compared the versions

        dtype, why = amp_dtype(ctx) if self.dtype == "auto" else (IPEX_DTYPES[self.dtype], "asked for")
        model, optimizer = copy_with_optimizer(ctx.model, ctx.optimizer)  # IPEX trains in place: spare the user's
        model.train()
        ctx.model, ctx.optimizer = ipex.optimize(model, optimizer=optimizer, dtype=dtype, level=self.level)
        return {"dtype": short(dtype), "why": why, "level": self.level, "version": ipex.__version__,
                "model": "replaced by IPEX's (prepacked weights, fused ops)",
                "optimizer": f"replaced by IPEX's {type(ctx.optimizer).__name__} (fused step)"}
