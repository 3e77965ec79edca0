"""The one place accel measures training: the step, the timed loop, ratios with their uncertainty, and peaks.

tune, bench, the demo and the benchmarks all use it, so "a step" means the same everywhere: the next batch,
the loss under ``run.autocast()``, ``run.backward``, ``run.step`` (the optimizer update and zero_grad), and
waiting for the device. On a busy machine a ratio of two separate measurements means little, so plans are
compared interleaved (A, B, B, A, ...) and every ratio carries an interval (``Ratio``).
"""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from accel import clock, randomness
from accel.errors import MeasureError
from accel.batches import describe_batch

# one-sided 95% quantiles of Student's t by degrees of freedom (a ratio "clearly below x" has 95% confidence)
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
       12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697}


def t95(df: int) -> float:
    if df <= 0:
        return math.inf
    if df > max(T95):
        return T95[max(T95)]  # never narrower than the table's last entry
    return T95[max(k for k in T95 if k <= df)]  # the nearest smaller df: a slightly wider, never narrower, interval


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
    """One training step on a Run: the batch's loss under run.autocast(), run.backward(loss), run.step().

    The loss is step_fn(run, batch) when given; else loss_fn(model(inputs), targets) with
    (inputs, targets) = split(batch), by default the first two items of a tuple or list batch.
    """

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
    """The one timed loop: ``count`` steps, each timed from fetching its batch to the device being done.

    Returns (seconds per step, loss per step).
    """
    times, losses = [], []
    for _ in range(count):
        start = clock.now()
        loss = step(run, next(batches))
        losses.append(float(loss.float().item()))
        synchronize(run.device)
        times.append(clock.now() - start)
    return times, losses


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
        return t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))

    @property
    def low(self) -> float:
        return self.estimate * math.exp(-self._half_width()) if self.samples else math.nan

    @property
    def high(self) -> float:
        return self.estimate * math.exp(self._half_width()) if self.samples else math.nan

    def below(self, threshold: float) -> bool:
        """Confidently below ``threshold`` (95%, one-sided)."""
        return self.high < threshold

    def above(self, threshold: float) -> bool:
        return self.low > threshold

    def noisy(self) -> bool:
        """1.0 lies inside the interval: the two cannot be told apart."""
        return not (self.below(1.0) or self.above(1.0))

    def __str__(self) -> str:
        if not self.samples:
            return "not measured"
        if self.rounds < 2:
            return f"{self.estimate:.2f} (1 round)"
        return f"{self.estimate:.2f} ({self.low:.2f}-{self.high:.2f})"

    def to_dict(self) -> dict[str, Any]:
        finite = self.rounds >= 2
        return {"estimate": round(self.estimate, 4) if self.samples else None,
                "low": round(self.low, 4) if finite else None, "high": round(self.high, 4) if finite else None,
                "rounds": self.rounds, "samples": [round(s, 4) for s in self.samples]}


def paired(times: dict[int, float], reference: dict[int, float]) -> Ratio:
    """times / reference from the rounds both ran (round -> seconds per step): the ratio every comparison uses,
    the Lab's on copies and plan="auto"'s in your loop."""
    return Ratio([times[r] / reference[r] for r in sorted(times.keys() & reference.keys()) if reference[r] > 0])


