"""tune(): choose a plan by measuring candidates on the user's own model, optimizer and loader.

Candidates come from the hardware probe (a stack the hardware cannot serve is not tried). Each is measured in
this process for a few steps from the same starting state (weights, optimizer state, RNG, threads restored in
between), and the fastest whose mean loss stays within a tolerance of the baseline's wins. A candidate that is
not faster than the baseline never wins: with nothing faster, the plan is empty.

    result = accel.tune(model, optimizer, loader)
    print(result)                 # the ablation table and why the winner won
    run = accel.accelerate(model, optimizer, loader, plan=result.plan)
"""
from __future__ import annotations

import copy
import itertools
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from accel.accelerator import REGISTRY
from accel.bench import synchronize, train_step
from accel.errors import PlanError
from accel.hardware import Hardware, probe, resolve_device
from accel.plan import Plan

MARGIN = 0.02  # a candidate must beat the baseline by more than this fraction: noise is not a speed-up
SLOW_STOP = 3.0  # stop measuring a candidate once a steady step takes this many baseline steps
SLOW_STOP_MIN_S = 0.5  # ... and over this many seconds: stopping early is about saving time, not noise
COMPILE_WARMUP_S = 45.0  # torch.compile's first step on a 2-core CPU took 24-41 s: try it only if this is left


