"""Matmul peaks and step FLOPs: the roofline a step's time is held against."""
from __future__ import annotations

import math
from typing import Any

import torch

from accel import clock
from accel.batches import map_tensors
from accel.measure.steps import call_model, synchronize

PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def matmul_peak(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, size: int = 2048,
                repeats: int = 5) -> float:
    """This machine's measured matmul rate in FLOP/s for a dtype (best of `repeats`): the roofline of a step."""
    device = torch.device(device)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.mm(a, b)  # warm-up
    best = math.inf
    for _ in range(repeats):
        synchronize(device)
        start = clock.now()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, clock.now() - start)
    return 2.0 * size ** 3 / best


def matmul_peaks(device: str | torch.device = "cpu", hardware=None, size: int = 2048) -> dict[str, float]:
    """FLOP/s peaks of the dtypes a training step can compute in here: fp32 always; bf16 and fp16 where the
    device computes them natively (on a CPU, avx512_bf16 / AMX, avx512_fp16 / AMX-FP16)."""
    device = torch.device(device)
    return {name: matmul_peak(device, PEAK_DTYPES[name], size) for name in peak_dtypes(device, hardware)}


def peak_dtypes(device: torch.device, hardware=None) -> list[str]:
    """The dtypes whose peak is worth measuring on this device (a CPU's emulated dtypes have no peak to reach)."""
    if device.type != "cpu":
        return ["fp32", "bf16", "fp16"]
    if hardware is None:
        return ["fp32"]
    return ["fp32"] + ["bf16"] * hardware.native_bf16 + ["fp16"] * hardware.native_fp16


def peak_dtype(compute_dtype: torch.dtype | None) -> str:
    """Which peak a step computing in this dtype is held against."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(compute_dtype, "fp32")


def training_flops(model: torch.nn.Module, inputs: Any) -> float:
    """FLOPs of one training step: the forward counted on meta tensors, x3 (torch's counter overcounts the backward
    of grouped convolutions, so the backward is not counted)."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    meta = copy.deepcopy(model).to("meta")
    meta_inputs = map_tensors(lambda t: torch.empty_like(t, device="meta"), inputs)
    with FlopCounterMode(display=False) as counter:
        call_model(meta, meta_inputs)
    return 3.0 * counter.get_total_flops()
