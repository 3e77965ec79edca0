"""The one place accel measures training: the step, the timed loop, ratios with their uncertainty, and peaks.

tune, bench, the demo and the benchmarks all use it, so "a step" means the same everywhere: the next batch,
the loss under ``run.autocast()``, ``run.backward``, ``run.step`` (the optimizer update and zero_grad), and
waiting for the device. On a busy machine a ratio of two separate measurements means little, so plans are
compared interleaved (A, B, B, A, ...) and every ratio carries an interval (``Ratio``).

Its parts, each importing only those above it: stats (ratios and intervals), steps (the step and the timed
loop), labels (plan names), roofline (peaks and FLOPs), lab (trials side by side).
"""
from __future__ import annotations

from accel.measure.lab import Lab, Trial
from accel.measure.labels import plan_label
from accel.measure.roofline import PEAK_DTYPES, matmul_peak, matmul_peaks, peak_dtype, peak_dtypes, training_flops
from accel.measure.stats import T95, Ratio, paired, round_order, summarize, t95
from accel.measure.steps import (
                                 CHUNK_S,
                                 MAX_CHUNK,
                                 SETTLE_BELOW_S,
                                 TrainStep,
                                 call_model,
                                 chunk_steps,
                                 endless,
                                 split_pair,
                                 synchronize,
                                 timed_steps,
)

__all__ = [
    "T95", "t95", "Ratio", "paired", "round_order", "summarize",
    "CHUNK_S", "MAX_CHUNK", "SETTLE_BELOW_S", "TrainStep", "call_model", "chunk_steps", "endless", "split_pair",
    "synchronize", "timed_steps",
    "plan_label",
    "PEAK_DTYPES", "matmul_peak", "matmul_peaks", "peak_dtype", "peak_dtypes", "training_flops",
    "Lab", "Trial",
]
