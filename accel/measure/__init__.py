"""The one place accel measures training, so "a step" means the same to tune, bench, the demo and the benchmarks:
stats (ratios with their interval, plan labels), steps (the step and the timed loop), roofline (peaks and FLOPs),
lab (trials side by side, measured interleaved: A, B, B, A, ...).
"""
from __future__ import annotations

from accel.measure.lab import Lab, Trial
from accel.measure.roofline import matmul_peaks, peak_dtype, peak_dtypes, training_flops
from accel.measure.stats import Ratio, paired, plan_label, round_order, summarize
from accel.measure.steps import SETTLE_BELOW_S, TrainStep, chunk_steps, endless, synchronize, timed_steps

__all__ = ["Ratio", "paired", "plan_label", "round_order", "summarize", "SETTLE_BELOW_S", "TrainStep", "chunk_steps",
           "endless", "synchronize", "timed_steps", "matmul_peaks", "peak_dtype", "peak_dtypes", "training_flops",
           "Lab", "Trial"]