def has_conv2d(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def generate_candidates(hardware: Hardware, model: torch.nn.Module, optimizer: Any = None, device: Any = "cpu",
               bf16: bool | None = None) -> list[dict[str, dict]]:
    """Single-accelerator plans worth measuring here, likeliest gain first (a tight budget reaches them), compile last.

    Order from the bench table in docs/measurement.md: native low precision (0.50-0.56 of eager's step time on
    resnet50/vgg16 with avx512_bf16), then channels_last (0.77-0.93), then fused_optimizer (0.75-1.17), threads.

    bf16 autocast is a candidate on a CPU only with native bf16 (avx512_bf16 or AMX), unless bf16=True;
    bf16=False never tries it. channels_last only for models with Conv2d; fused_optimizer if registered.
    """
    device = resolve_device(device)
    found: list[dict[str, dict]] = []
    if "amp" in REGISTRY and bf16 is not False:
        if device.type != "cpu":
            found.append({"amp": {}})
        elif hardware.native_bf16 or bf16:
            found.append({"amp": {"dtype": "bfloat16"}})
    if "channels_last" in REGISTRY and has_conv2d(model):
        found.append({"channels_last": {}})
    if "fused_optimizer" in REGISTRY and optimizer is not None:
        found.append({"fused_optimizer": {}})
    if "threads" in REGISTRY and device.type == "cpu":
        found.append({"threads": {}})
    if "compile" in REGISTRY:
        found.append({"compile": {}})
    return found


@dataclass
class TuneRow:
    name: str  # accelerator names joined by '+', 'eager' for the baseline
    plan: dict[str, dict]
    status: str  # "measured", "stopped early", "not measured", "refused" or "failed"
    median_ms: float | None = None
    first_step_s: float | None = None
    steps: int = 0
    loss: float | None = None
    vs_baseline: float | None = None  # time ratio: below 1 is faster
    loss_ok: bool | None = None
    reason: str = ""
    losses: list[float] = field(default_factory=list, repr=False)  # per step, compared with the baseline's
    times_ms: list[float] = field(default_factory=list, repr=False)  # steady steps, every round pooled


@dataclass
class TuneResult:
    plan: Plan
    rows: list[TuneRow]
    why: str
    baseline_ms: float | None
    elapsed_s: float
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def ablation(self) -> dict[str, float | None]:
        """Each accelerator's own effect: its time ratio against the baseline when measured alone."""
        return {r.name: r.vs_baseline for r in self.rows if len(r.plan) == 1}

    def row(self, name: str) -> TuneRow:
        return next(r for r in self.rows if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "why": self.why, "baseline_ms": self.baseline_ms,
                "elapsed_s": round(self.elapsed_s, 2), "settings": self.settings, "ablation": self.ablation,
                "rows": [asdict(r) for r in self.rows]}

    def __str__(self) -> str:
        header = ("candidate", "status", "ms/step", "vs eager", "loss", "note")
        body = [(r.name, r.status, f"{r.median_ms:.1f}" if r.median_ms is not None else "",
                 f"{r.vs_baseline:.2f}" if r.vs_baseline is not None else "",
                 f"{r.loss:.4f}" if r.loss is not None else "", r.reason) for r in self.rows]
        widths = [max(len(x[i]) for x in [header, *body]) for i in range(5)]
        lines = [f"accel tune: chose {self.plan.names() or 'the empty plan'} in {self.elapsed_s:.1f} s"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + cells[5] for cells in [header, *body]]
        lines.append("why: " + self.why)
        return "\n".join(lines)


class _State:
    """A copy of everything measuring touches, put back exactly: tensors (values and layout), grads,
    train/eval modes, optimizer state and hyper-parameters, RNGs, and threads, affinity and environment."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any):
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.tensors = [(t, t.detach().clone()) for t in itertools.chain(model.parameters(), model.buffers())]
        self.grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
        self.modes = [(m, m.training) for m in model.modules()]
        self.optimizer_state = copy.deepcopy(optimizer.state_dict())
        self.defaults = copy.deepcopy(optimizer.defaults)
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        generator = getattr(loader, "generator", None)
        self.generator = (generator, generator.get_state()) if generator is not None else None

    def restore(self) -> None:
        for tensor, saved in self.tensors:
            tensor.data = saved.clone()
        for param, grad in self.grads:
            param.grad = None if grad is None else grad.clone()
        for module, training in self.modes:
            module.training = training
        self.optimizer.load_state_dict(copy.deepcopy(self.optimizer_state))
        self.optimizer.defaults = copy.deepcopy(self.defaults)
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        if self.generator is not None:
            self.generator[0].set_state(self.generator[1])


def _name(plan: dict[str, dict]) -> str:
    return "+".join(Plan(plan).names()) or "eager"


def _measure(plan, model, optimizer, loader, device, steps, warmup, loss_fn, deadline, baseline_ms) -> TuneRow:
    """Warm-up steps, then up to `steps` timed steps; stops early when hopelessly slow or out of time."""
    from accel.core import accelerate
    from accel.testing import process_state_restored

    row = TuneRow(_name(plan), Plan(plan).to_dict(), "measured")
    times, losses = [], []
    with process_state_restored():
        try:
            run = accelerate(model, optimizer, loader, plan=plan, device=device)
        except PlanError as error:
            row.status, row.reason = "refused", str(error).replace("\n", " ")
            return row
        except Exception as error:  # an accelerator that fails while being applied (AccelerateError)
            row.status, row.reason = "failed", str(error)
            return row
        batches = itertools.chain.from_iterable(itertools.repeat(run.loader))
        try:
            for i in range(warmup + steps):
                start = time.perf_counter()
                losses.append(train_step(run, next(batches), loss_fn).float().item())
                synchronize(run.device)
                times.append(time.perf_counter() - start)
                if i < warmup:
                    continue
                if baseline_ms and times[-1] * 1000 > max(SLOW_STOP * baseline_ms, 1000 * SLOW_STOP_MIN_S):
                    row.status, row.reason = "stopped early", f"a step took over {SLOW_STOP:g}x the baseline's"
                    break
                if time.perf_counter() > deadline and i + 1 < warmup + steps:
                    row.status, row.reason = "stopped early", "time budget reached"
                    break
        except Exception as error:  # a candidate that cannot train here is reported, not fatal
            row.status, row.reason = "failed", f"{type(error).__name__}: {error}"
            return row
        finally:
            if "compile" in plan:
                torch._dynamo.reset()
    row.times_ms = [round(1000 * t, 3) for t in times[warmup:] or times[-1:]]
    row.median_ms = round(statistics.median(row.times_ms), 3)
    row.first_step_s = round(times[0], 4)
    row.steps = len(times)
    row.loss = sum(losses) / len(losses)
    row.losses = losses
    return row


def tune(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any, device: Any = "auto",
         candidates: list | None = None, steps: int = 3, warmup: int = 1, budget_s: float = 120.0,
         tolerance: float = 0.05, loss_fn: Callable = torch.nn.functional.cross_entropy,
         bf16: bool | None = None) -> TuneResult:
    """Measure candidate plans on the user's model and loader; return the fastest that keeps the loss on track.

    candidates: plans to try instead of the generated ones (the baseline is always measured first).
    tolerance: the largest relative difference between a candidate's mean loss and the baseline's over the
    same steps. budget_s bounds the search; what it leaves out is reported as "not measured". The model,
    optimizer and loader end exactly as they started. Batches are (inputs, targets); loss_fn(output, targets).
    """
    if optimizer is None or loader is None:
        raise ValueError("tune measures training steps: it needs an optimizer and a loader")
    started = time.perf_counter()
    deadline = started + budget_s
    resolved = resolve_device(device)
    hardware = probe()
    generated = candidates is None
    singles = (generate_candidates(hardware, model, optimizer, resolved, bf16) if generated
               else [Plan(c).to_dict() for c in candidates])
    singles = [c for c in singles if c]  # the baseline is measured once, first
    state = _State(model, optimizer, loader)
    kwargs = dict(model=model, optimizer=optimizer, loader=loader, device=resolved, steps=steps, warmup=warmup,
                  loss_fn=loss_fn, deadline=deadline)
    try:
        base = _measure({}, baseline_ms=None, **kwargs)
        state.restore()
        if base.median_ms is None:
            raise RuntimeError(f"the baseline (empty plan) cannot train: {base.reason}")
        base.vs_baseline, base.loss_ok = 1.0, True
        rows = [base]

        def run_candidate(plan: dict, note: str = "") -> None:
            left = deadline - time.perf_counter()
            if left <= 0 or ("compile" in plan and left < COMPILE_WARMUP_S):
                rows.append(TuneRow(_name(plan), plan, "not measured", reason="time budget" + note))
                return
            row = _measure(plan, baseline_ms=base.median_ms, **kwargs)
            state.restore()
            if row.median_ms is not None:
                row.vs_baseline = round(row.median_ms / base.median_ms, 3)
                reference = base.losses[:len(row.losses)]
                ref = sum(reference) / len(reference)
                mean = row.loss
                row.loss_ok = abs(mean - ref) <= tolerance * max(abs(ref), 1e-8)
                if not row.loss_ok:
                    row.reason = f"loss {mean:.4f} vs baseline {ref:.4f}: outside the {tolerance:.0%} tolerance"
            row.reason += note
            rows.append(row)

        later = [c for c in singles if "compile" in c] if generated else []
        for plan in singles:
            if plan not in later:
                run_candidate(plan)
        if generated:  # stack the single accelerators that helped; compile goes on top of the best so far
            helped = [r for r in rows[1:] if _wins(r, base)]
            if len(helped) > 1:
                run_candidate({k: v for r in helped for k, v in r.plan.items()})
            for plan in later:
                best = _best(rows, base)
                run_candidate({**(best.plan if best else {}), **plan},
                              f" (on top of {best.name})" if best else "")
        best = _best(rows, base)
        if best is not None:  # measure baseline and winner once more, in turn: a load spike must not choose
            for row in (base, best):
                again = _measure(row.plan, baseline_ms=None, **{**kwargs, "deadline": float("inf")})
                state.restore()
                row.times_ms += again.times_ms
                row.median_ms = round(statistics.median(row.times_ms), 3)
            for row in rows:
                if row.median_ms is not None:
                    row.vs_baseline = round(row.median_ms / base.median_ms, 3)
            confirmed = _wins(best, base)
            best.reason += "confirmed by a second round" if confirmed else (
                "faster in the search, not when measured again after the baseline")
            best = best if confirmed else None
    finally:
        state.restore()
    plan = Plan(best.plan) if best else Plan([])
    return TuneResult(plan, rows, _why(best, rows, base), base.median_ms, time.perf_counter() - started,
                      {"steps": steps, "warmup": warmup, "budget_s": budget_s, "tolerance": tolerance,
                       "margin": MARGIN, "device": str(resolved)})


def _wins(row: TuneRow, base: TuneRow) -> bool:
    return (row.status == "measured" and bool(row.loss_ok) and row.median_ms is not None
            and row.median_ms < base.median_ms * (1 - MARGIN))


def _best(rows: list[TuneRow], base: TuneRow) -> TuneRow | None:
    winners = [r for r in rows[1:] if _wins(r, base)]
    return min(winners, key=lambda r: r.median_ms) if winners else None


def _why(best: TuneRow | None, rows: list[TuneRow], base: TuneRow) -> str:
    measured = [r for r in rows[1:] if r.median_ms is not None]
    if best is None:
        return (f"no candidate beat the baseline ({base.median_ms:.1f} ms/step) by more than {MARGIN:.0%} with its "
                f"loss within tolerance ({len(measured)} measured): the empty plan is kept")
    others = sorted((r for r in measured if r is not best and _wins(r, base)), key=lambda r: r.median_ms)
    text = (f"{best.name}: {best.median_ms:.1f} ms/step vs {base.median_ms:.1f} ms eager "
            f"({best.vs_baseline:.2f}x the time), loss {best.loss:.4f} vs {base.loss:.4f}, the fastest of "
            f"{len(measured)} candidates measured")
    if others:
        text += f"; runner-up {others[0].name} ({others[0].vs_baseline:.2f}x)"
    return text
