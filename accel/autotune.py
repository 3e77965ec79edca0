"""tune() and plan="auto": choose the plan by measuring stacks on the user's own model, optimizer and loader.

    result = accel.tune(model, optimizer, loader)            # or accelerate(..., plan=accel.Auto(...))
    print(result)                                             # every comparison, its interval, and why

The search (docs/measurement.md):

1. Candidates come from the registered accelerators (``Accelerator.candidates``): what this hardware and
   model can use. The baseline is the empty plan.
2. Gains do not add up, so it starts from the stack of everything (one configuration per accelerator, costly
   ones aside) and drops, one by one, each accelerator whose removal does not make the stack slower by more
   than the margin. Accelerators with a costly first step (compile) are tried last, on top of the best stack;
   with ``expected_steps`` they are kept only if their warm-up pays back within the run.
3. Every comparison is interleaved (A B, B A, ...) on copies of the user's objects, alive side by side, and
   adds rounds until the ratio's interval clears the margin or the budget is spent; a plan wins only when it is
   faster than the baseline with 95% confidence (and by the margin), and its losses over its first steps stay
   within the tolerance of the baseline's on the same batches. When the machine is too noisy to establish any
   plan, the result says so and keeps the empty plan.
4. The choice is remembered (``accel.plancache``) under a key of everything that decides it; the same setup
   asks again and gets the answer at once.

The user's model, optimizer, loader (its generator), torch's RNG and the process end as they started.
"""
from __future__ import annotations

import datetime as _dt
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from accel.accelerator import REGISTRY
from accel.context import placement
from accel.errors import MeasureError, PlanError, Problem
from accel.hardware import Hardware, probe
from accel.measure import Lab, Ratio, TrainStep, Trial, plan_label
from accel.plan import RESOLVERS, Plan
from accel.report import render_table

MARGIN = 0.02  # a plan must be faster than the one it replaces by more than this fraction
MIN_BUDGET_S = 90.0  # default budget: at least this, or BUDGET_STEPS baseline steps for slow models
BUDGET_STEPS = 100
SLOW_STOP = 3.0  # a candidate whose first steps take this many baseline steps (and over 0.5 s) is not timed


def for_device(hardware: Hardware, device: torch.device) -> Hardware:
    """The hardware as a run on this device sees it: a CPU run is offered no GPU's candidates."""
    import dataclasses

    devices = {"cpu": 1, **({device.type: hardware.devices.get(device.type, 1)} if device.type != "cpu" else {})}
    return dataclasses.replace(hardware, devices=devices)


def generate_candidates(hardware, model, optimizer=None, loader=None,
                        accelerators: list[str] | None = None) -> list[dict[str, dict]]:
    """Every registered accelerator's configurations worth measuring here (only those named in ``accelerators``
    when given), in plan (stage) order."""
    found = []
    for cls in sorted(REGISTRY.values(), key=lambda c: (int(c.stage), c.name)):
        if accelerators is not None and cls.name not in accelerators:
            continue
        for options in cls.candidates(hardware, model, optimizer, loader):
            found.append({cls.name: dict(options)})
    return found


@dataclass
class TuneRow:
    name: str  # accelerator names joined by '+', 'eager' for the baseline
    plan: dict[str, dict]
    status: str  # measured, stopped early, not measured, refused, failed, loss off
    against: str = ""  # what it was compared with
    ratio: dict[str, Any] | None = None  # its step time / the other's, with the interval (Ratio.to_dict)
    vs_baseline: float | None = None  # its median step / the baseline's median step
    median_ms: float | None = None
    first_step_s: float | None = None
    warmup_s: float | None = None
    loss: float | None = None
    loss_ok: bool | None = None
    decision: str = ""
    reason: str = ""
    tests: str = ""  # the accelerator this row measures the effect of (dropped, kept, or added on top)
    losses: list[float] = field(default_factory=list, repr=False)


