"""ipex: ``ipex.optimize(model, optimizer=..., dtype=..., level=...)`` for training on cpu and xpu.

What it does: IPEX returns a new model and optimizer made from copies, the user's untouched, in the plan's dtype;
IPEX is imported only after ``accel.hardware.ipex_problem()`` says it is safe (a version mismatch kills the process).
When it helps: CPUs with AVX-512 or AMX; little on AVX2-only CPUs.

What it keeps: the same math in fp32 (``SAME_MATH``), amp's tolerance with bf16. Its card: docs/accelerators/ipex.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from accel.errors import Problem, Skip
from accel.hardware import ipex_problem
from accel.modules import buffer_values, put_back_buffers
from accel.optim import copy_with_optimizer, foreign_tensors
from accel.plan.contract import SAME_MATH, Accelerator, Capability, Stage, State, dtype_name, register
from accel.plan.options import Options, option

__all__ = ["Ipex", "IpexOptions"]

IPEX_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
               "float32": torch.float32, "fp32": torch.float32}


@dataclass(frozen=True, kw_only=True)
class IpexOptions(Options):
    dtype: str = option("auto", (str,), choices=("auto", *IPEX_DTYPES),
                        help="auto = follow amp (float32 without it)")
    level: str = option("O1", (str,), choices=("O0", "O1"), help="ipex.optimize level: O1 fuses and prepacks")


@register
class Ipex(Accelerator[IpexOptions, State]):
    name = "ipex"
    stage = Stage.KERNELS
    provides = (Capability.MODEL_KERNELS, Capability.OPTIMIZER_UPDATE, Capability.MODEL_COPY)
    conflicts = (Capability.OPTIMIZER_UPDATE,)
    after = (Capability.MODEL_LAYOUT,)
    requires = ("optimizer",)
    keeps = SAME_MATH

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}] if optimizer is not None and ipex_problem() is None else []

    def followed(self, ctx) -> tuple[torch.dtype, str]:
        """The dtype the plan trains in: its decided compute dtype, else float32."""
        if (decided := ctx.decisions.compute_dtype) is None:
            return torch.float32, "no compute dtype decided in the plan"
        return decided, (f"the plan's compute dtype ({ctx.decisions.by['compute_dtype']}: "
                         f"{ctx.decisions.why['compute_dtype']})")

    def check(self, ctx):
        problems = []
        if why := ipex_problem():  # e.g. "IPEX 2.8 needs torch 2.8.*, found 2.14.1": refused here, never imported
            problems.append(Problem(self.name, why, kind="missing"))
        if ctx.device.type not in ("cpu", "xpu"):
            problems.append(Problem(self.name, "IPEX optimizes for Intel CPUs and GPUs only", field="device",
                                    value=str(ctx.device), allowed="cpu, xpu", kind="missing"))
        if ctx.optimizer is not None and (foreign := foreign_tensors(ctx.optimizer, ctx.model)):
            problems.append(Problem(self.name, "the optimizer trains tensors that are not parameters of the model "
                                    f"(param group, shape: {foreign}); "
                                    "ipex.optimize rebuilds the optimizer on the model's parameters and would drop "
                                    "them", field="optimizer", kind="conflict"))
        follows, reason = self.followed(ctx)
        if self.config.dtype != "auto" and IPEX_DTYPES[self.config.dtype] is not follows:
            problems.append(Problem(
                self.name, f"contradicts the plan's precision ({reason}, so the model trains in "
                f"{dtype_name(follows)}); IPEX's dtype must match it", field="dtype", value=self.config.dtype,
                allowed=f"'auto' or {dtype_name(follows)!r}", kind="conflict"))
        return problems

    def apply(self, ctx):
        import intel_extension_for_pytorch as ipex  # safe: check() compared the versions

        config = self.config
        dtype, why = self.followed(ctx) if config.dtype == "auto" else (IPEX_DTYPES[config.dtype], "asked for")
        prepack = prepacks(ipex, ctx.device, dtype)
        if prepack is not True and dtype is torch.float16 and config.level == "O1":
            raise Skip(f"IPEX's float16 step updates float32 master weights it links to prepacked ones only: unpacked, "
                       f"the model's float16 weights would never change ({prepack}): the plain step runs")
        model, optimizer = copy_with_optimizer(ctx.model, ctx.optimizer)  # IPEX trains in place: spare the user's
        model.train()
        buffers = buffer_values(model)
        ctx.model, ctx.optimizer = ipex.optimize(model, optimizer=optimizer, dtype=dtype, level=config.level,
                                                 weights_prepack=None if prepack is True else False)
        put_back_buffers(ctx.model, buffers)  # optimize reads parametrized weights: spectral_norm's iteration ran
        return {"dtype": dtype_name(dtype), "why": why, "level": config.level, "version": ipex.__version__,
                "model": "replaced by IPEX's (" + ("prepacked weights, " if prepack is True else "") + "fused ops)",
                "optimizer": f"replaced by IPEX's {type(ctx.optimizer).__name__} (fused step)",
                **({"weights_prepack": prepack} if prepack is not True else {})}


def prepacks(ipex, device: torch.device, dtype: torch.dtype) -> bool | str:
    """True where IPEX can prepack the weights in ``dtype`` here; else why not: its bf16 (fp16) prepacking needs
    instructions some CPUs lack (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; AVX512-FP16), and fails there, so the model
    trains with IPEX's fused operators and step, its weights unpacked. IPEX's own probe of the CPU decides."""
    probe = {torch.bfloat16: "onednn_has_bf16_support", torch.float16: "onednn_has_fp16_support"}.get(dtype)
    if device.type != "cpu" or probe is None or getattr(ipex._C, probe)():
        return True
    needs = "AVX-512 BW/VL/DQ or AVX-NE-CONVERT" if dtype is torch.bfloat16 else "AVX512-FP16 or AVX-NE-CONVERT"
    return f"off: IPEX prepacks {dtype_name(dtype)} weights with {needs}, which this CPU lacks"
