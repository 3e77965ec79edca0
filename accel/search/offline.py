"""accel.tune: the one search apart, each plan on its own copies of your objects (accel.measure.Lab), from the same
start on the same batches, its first losses checked against the plain loop's. Your objects end as they started."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import accel.search.cache as plancache
from accel import clock
from accel.errors import MeasureError, PlanError, Problem
from accel.measure import TrainStep
from accel.measure.lab import Lab, Trial
from accel.randomness import first_batch
from accel.run.interrupts import autograd_kept
from accel.search.results import (
    Arm,
    Comparison,
    TuneResult,
    admit,
    cached_answer,
    distribute,
    keep_answer,
    memory_fit,
    offered,
    timing_fields,
)
from accel.search.settings import SLOW_STOP, Auto, candidates_of, placed
from accel.search.strategy import Search


@autograd_kept()  # a Ctrl-C as torch leaves a no_grad block while measuring leaves autograd as it was
def tune(model, optimizer, loader, device: Any = "auto", settings: Auto | None = None, **options: Any) -> TuneResult:
    """The fastest established plan that keeps the loss, measured on copies. ``options`` are accel.Auto's fields over
    ``settings`` (default: no cache). Under a launcher: the cached answer, with the wrapper by memory fit."""
    settings = dataclasses.replace(settings or Auto(cache=False), **options)
    if optimizer is None or loader is None:
        raise MeasureError("tune measures training steps: it needs an optimizer and a loader")
    started = clock.now()
    device, launch, hardware = placed(device)
    step = TrainStep(loss_fn=settings.loss_fn, split=settings.split, step_fn=settings.step_fn)
    batch = first_batch(loader)  # taken without advancing its generators or any RNG
    if batch is None:
        raise MeasureError("tune needs batches, and the loader yields none")
    step.check(batch)
    facts = plancache.setup_key(model, optimizer, loader, batch, device, hardware, step, settings.key()) \
        if settings.cache else None
    record = {**settings.key(), "budget_s": settings.budget_s, "device": str(device), "search": "apart"}
    kinds = candidates_of(settings, hardware, model, optimizer, loader, in_loop=False)
    result = cached_answer(facts, settings.cache, started, offered(kinds))
    if result is None and launch is not None and launch.world_size > 1:  # each rank measuring would choose alone
        result = TuneResult.measured({}, [], "the rest of the plan is not measured under a launcher (each rank would "
                                     "choose on its own): " + ("run plan='auto' once in a single process on the same "
                                     "setup, and the cache gives the ranks its answer" if settings.cache else
                                     "and the cache is off"), None, clock.now() - started, record)
    if result is not None:
        return distribute(result, memory_fit(model, optimizer, device, launch, settings.memory_per_rank))
    lab = Lab(model, optimizer, loader, device, step, check_steps=max(1, settings.check_steps))
    search = Search(settings, kinds)
    apart = Apart(lab, search, settings, facts, started)
    try:
        apart.run()
    finally:
        lab.close()
    record["budget_s"] = round(apart.deadline - started, 1)
    result = TuneResult.measured(search.best, search.rows, search.why(), search.rows[0].median_ms,
                                 clock.now() - started, record, established=search.established)
    keep_answer(result, facts, settings.cache, search.established)
    return result


class Apart:
    """The Lab's rounds for the search's comparisons: a plan's copies kept while it may be compared again."""

    def __init__(self, lab: Lab, search: Search, settings: Auto, facts: dict | None, started: float):
        self.lab, self.search, self.settings, self.facts = lab, search, settings, facts
        self.base, self.deadline = None, started

    def run(self) -> None:
        base = self.base = self.trial({})
        if base.status != "ready":
            raise (PlanError([Problem("tune", f"the baseline (empty plan) is refused: {base.error}")])
                   if base.status == "refused"
                   else MeasureError(f"the baseline (empty plan) cannot train: {base.error}"))
        self.lab.pace(base.settled_step_s, self.settings.chunk_steps)
        self.deadline = self.settings.deadline(self.deadline, base.settled_step_s)  # from the start
        comparisons = self.search.comparisons()
        with contextlib.suppress(StopIteration):
            request = next(comparisons)
            while True:
                request = comparisons.send(self.measure(request))
                for trial in self.lab.trials:  # the plain loop's and the next reference's copies stay
                    if trial.plan not in ({}, request.reference):
                        self.lab.retire(trial)
        vars(self.search.rows[0]).update(timing_fields(base.median_s, base.first_s[0]), vs_baseline=1.0, loss_ok=True,
                                         losses=list(base.check_losses),
                                         loss=sum(base.check_losses) / len(base.check_losses))

    def trial(self, plan: dict[str, dict]) -> Trial:
        """The plan's trial still alive (its copies kept), else a new one."""
        return next((t for t in self.lab.trials if t.plan == plan and t.run is not None), None) or self.lab.trial(plan)

    def measure(self, request: Comparison) -> list[Arm]:
        """The comparison's outcomes; its reference is built again (when retired) only once it is admitted: its step
        as last timed (its trial alive, else the last retired) is what admit weighs."""
        timed = [t for t in self.lab.trials if t.plan == request.reference and t.first_s]
        step_s = (timed[-1].median_s or timed[-1].settled_step_s) if timed else None
        self.deadline, note, unmeasured = admit(request, self.settings, self.facts, self.deadline, 0, step_s)
        if unmeasured:
            return unmeasured
        reference = self.trial(request.reference)
        trials = [self.trial(plan) for plan in request.challengers]
        outcomes = [self._checked(t) for t in trials]
        live = [t for t, o in zip(trials, outcomes) if o.status == "measured"]
        ratios = self.lab.rounds(live, reference, request.thresholds, deadline=self.deadline) if live else {}
        for trial, out in zip(trials, outcomes):
            if trial.status == "failed" and out.status == "measured":  # broke in a later round
                out.status, out.reason = "failed", trial.error
            out.ratio, out.rounds, out.note = ratios.get(id(trial), out.ratio), dict(trial.rounds), note
            out.fields.update(timing_fields(trial.median_s),
                              warmup_s=round(trial.warmup_s, 4) if trial.first_s else None)
            out.warmup_s, out.reference_s = trial.warmup_s - reference.warmup_s, reference.median_s
        if request.costly and outcomes[0].status == "measured":
            plancache.remember_warmup(self.facts, request.added, outcomes[0].warmup_s, self.settings.cache)
        return outcomes

    def _checked(self, trial: Trial) -> Arm:
        """Applied, trained, kept the loss, and not hopelessly slow (each first step over SLOW_STOP plain steps and
        over 0.5 s)."""
        if trial.status in ("refused", "failed"):
            return Arm(trial.plan, trial.status, trial.error)
        loss, reference = (sum(t.check_losses) / len(t.check_losses) for t in (trial, self.base))
        loss_ok = abs(loss - reference) <= self.settings.tolerance * max(abs(reference), 1e-8)
        out = Arm(trial.plan, fields={"loss": loss, "loss_ok": loss_ok, "losses": list(trial.check_losses),
                                      **timing_fields(first_s=trial.first_s[0])})
        fastest, base_step = min(trial.first_s), self.base.settled_step_s
        if not loss_ok:
            out.status, out.reason = "loss off", (f"loss {loss:.4f} vs baseline {reference:.4f} over the same first "
                                                  f"steps: outside the {self.settings.tolerance:.0%} tolerance")
        elif len(trial.first_s) > 1 and fastest > max(SLOW_STOP * base_step, 0.5):
            out.status = "stopped early"
            out.reason = (f"each first step took over {fastest:.2f} s, over {SLOW_STOP:g}x the baseline's "
                          f"{base_step:.3f} s")
        return out
