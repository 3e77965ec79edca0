"""The one place accel measures training, so "a step" means the same to tune, bench, the demo and the benchmarks:
the step and the one timed loop, ratios with their interval (a comparison on a busy machine means little without it),
plan labels, and the roofline a step's time is held against (matmul peaks, step FLOPs). lab.py: trials side by side,
measured interleaved (A, B, B, A, ...).
"""
from __future__ import annotations

import copy
import itertools
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from accel import clock
from accel.batches import describe_batch, map_tensors
from accel.errors import MeasureError
from accel.plan import Plan

__all__ = ["Ratio", "paired", "plan_label", "round_order", "summarize", "SETTLE_BELOW_S", "TrainStep", "chunk_steps",
           "endless", "synchronize", "timed_steps", "matmul_peaks", "peak_dtype", "peak_dtypes", "training_flops"]


def synchronize(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def split_pair(batch: Any) -> tuple[Any, Any]:
    """(inputs, targets) of a tuple or list batch: its first two items."""
    if isinstance(batch, (list, tuple)) and len(batch) >= 2 and not hasattr(batch, "keys"):
        return batch[0], batch[1]
    raise MeasureError(f"accel's default training step takes (inputs, targets) batches, and this loader yields "
                       f"{describe_batch(batch)}; pass step_fn=fn(run, batch) -> loss, or split=fn(batch) -> "
                     "(inputs, targets) (and loss_fn=fn(output, targets) for another loss)")


def call_model(model: torch.nn.Module, inputs: Any) -> Any:
    """model(x) for a tensor, model(*inputs) for a tuple or list, model(**inputs) for a mapping."""
    if isinstance(inputs, dict) or hasattr(inputs, "keys"):
        return model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs)
    return model(inputs)


@dataclass
class TrainStep:
    """One training step on a Run: the loss under run.autocast() (step_fn(run, batch), else loss_fn(model(inputs),
    targets) with split(batch), by default a batch's first two items), run.backward(loss), run.step()."""

    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    split: Callable[[Any], tuple[Any, Any]] | None = None
    step_fn: Callable[[Any, Any], torch.Tensor] | None = None

    def loss(self, run, batch: Any) -> torch.Tensor:
        if self.step_fn is not None:
            return self.step_fn(run, batch)
        inputs, targets = (self.split or split_pair)(batch)
        return (self.loss_fn or torch.nn.functional.cross_entropy)(call_model(run.model, inputs), targets)

    def check(self, batch: Any) -> None:
        """Raise a ValueError naming what is needed when this step cannot use the loader's batches."""
        if self.step_fn is None:
            (self.split or split_pair)(batch)

    def __call__(self, run, batch: Any) -> torch.Tensor:
        with run.autocast():
            loss = self.loss(run, batch)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise MeasureError(f"the step's loss must be a scalar tensor, got {describe_batch(loss)}")
        run.backward(loss)
        run.step()
        return loss.detach()


def endless(loader) -> Iterator[Any]:
    """Batches of the loader, epoch after epoch."""
    return itertools.chain.from_iterable(itertools.repeat(loader))


def timed_steps(run, batches: Iterator[Any], count: int, step: TrainStep) -> tuple[list[float], list[float]]:
    """The one timed loop: (seconds, loss) of ``count`` steps, each from fetching its batch to the device done."""
    times, losses = [], []
    for _ in range(count):
        start = clock.now()
        loss = step(run, next(batches))
        losses.append(float(loss.float().item()))
        synchronize(run.device)
        times.append(clock.now() - start)
    return times, losses


CHUNK_S = 0.5  # a chunk's timed steps take about this long
MAX_CHUNK = 20  # timed steps per chunk at most
SETTLE_BELOW_S = 2.0  # steps shorter than this are not timed right after a switch (it leaves them cold)


def chunk_steps(step_s: float, least: int = 1, target_s: float = CHUNK_S, most: int = MAX_CHUNK) -> int:
    """Timed steps per chunk: about ``target_s`` of them, between ``least`` and ``most``."""
    return max(least, min(most, math.ceil(target_s / max(step_s, 1e-6))))


# one-sided 95% quantiles of Student's t by degrees of freedom (a ratio "clearly below x" has 95% confidence); a df
# between two is read as the smaller's (a slightly wider, never narrower, interval), beyond the table as its last
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
       12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697}


def summarize(times_s: list[float]) -> dict[str, float]:
    """Median, min, max, standard deviation (ms) and spread (max-min as % of the median) of step times."""
    ms = [t * 1000 for t in times_s]
    median = statistics.median(ms)
    return {"median_ms": round(median, 3), "min_ms": round(min(ms), 3), "max_ms": round(max(ms), 3),
            "stdev_ms": round(statistics.stdev(ms), 3) if len(ms) > 1 else 0.0,
            "spread_pct": round(100 * (max(ms) - min(ms)) / median, 2) if median else 0.0}


