"""amp: autocast with a dtype chosen per device, a GradScaler only for fp16, and the book's backend flags.

bf16 autocast on a CPU without native bf16 (no AVX512-BF16, no AMX) is emulated and many times slower
(13.9x on resnet18 on a Zen 3 here), so "auto" skips it there; an explicit dtype is honoured with a warning.
"""
from __future__ import annotations

import warnings

import torch

from accel.accelerator import Accelerator, Option, Stage, register
from accel.errors import Problem, Skip

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def auto_dtype(device: torch.device, hardware) -> tuple[torch.dtype | None, str]:
    """The dtype autocast should use on this device, or None with the reason."""
    if device.type == "cuda":
        return (torch.bfloat16, "cuda supports bf16") if torch.cuda.is_bf16_supported() else (
            torch.float16, "this GPU has no bf16: fp16 with a grad scaler")
    if device.type == "xpu":
        return torch.bfloat16, "Intel GPUs compute bf16 natively"
    if device.type == "mps":
        return torch.float16, "mps autocast uses fp16"
    if device.type == "cpu":
        if hardware.native_bf16:
            return torch.bfloat16, "the CPU has native bf16 (" + ", ".join(
                f for f in hardware.isa if f in ("avx512_bf16", "amx_bf16")) + ")"
        return None, ("this CPU has no native bf16 (no avx512_bf16 or amx): bf16 autocast is emulated and was "
                      "13.9x slower on resnet18 in our measurements; ask for dtype='bfloat16' to force it")
    return None, f"no autocast dtype is known for device type {device.type!r}"


@register
class Amp(Accelerator):
    """Mixed precision: autocast in run.autocast(), loss scaling in run.backward()/run.step() for fp16."""

    name = "amp"
    stage = Stage.PRECISION
    options = {
        "dtype": Option("auto", (str,), choices=("auto", *DTYPES), help="auto = what the device computes natively"),
        "grad_scaler": Option("auto", (str, bool), choices=("auto",), help="auto = only with fp16"),
        "cudnn_benchmark": Option(True, (bool,), help="cuda: let cuDNN pick the fastest convolution algorithms"),
        "allow_tf32": Option(True, (bool,), help="cuda: TF32 matmuls and convolutions for the fp32 parts"),
    }

    def check(self, ctx):
        if self.grad_scaler is True and DTYPES.get(self.dtype) is torch.bfloat16:
            return [Problem(self.name, "a grad scaler is only for fp16; bf16 has fp32's range", field="grad_scaler",
                            value=True, allowed="'auto' or False with bfloat16", kind="conflict")]
        return []

    def apply(self, ctx):
        device = ctx.device
        if not torch.amp.is_autocast_available(device.type):
            raise Skip(f"torch has no autocast for device type {device.type!r}")
        if self.dtype == "auto":
            dtype, why = auto_dtype(device, ctx.hardware)
            if dtype is None:
                raise Skip(why)
        else:
            dtype, why = DTYPES[self.dtype], "asked for"
            slow = (device.type == "cpu" and ((dtype is torch.bfloat16 and not ctx.hardware.native_bf16)
                                             or (dtype is torch.float16 and not ctx.hardware.native_fp16)))
            if slow:
                warnings.warn(f"amp: {dtype} autocast on a CPU without native {dtype} support is emulated and can be "
                              "many times slower than fp32; measure it (accel bench) before keeping it", stacklevel=2)
        changes = {"dtype": str(dtype).replace("torch.", ""), "why": why}
        ctx.autocast_dtype = dtype
        scaler = dtype is torch.float16 if self.grad_scaler == "auto" else self.grad_scaler
        if scaler:
            ctx.scaler = torch.amp.GradScaler(device.type)
        changes["grad_scaler"] = bool(scaler)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = self.cudnn_benchmark
            torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
            torch.backends.cudnn.allow_tf32 = self.allow_tf32
            changes.update(cudnn_benchmark=self.cudnn_benchmark, allow_tf32=self.allow_tf32)
        return changes