def round_order(arms: list, index: int, rotate: bool = True) -> list:
    """The order of round ``index``: reversed every other round (A B C, C B A) so a drift in the machine's load
    hits every arm alike, and with ``rotate`` shifted every two rounds, so no arm always follows the same one."""
    shift = (index // 2) % len(arms) if rotate and arms else 0
    order = arms[shift:] + arms[:shift]
    return order[::-1] if index % 2 else order


CHUNK_S = 0.5  # a chunk's timed steps take about this long
MAX_CHUNK = 20  # timed steps per chunk at most
SETTLE_BELOW_S = 2.0  # steps shorter than this are not timed right after a switch (alternating 1-step chunks read
# eager resnet18 0.4 of its real ratio to bf16 here); longer ones are: what a switch leaves cold is small beside them


def chunk_steps(step_s: float, least: int = 1, target_s: float = CHUNK_S) -> int:
    """Timed steps per chunk: about ``target_s`` of them, between ``least`` and MAX_CHUNK."""
    return max(least, min(MAX_CHUNK, math.ceil(target_s / max(step_s, 1e-6))))


def plan_label(plan: Any) -> str:
    """'eager' for the empty plan, 'auto', or the accelerator names in plan order joined by '+'."""
    if isinstance(plan, str) and plan == "auto":
        return "auto"
    if hasattr(plan, "resolve") and not hasattr(plan, "names"):
        return "auto"
    from accel.plan import Plan

    names = Plan(plan).names()
    return "+".join(names) if names else "eager"


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
    """FLOPs of one training step: the forward counted by FlopCounterMode on meta tensors (nothing computed), x3.

    Backward costs about twice the forward. It is not counted directly because torch's counter overcounts the
    backward of grouped (depthwise) convolutions: 62 GFLOP for mobilenet_v3_small at batch 16, not ~5.
    """
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    from accel.batches import map_tensors

    meta = copy.deepcopy(model).to("meta")
    meta_inputs = map_tensors(lambda t: torch.empty_like(t, device="meta"), inputs)
    with FlopCounterMode(display=False) as counter:
        call_model(meta, meta_inputs)
    return 3.0 * counter.get_total_flops()


# --- trials: candidate plans alive side by side, measured interleaved ---------------------------------------

@dataclass
class Trial:
    """One plan applied to copies of the user's model and optimizer (over the user's loader), ready to step.

    ``check_losses`` are the losses of its first steps from the common starting state, on the same batches as
    every other trial (the baseline's losses are the reference); ``first_s`` their times (compile lands there).
    """

    plan: dict[str, dict]
    run: Any = None
    error: str = ""
    status: str = "ready"  # ready, failed, refused
    check_losses: list[float] = field(default_factory=list)
    first_s: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # every timed step, seconds
    rounds: dict[int, float] = field(default_factory=dict)  # round -> median seconds per step in its chunk
    batches: Any = None

    @property
    def name(self) -> str:
        return plan_label(self.plan)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def settled_step_s(self) -> float:
        """Its quickest first step after the very first (which holds compile and warm-up): what pace() needs
        before any timed round."""
        return min(self.first_s[1:] or self.first_s)

    @property
    def warmup_s(self) -> float:
        """Time of the first steps beyond what as many steady steps take (compile and warm-up)."""
        steady = self.median_s or (min(self.first_s) if self.first_s else 0.0)
        return max(0.0, sum(self.first_s) - steady * len(self.first_s))


class Lab:
    """Measures plans on copies of the user's objects, interleaved, and puts everything back when closed.

    Each trial trains its own deep copy of the model (and an optimizer rebuilt on it, state kept), so the user's
    model and optimizer are never touched; the loader is the user's, its generator and torch's RNG are restored
    to the same starting state before every trial's first steps (the same batches for all) and at the end.
    Trials' process-wide changes (threads, affinity, environment) are switched with their journals.
    """

    round = 0  # rounds run so far, over every call of rounds(): a trial's rounds are keyed by it

    def __init__(self, model: torch.nn.Module, optimizer: Any, loader: Any, device: Any, step: TrainStep,
                 check_steps: int = 2):
        self.model, self.optimizer, self.loader, self.device, self.step = model, optimizer, loader, device, step
        self.check_steps = check_steps
        self.trials: list[Trial] = []
        self.active: Trial | None = None
        self.chunk_steps, self.settle = 1, 0
        self.start = randomness.save(loader)  # every trial's first steps start from here; close() comes back

    def restore_randomness(self) -> None:
        self.start.restore()

    def first_batch(self) -> Any:
        """The loader's first batch, taken without advancing its generators or any RNG."""
        return randomness.first_batch(self.loader)

    def copies(self) -> tuple[torch.nn.Module, Any]:
        import copy

        from accel.optim import rebuild_optimizer, same_params

        try:
            model = copy.deepcopy(self.model)
        except Exception as error:
            raise MeasureError(f"measuring copies your model so that it stays untouched, and copy.deepcopy(model) "
                               f"failed: {type(error).__name__}: {error}") from error
        if self.optimizer is None:
            return model, None
        return model, rebuild_optimizer(self.optimizer, params=same_params(self.optimizer, self.model, model))

    def trial(self, plan: Any) -> Trial:
        """Apply the plan to fresh copies and take its first steps from the common start (timed apart)."""
        from accel.core import accelerate
        from accel.errors import PlanError
        from accel.plan import Plan

        try:
            trial = Trial(Plan(plan).to_dict())
        except PlanError as error:
            return Trial({}, status="refused", error=str(error))
        self.trials.append(trial)
        self.activate(None)
        model, optimizer = self.copies()
        try:
            trial.run = accelerate(model, optimizer, self.loader, plan=trial.plan, device=self.device)
        except PlanError as error:
            trial.status, trial.error = "refused", " ".join(str(error).split("\n")[1:]).strip()
            return trial
        except Exception as error:  # AccelerateError: applying failed and was rolled back
            trial.status, trial.error = "failed", str(error)
            return trial
        self.active = trial
        self.restore_randomness()
        iterator = iter(trial.run.loader)
        try:
            trial.first_s, trial.check_losses = timed_steps(trial.run, iterator, self.check_steps, self.step)
        except Exception as error:  # a plan that cannot train here is reported, not fatal
            trial.status, trial.error = "failed", f"{type(error).__name__}: {error}"
            self.retire(trial)
            return trial
        trial.batches = itertools.chain(iterator, endless(trial.run.loader))
        return trial

    def activate(self, trial: Trial | None) -> None:
        """Make this trial's process state current (threads, affinity, environment)."""
        if self.active is trial:
            return
        if self.active is not None and self.active.run is not None:
            self.active.run.journal.suspend()
        if trial is not None:
            trial.run.journal.resume()
        self.active = trial

    def chunk(self, trial: Trial, limit_s: float = math.inf) -> float:
        """The trial's next steps, its median step in seconds. After switching trials the first ``settle`` steps
        are not counted: alternating 1-step chunks read eager resnet18 0.4 of its real ratio to bf16 here."""
        self.activate(trial)
        times: list[float] = []
        started = clock.now()
        for _ in range(self.settle + self.chunk_steps):
            seconds, _ = timed_steps(trial.run, trial.batches, 1, self.step)
            times += seconds
            if clock.now() - started > limit_s:
                break
        counted = times[self.settle:] or times[-1:]
        trial.times += counted
        return statistics.median(counted)

    def rounds(self, trials: list[Trial], reference: Trial, thresholds: tuple[float, ...], min_rounds: int = 3,
               max_rounds: int = 8, deadline: float = math.inf) -> dict[int, Ratio]:
        """Interleaved rounds over several trials (each round in a rotated order); every trial's step-time ratio
        to the reference from the same rounds. Stops once every ratio's interval clears every threshold, the
        rounds run out, or the deadline passes (after at least two rounds)."""
        arms = [reference] + [t for t in trials if t is not reference]
        ratios = {id(t): Ratio() for t in arms if t is not reference}
        limit = max(2.0, 5 * (self.settle + self.chunk_steps) * (reference.median_s or 0.1))
        first = self.round
        for index in range(max_rounds):
            self.round += 1
            for trial in round_order(arms, index):
                try:
                    trial.rounds[self.round] = self.chunk(trial, limit_s=limit)
                except Exception as error:  # a plan that breaks later (out of memory, NaN checks): it leaves
                    if trial is reference:
                        raise
                    trial.status, trial.error = "failed", f"{type(error).__name__}: {error}"
                    arms.remove(trial)
                    self.retire(trial)
            for trial in arms[1:]:
                ratios[id(trial)] = paired({r: t for r, t in trial.rounds.items() if r > first}, reference.rounds)
            if len(arms) == 1:  # every challenger failed: nothing left to compare
                break
            live = {id(t) for t in arms}
            decided = all(r.below(x) or r.above(x) for k, r in ratios.items() if k in live for x in thresholds)
            if (index + 1 >= min_rounds and decided) or (index + 1 >= 2 and clock.now() > deadline):
                break
        return ratios

    def compare(self, reference: Trial, challenger: Trial, thresholds: tuple[float, ...], min_rounds: int = 3,
                max_rounds: int = 8, deadline: float = math.inf) -> Ratio:
        """challenger/reference step-time ratio from interleaved rounds (A B, B A, B A, A B, ...)."""
        return self.rounds([challenger], reference, thresholds, min_rounds, max_rounds, deadline)[id(challenger)]

    def pace(self, step_s: float, steps: int | None = None) -> None:
        """Steps per chunk: about 0.5 s of them (at least one), plus a settling step for steps under 2 s."""
        self.chunk_steps = steps or chunk_steps(step_s)
        self.settle = 1 if step_s < SETTLE_BELOW_S else 0

    def retire(self, trial: Trial) -> None:
        """Free a trial: its process changes undone, its copies released."""
        if trial.run is not None:
            if self.active is trial:
                self.activate(None)
            trial.run.journal.rollback()
            trial.run, trial.batches = None, None

    def close(self) -> None:
        self.activate(None)
        for trial in self.trials:
            self.retire(trial)
        self.restore_randomness()