@dataclass
class TuneResult:
    plan: Plan
    rows: list[TuneRow]
    why: str
    baseline_ms: float | None
    elapsed_s: float
    settings: dict[str, Any] = field(default_factory=dict)
    from_cache: bool = False
    measured_at: str = ""
    key: str = ""
    established: bool = True  # False: the machine was too noisy to establish a faster plan

    @property
    def ablation(self) -> dict[str, float | None]:
        """Each accelerator's effect where it was measured: the time with it over the time without it."""
        effects: dict[str, float | None] = {}
        for row in self.rows:
            ratio = (row.ratio or {}).get("estimate")
            if row.against == "eager" and len(row.plan) == 1:
                effects[row.name] = ratio
            elif row.tests and ratio:  # a stack without it (1 / ratio) or with it on top (ratio)
                effects[row.tests] = round(ratio if row.tests in row.plan else 1 / ratio, 4)
        return effects

    def row(self, name: str) -> TuneRow:
        return next(r for r in self.rows if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "why": self.why, "baseline_ms": self.baseline_ms,
                "elapsed_s": round(self.elapsed_s, 2), "settings": self.settings, "ablation": self.ablation,
                "from_cache": self.from_cache, "measured_at": self.measured_at, "key": self.key,
                "established": self.established, "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneResult:
        rows = [TuneRow(**r) for r in data["rows"]]
        return cls(Plan(data["plan"]), rows, data["why"], data["baseline_ms"], data["elapsed_s"], data["settings"],
                   data.get("from_cache", False), data.get("measured_at", ""), data.get("key", ""),
                   data.get("established", True))

    def __str__(self) -> str:
        source = (f"from the cache (measured {self.measured_at}, key {self.key[:12]})" if self.from_cache
                  else f"in {self.elapsed_s:.1f} s")
        lines = [f"accel tune: chose {self.plan.names() or 'the empty plan'} {source}"]
        body = []
        for r in self.rows:
            ratio = Ratio(r.ratio["samples"]) if r.ratio and r.ratio.get("samples") else None
            body.append((r.name, r.status, r.against, str(ratio) if ratio else "",
                         f"{r.median_ms:.1f}" if r.median_ms is not None else "",
                         f"{r.first_step_s:.2f}" if r.first_step_s is not None else "",
                         f"{r.loss:.4f}" if r.loss is not None else "", r.decision or r.reason))
        lines += render_table(("candidate", "status", "vs", "time ratio (90%)", "ms/step", "first s", "loss", "note"),
                              body, right=(4, 5, 6))
        lines.append("why: " + self.why)
        return "\n".join(lines)


@dataclass
class Auto:
    """plan=accel.Auto(...) chooses the plan by measuring (accel.tune) with these settings; "auto" is Auto().

    expected_steps: how many steps the run will take; the choice then minimises the whole run's time, warm-up
    included (compile is kept only if it pays back). budget_s: the search's time (None: the larger of 90 s and
    100 baseline steps). step_fn / loss_fn / split: how a batch becomes a loss (accel.measure.TrainStep).
    cache: remember the choice (True: accel's cache folder; a path; False: always measure).
    """

    budget_s: float | None = None
    expected_steps: int | None = None
    step_fn: Callable | None = None
    loss_fn: Callable | None = None
    split: Callable | None = None
    tolerance: float = 0.05
    margin: float = MARGIN
    candidates: list | None = None
    accelerators: list[str] | None = None
    cache: Any = True
    check_steps: int = 2

    def resolve(self, model, optimizer, loader, device="auto") -> TuneResult:
        return tune(model, optimizer, loader, device=device, budget_s=self.budget_s,
                    expected_steps=self.expected_steps, step_fn=self.step_fn, loss_fn=self.loss_fn, split=self.split,
                    tolerance=self.tolerance, margin=self.margin, candidates=self.candidates,
                    accelerators=self.accelerators, cache=self.cache, warmup=self.check_steps)


RESOLVERS["auto"] = Auto


class _Search:
    """One tune() call: the lab, the rows, and the decisions."""

    def __init__(self, lab: Lab, tolerance: float, margin: float, deadline: float, expected_steps: int | None):
        self.lab, self.tolerance, self.margin = lab, tolerance, margin
        self.deadline, self.expected_steps = deadline, expected_steps
        self.rows: list[TuneRow] = []
        self.base: Trial | None = None
        self.notes: list[str] = []
        self.cut_short = False  # a step of the search skipped for the budget: the answer is not one to remember

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def time_left(self) -> bool:
        """Budget left for the next step of the search (when not, the search is marked cut short)."""
        if self.left() > 0:
            return True
        self.cut_short = True
        return False

    def row_of(self, trial: Trial, **fields: Any) -> TuneRow:
        row = TuneRow(trial.name, trial.plan, "measured", **fields)
        if trial.status in ("refused", "failed"):
            row.status, row.reason = trial.status, trial.error
        else:
            row.first_step_s = round(trial.first_s[0], 4) if trial.first_s else None
            row.losses = list(trial.check_losses)
            row.loss = sum(trial.check_losses) / len(trial.check_losses) if trial.check_losses else None
            if self.base is not None and self.base is not trial and row.loss is not None:
                reference = sum(self.base.check_losses) / len(self.base.check_losses)
                row.loss_ok = abs(row.loss - reference) <= self.tolerance * max(abs(reference), 1e-8)
                if not row.loss_ok:
                    row.status = "loss off"
                    row.reason = (f"loss {row.loss:.4f} vs baseline {reference:.4f} over the same first steps: "
                                  f"outside the {self.tolerance:.0%} tolerance")
        self.rows.append(row)
        return row

    def finish_row(self, row: TuneRow, trial: Trial, ratio: Ratio | None = None) -> None:
        if trial.status == "failed" and row.status == "measured":  # broke in a later round
            row.status, row.reason = "failed", trial.error
        if ratio is not None and ratio.samples:
            row.ratio = ratio.to_dict()
        if trial.median_s is not None:
            row.median_ms = round(trial.median_s * 1000, 3)
        row.warmup_s = round(trial.warmup_s, 4) if trial.first_s else None

    def usable(self, trial: Trial, row: TuneRow) -> bool:
        """Applied, trained, kept the loss, and not hopelessly slow: when every one of its first steps took over
        SLOW_STOP baseline steps and over 0.5 s (a single spike of load is not enough), timing rounds would only
        spend the budget (bf16 emulated on a Zen 3 is 14x slower)."""
        if row.status != "measured":
            return False
        base_step = self.base.settled_step_s
        fastest = min(trial.first_s)
        if len(trial.first_s) > 1 and fastest > max(SLOW_STOP * base_step, 0.5):
            row.status = "stopped early"
            row.reason = f"each first step took over {fastest:.2f} s, over {SLOW_STOP:g}x the baseline's {base_step:.3f} s"
            return False
        return True

    def compare(self, reference: Trial, challenger: Trial, thresholds: tuple[float, ...]) -> Ratio:
        return self.lab.compare(reference, challenger, thresholds, deadline=self.deadline)

    def measure_vs_base(self, plan: dict[str, dict]) -> tuple[Trial, TuneRow, Ratio | None]:
        trial = self.lab.trial(plan)
        row = self.row_of(trial, against="eager")
        ratio = None
        if self.usable(trial, row):
            ratio = self.compare(self.base, trial, (1.0, 1 - self.margin))
            if trial.status == "ready":
                row.vs_baseline = round(ratio.estimate, 4)
            else:
                ratio = None
        self.finish_row(row, trial, ratio)
        return trial, row, ratio

    def established(self, ratio: Ratio | None) -> bool:
        return ratio is not None and ratio.below(1.0) and ratio.estimate <= 1 - self.margin

    def verdict(self, ratio: Ratio) -> str:
        """'faster' (established), 'not faster' (clearly not by the margin), or 'noisy' (cannot tell)."""
        if self.established(ratio):
            return "faster"
        return "not faster" if ratio.above(1 - self.margin) or ratio.estimate > 1 else "noisy"


def _stack(candidates: list[dict[str, dict]]) -> tuple[dict[str, dict], list[str]]:
    """One configuration per accelerator, in order, leaving out any that conflicts with those before it."""
    stack: dict[str, dict] = {}
    left_out = []
    for candidate in candidates:
        merged = {**stack, **{k: v for k, v in candidate.items() if k not in stack}}
        if merged == stack:
            continue
        _, problems = Plan.parse(merged)
        if problems:
            left_out.append(f"{plan_label(candidate)} ({problems[0].message})")
        else:
            stack = merged
    return stack, left_out


def tune(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any, device: Any = "auto",
         candidates: list | None = None, steps: int | None = None, warmup: int = 2, budget_s: float | None = None,
         tolerance: float = 0.05, loss_fn: Callable | None = None, step_fn: Callable | None = None,
         split: Callable | None = None, expected_steps: int | None = None, margin: float = MARGIN,
         accelerators: list[str] | None = None, cache: Any = False) -> TuneResult:
    """Measure plans on the user's model and loader; return the fastest established plan that keeps the loss.

    candidates: plans to compare with the baseline instead of the search over generated stacks.
    steps: timed steps per plan and round (default: as many as take about 0.5 s). warmup: first steps of every
    plan from the common start, timed apart and compared for the loss. budget_s: the search's time (default:
    the larger of 90 s and 100 baseline steps); what it leaves out is reported. step_fn(run, batch) -> loss,
    or loss_fn(output, targets) with split(batch) -> (inputs, targets): how a batch becomes a loss (default:
    (inputs, targets) batches and cross-entropy). accelerators: names the generated candidates may come from
    (default: every registered accelerator). cache: a path or True to remember the choice.
    """
    if optimizer is None or loader is None:
        raise MeasureError("tune measures training steps: it needs an optimizer and a loader")
    started = time.perf_counter()
    hardware, problems = probe(), []
    decided = placement(device, hardware, problems)  # the same launch and device accelerate() decides
    if decided is None:
        raise PlanError(problems)
    launch, resolved = decided.launch, decided.device
    hardware = for_device(hardware, resolved)
    step = TrainStep(loss_fn=loss_fn, split=split, step_fn=step_fn)
    lab = Lab(model, optimizer, loader, resolved, step, check_steps=max(1, warmup))
    settings = {"budget_s": budget_s, "steps": steps, "warmup": warmup, "tolerance": tolerance, "margin": margin,
                "expected_steps": expected_steps, "device": str(resolved), "accelerators": accelerators,
                "candidates": [Plan(c).to_dict() for c in candidates] if candidates is not None else "generated"}
    batch = lab.first_batch()
    if batch is None:
        raise MeasureError("tune needs batches, and the loader yields none")
    step.check(batch)
    key_parts = None
    if cache:
        from accel import plancache

        key_parts = plancache.key_parts(model, optimizer, loader, batch, resolved, hardware, settings, step)
        hit = plancache.lookup(key_parts, cache)
        if hit is not None:
            lab.close()
            result = TuneResult.from_dict(hit)
            result.from_cache, result.elapsed_s = True, time.perf_counter() - started
            return result
    if launch is not None and launch.world_size > 1:
        raise MeasureError(f"plan='auto' in a launched job ({launch.world_size} ranks) would let every rank choose "
                           "on its own: run it once in a single process (the cache remembers the answer for the "
                           "ranks), or pass the plan it chose")
    generated = candidates is None
    plans = (generate_candidates(hardware, model, optimizer, loader, accelerators) if generated
             else [Plan(c).to_dict() for c in candidates])
    plans = [p for p in plans if p]
    search = _Search(lab, tolerance, margin, math.inf, expected_steps)
    try:
        base = lab.trial({})
        search.base = base
        base_row = search.row_of(base, against="")
        if base.status == "refused":
            raise PlanError([Problem("tune", f"the baseline (empty plan) is refused: {base.error}")])
        if base.status != "ready":
            raise MeasureError(f"the baseline (empty plan) cannot train: {base.error}")
        step_s = base.settled_step_s
        lab.pace(step_s, steps)
        budget = budget_s if budget_s is not None else max(MIN_BUDGET_S, BUDGET_STEPS * step_s)
        search.deadline = started + budget
        settings["budget_s"] = round(budget, 1)
        base_row.vs_baseline, base_row.loss_ok, base_row.decision = 1.0, True, "baseline"
        chosen = _given(search, plans) if not generated else _search_stacks(search, plans)
        search.finish_row(base_row, base)
    finally:
        lab.close()
    plan = Plan(chosen.plan) if chosen is not None else Plan([])
    result = TuneResult(plan, search.rows, _why(search, chosen), round(base.median_s * 1000, 3) if base.median_s else
                        None, time.perf_counter() - started, settings,
                        measured_at=_dt.datetime.now().isoformat(timespec="seconds"),
                        established=chosen is not None or not any("noisy" in n for n in search.notes))
    complete = result.established and not search.cut_short and not any(r.status == "not measured"
                                                                        for r in result.rows)
    if key_parts is not None and complete:  # a noisy or cut-short answer is not one to remember
        from accel import plancache

        result.key = plancache.store(key_parts, result.to_dict(), cache)
    return result


def _given(search: _Search, plans: list[dict[str, dict]]) -> Trial | None:
    """User-given candidates: each compared with the baseline; the fastest established one wins."""
    winners = []
    for plan in plans:
        if search.left() <= 0:
            search.rows.append(TuneRow(plan_label(plan), plan, "not measured", against="eager", reason="time budget"))
            continue
        trial, row, ratio = search.measure_vs_base(plan)
        if search.established(ratio):
            winners.append((ratio.estimate, trial, row))
        elif ratio is not None:
            verdict = search.verdict(ratio)
            search.notes.append(verdict)
            row.decision = "not faster by the margin" if verdict == "not faster" else "not established (noisy)"
        search.lab.retire(trial)
    if not winners:
        return None
    winners.sort(key=lambda w: w[0])
    winners[0][2].decision = "chosen"
    return winners[0][1]


def _search_stacks(search: _Search, candidates: list[dict[str, dict]]) -> Trial | None:
    """Everything the hardware serves, minus what does not pay; then the costly ones on top of the best."""
    costly = [c for c in candidates if any(REGISTRY[n].costly_setup for n in c)]
    cheap = [c for c in candidates if c not in costly]
    stack, left_out = _stack(cheap)
    if left_out:
        search.notes.append("left out of the stack: " + "; ".join(left_out))
    best: Trial | None = None
    best_ratio: Ratio | None = None
    if stack:
        trial, row, ratio = search.measure_vs_base(stack)
        row.decision = "the full stack"
        if trial.status == "ready" and row.status == "measured":
            best, best_ratio = trial, ratio
        else:
            search.lab.retire(trial)
            if len(stack) > 1:  # one member spoils it (fails, too slow, off in loss): measure each alone
                row.decision = "the full stack: cannot be timed; each alone instead"
                best, best_ratio = _singles_then_stack(search, [{k: v} for k, v in stack.items()])
    incumbent, incumbent_ratio = best, best_ratio
    if best is not None and len(best.plan) > 1 and search.time_left():
        smaller = _drop_what_does_not_pay(search, best)
        if smaller is not best:  # confirm the smaller stack against the baseline before giving up the full one
            ratio = search.compare(search.base, smaller, (1.0, 1 - search.margin))
            row = next(r for r in reversed(search.rows) if r.plan == smaller.plan)
            row.vs_baseline = round(ratio.estimate, 4)
            if search.established(ratio) or not search.established(best_ratio):
                row.decision += f"; vs eager {ratio}"
                search.lab.retire(best)
                incumbent, incumbent_ratio = smaller, ratio
            else:
                row.decision += f"; vs eager {ratio}, not established: the full stack stays"
                search.lab.retire(smaller)
    if not search.established(incumbent_ratio):
        if incumbent_ratio is not None:
            search.notes.append(search.verdict(incumbent_ratio))
        if incumbent is not None:
            search.lab.retire(incumbent)
        incumbent = None
    for candidate in costly:
        incumbent = _try_costly(search, incumbent, candidate)
    return incumbent


def _drop_what_does_not_pay(search: _Search, full: Trial) -> Trial:
    """The stack without each member, all measured in the same interleaved rounds as the stack itself; every
    member whose removal does not slow the stack by more than the margin is dropped (their removal together is
    checked against the stack when it is more than one)."""
    arms: list[tuple[str, Trial, TuneRow]] = []
    for name in list(full.plan):
        if not search.time_left():
            break
        smaller = {k: v for k, v in full.plan.items() if k != name}
        trial = search.lab.trial(smaller)
        row = search.row_of(trial, against=full.name, tests=name)
        if search.usable(trial, row):
            arms.append((name, trial, row))
        else:
            row.decision = f"kept {name}: the stack without it cannot be timed"
            search.finish_row(row, trial)
            search.lab.retire(trial)
    if not arms:
        return full
    ratios = search.lab.rounds([t for _, t, _ in arms], full, (1 + search.margin,), deadline=search.deadline)
    dropped: list[tuple[float, str, Trial]] = []
    for name, trial, row in arms:
        ratio = ratios[id(trial)]
        search.finish_row(row, trial, ratio)
        if trial.status != "ready":
            row.decision = f"kept {name}: the stack without it broke"
        elif ratio.estimate <= 1 + search.margin:
            row.decision = f"dropped {name}: it does not pay ({1 / ratio.estimate:.2f} of the time with it)"
            dropped.append((ratio.estimate, name, trial))
        else:
            row.decision = f"kept {name}: {1 / ratio.estimate:.2f} of the time with it"
    dropped.sort(key=lambda d: d[0])
    chosen = dropped[0][2] if dropped else full
    together = None
    if len(dropped) > 1 and search.time_left():  # dropping them together may cost what each alone did not
        together = search.lab.trial({k: v for k, v in full.plan.items() if k not in {n for _, n, _ in dropped}})
        row = search.row_of(together, against=full.name)
        if together.plan and search.usable(together, row):
            ratio = search.compare(full, together, (1 + search.margin,))
            search.finish_row(row, together, ratio)
            names = ", ".join(n for _, n, _ in dropped)
            if together.status == "ready" and ratio.estimate <= 1 + search.margin:
                row.decision, chosen = f"dropped {names} together: not slower", together
            else:
                row.decision = f"without {names} together: slower; dropped only {dropped[0][1]}"
    for trial in [*(t for _, t, _ in arms), *([together] if together is not None else [])]:
        if trial is not chosen:
            search.lab.retire(trial)
    return chosen  # the full stack itself is the caller's to keep or retire


def _singles_then_stack(search: _Search, singles: list[dict[str, dict]]) -> tuple[Trial | None, Ratio | None]:
    """Each candidate against the baseline; the stack of those that helped, measured against it too."""
    helped: dict[str, dict] = {}
    for plan in singles:
        if search.left() <= 0:
            search.rows.append(TuneRow(plan_label(plan), plan, "not measured", against="eager", reason="time budget"))
            continue
        trial, row, ratio = search.measure_vs_base(plan)
        if ratio is not None and ratio.estimate < 1.0:
            helped.update(plan)
            row.decision = "helps alone"
        search.lab.retire(trial)
    if not helped or search.left() <= 0:
        return None, None
    trial, row, ratio = search.measure_vs_base(helped)
    row.decision = "the stack of what helped alone"
    if row.status == "measured":
        return trial, ratio
    search.lab.retire(trial)
    return None, None


def _try_costly(search: _Search, incumbent: Trial | None, candidate: dict[str, dict]) -> Trial | None:
    """A costly accelerator (compile) on top of the best plan so far, kept when it pays back within the run."""
    reference = incumbent or search.base
    plan = {**reference.plan, **candidate}
    if search.left() <= 0:
        search.rows.append(TuneRow(plan_label(plan), plan, "not measured", against=reference.name,
                                   reason="time budget"))
        return incumbent
    trial = search.lab.trial(plan)
    row = search.row_of(trial, against=reference.name, tests=next(iter(candidate)))
    if row.status != "measured":
        search.finish_row(row, trial)
        search.lab.retire(trial)
        return incumbent
    ratio = search.compare(reference, trial, (1 - search.margin,))
    search.finish_row(row, trial, ratio)
    if trial.status != "ready":
        return incumbent
    step_ref = reference.median_s or 0.0
    gain_s = step_ref * (1 - ratio.estimate)
    extra_warmup = trial.warmup_s - reference.warmup_s
    break_even = math.ceil(extra_warmup / gain_s) if gain_s > 0 else None
    faster = ratio.below(1 - search.margin / 2) and ratio.estimate <= 1 - search.margin
    pays = faster and (search.expected_steps is None or (break_even is not None and
                                                         break_even < search.expected_steps))
    name = "+".join(candidate)
    if not faster:
        row.decision = f"{name}: not faster on top of {reference.name} ({ratio})"
    elif break_even is None or not pays:
        row.decision = (f"{name}: {ratio.estimate:.2f} of the step, but its {extra_warmup:.1f} s warm-up pays back "
                        f"after {break_even} steps, beyond the run's {search.expected_steps}")
    else:
        row.decision = (f"{name}: kept, {ratio.estimate:.2f} of the step; its {extra_warmup:.1f} s warm-up pays back "
                        f"after {break_even} steps" + (f" (run: {search.expected_steps})" if search.expected_steps
                                                        else ""))
    row.vs_baseline = round(ratio.estimate * ((reference.median_s / search.base.median_s)
                                              if reference is not search.base and search.base.median_s else 1.0), 4)
    if pays:
        if incumbent is not None:
            search.lab.retire(incumbent)
        return trial
    search.lab.retire(trial)
    return incumbent


def _why(search: _Search, chosen: Trial | None) -> str:
    measured = [r for r in search.rows[1:] if r.ratio]
    if chosen is None:
        if any(n == "noisy" for n in search.notes):
            return (f"the machine was too noisy to establish a plan faster than the baseline "
                    f"({len(measured)} comparisons): the empty plan is kept (run again when it is quieter)")
        return (f"no plan was faster than the baseline by more than {search.margin:.0%} with its loss within "
                f"tolerance ({len(measured)} comparisons): the empty plan is kept")
    row = next(r for r in reversed(search.rows) if r.plan == chosen.plan)
    text = (f"{row.name}: {row.vs_baseline:.2f}x eager's step time (faster with 95% confidence), loss "
            f"{row.loss:.4f} vs {search.rows[0].loss:.4f} on the same first steps; {row.decision}")
    extra = [n for n in search.notes if n not in ("noisy", "not faster", "faster")]
    return text + ("; " + "; ".join(extra) if extra else "")