@dataclass
class Ratio:
    """A time ratio (candidate / baseline) from interleaved rounds, with its 90% interval.

    Each sample is one round's ratio of the candidate's median step to the baseline's median step measured
    next to it, so a change in the machine's load hits both sides of a sample alike.
    """

    samples: list[float] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return len(self.samples)

    @property
    def estimate(self) -> float:
        return math.exp(statistics.fmean(math.log(s) for s in self.samples)) if self.samples else math.nan

    def _half_width(self) -> float:
        if len(self.samples) < 2:
            return math.inf
        logs = [math.log(s) for s in self.samples]
        return T95[max(k for k in T95 if k < len(logs))] * statistics.stdev(logs) / math.sqrt(len(logs))

    @property
    def low(self) -> float:
        return self.estimate * math.exp(-self._half_width())  # nan without samples, as the estimate

    @property
    def high(self) -> float:
        return self.estimate * math.exp(self._half_width())

    @property
    def median(self) -> float:
        """The middle round's ratio: what most rounds say, whatever a few heavy-tailed ones do to the mean."""
        return statistics.median(self.samples) if self.samples else math.nan

    def below(self, threshold: float) -> bool:
        """Confidently below ``threshold`` (95%, one-sided), and so in most rounds: a few rounds a load spike hit can
        carry the t-interval alone, never the median (docs/measurement.md)."""
        return self.high < threshold and self.median < threshold

    def above(self, threshold: float) -> bool:
        """Confidently above ``threshold``, and so in most rounds (as ``below``)."""
        return self.low > threshold and self.median > threshold

    def noisy(self) -> bool:
        """1.0 lies inside the interval, or the median round says otherwise than it: the two cannot be told apart."""
        return not (self.below(1.0) or self.above(1.0))

    def __str__(self) -> str:
        if not self.samples:
            return "not measured"
        if self.rounds < 2:
            return f"{self.estimate:.2f} (1 round)"
        # an interval clear of 1.0 that the median round does not follow is why no verdict was reached: say so
        split = (self.high < 1.0 <= self.median) or (self.low > 1.0 >= self.median)
        return f"{self.estimate:.2f} ({self.low:.2f}-{self.high:.2f}" + (
            f"; median round {self.median:.2f})" if split else ")")

    def to_dict(self) -> dict[str, Any]:
        finite = self.rounds >= 2
        return {"estimate": round(self.estimate, 4) if self.samples else None,
                "low": round(self.low, 4) if finite else None, "high": round(self.high, 4) if finite else None,
                "rounds": self.rounds, "samples": [round(s, 4) for s in self.samples]}


def paired(times: dict[int, float], reference: dict[int, float]) -> Ratio:
    """times / reference from the rounds both ran (round -> seconds per step): the ratio every comparison uses."""
    return Ratio([times[r] / reference[r] for r in sorted(times.keys() & reference.keys()) if reference[r] > 0])


def round_order(arms: list, index: int, rotate: bool = True) -> list:
    """The order of round ``index``: reversed every other round (A B C, C B A) so a drift in the machine's load
    hits every arm alike, and with ``rotate`` shifted every two rounds, so no arm always follows the same one."""
    shift = (index // 2) % len(arms) if rotate and arms else 0
    order = arms[shift:] + arms[:shift]
    return order[::-1] if index % 2 else order


def plan_label(plan: Any) -> str:
    """One name for a plan in every report and table: 'eager', 'auto', or the names in plan order joined by '+'."""
    if (isinstance(plan, str) and plan == "auto") or (hasattr(plan, "resolve") and not hasattr(plan, "names")):
        return "auto"
    return "+".join(Plan(plan).names()) or "eager"


PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def matmul_peaks(device: str | torch.device, hardware, size: int = 2048, repeats: int = 5) -> dict[str, float]:
    """This machine's measured matmul rate in FLOP/s (best of ``repeats``) for each dtype a training step can compute
    in here (peak_dtypes): the roofline of a step."""
    device, peaks = torch.device(device), {}
    for name in peak_dtypes(device, hardware):
        a, b = (torch.randn(size, size, device=device).to(PEAK_DTYPES[name]) for _ in range(2))
        torch.mm(a, b)  # warm-up
        best = math.inf
        for _ in range(repeats):
            synchronize(device)
            start = clock.now()
            torch.mm(a, b)
            synchronize(device)
            best = min(best, clock.now() - start)
        peaks[name] = 2.0 * size ** 3 / best
    return peaks


def peak_dtypes(device: torch.device, hardware) -> list[str]:
    """fp32 always; bf16 and fp16 where the device computes them natively (on a CPU, avx512_bf16 / AMX, avx512_fp16 /
    AMX-FP16): a CPU's emulated dtypes have no peak to reach."""
    if device.type != "cpu":
        return list(PEAK_DTYPES)
    return ["fp32"] + ["bf16"] * hardware.native_bf16 + ["fp16"] * hardware.native_fp16


def peak_dtype(compute_dtype: torch.dtype | None) -> str:
    """Which peak a step computing in this dtype is held against."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(compute_dtype, "fp32")


def training_flops(model: torch.nn.Module, inputs: Any) -> float:
    """FLOPs of one training step: the forward counted on meta tensors, x3 (torch's counter overcounts the backward
    of grouped convolutions, so the backward is not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    meta = copy.deepcopy(model).to("meta")
    meta_inputs = map_tensors(lambda t: torch.empty_like(t, device="meta"), inputs)
    with FlopCounterMode(display=False) as counter:
        call_model(meta, meta_inputs)
    return 3.0 * counter.get_total_flops()
