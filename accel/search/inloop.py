"""plan="auto" in your loop: the first steps of your real training are the measurement.

``InLoopSearch`` owns the run of the plan in place (``run.current``, made by accelerate() on your own objects) and
switches its plan between chunks of your steps as the search decides (strategy.py; turns.py times the steps). A
switch is accelerate() again, nothing copied. Every name the loop does not call here is the current run's.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any

import torch

import accel.search.cache as plancache
from accel import clock
from accel.api import accelerate
from accel.distributed.agreement import RankAgreement, in_step
from accel.errors import AccelerateError, BypassWarning, CheckpointError, MeasureError, PlanError, loops_level
from accel.measure import TrainStep, plan_label
from accel.modules import compiled
from accel.run import open_run
from accel.run.checkpoint_fit import training_plan
from accel.run.interrupts import clean_up, deferred
from accel.run.state import load_saved, plan_of, read_saved
from accel.search.fault import Faults
from accel.search.results import Arm, TuneResult, cached_answer, distribute, memory_fit, offered
from accel.search.settings import Auto, candidates_of, placed
from accel.search.strategy import Search
from accel.search.turns import Turns
from accel.search.words import SearchLoader, SearchState, say, verdict

CHUNK_S = 0.5  # a chunk's timed steps take about this long (tests shorten it here)
ENDED = "the run ended while it measured what budget was left"


class InLoopSearch:
    """What plan="auto" returns in your loop: use it as any run; ``run.report.tuning`` holds the table once chosen."""

    def __init__(self, settings: Auto, model, optimizer, loader, device: Any = "auto"):
        if optimizer is None or loader is None:
            missing = " and ".join(w for w, given in (("an optimizer", optimizer), ("a loader", loader))
                                   if given is None)
            raise MeasureError(f"plan='auto' measures your training steps: it needs {missing}. A model with no loader "
                               "of its own (a GAN's generator) can be given the one that paces its steps; or give it "
                               "a plan (docs/two_models.md)")
        self.settings, self.started, self.chunk_s, self.objects = (settings, clock.now(), CHUNK_S,
                                                                   (model, optimizer, loader))
        self.device, self.launch, self.hardware = placed(device)
        # the wrapper every plan carries, decided once: the answer names it (your optimizer's state grows at its step)
        self.fit = memory_fit(model, optimizer, self.device, self.launch, settings.memory_per_rank)
        self.distributed, (_, self.hold, self.ranks) = self.fit[0], in_step(self.launch, model, optimizer, self.device,
                                                                            settings.memory_per_rank)
        self.notes = [f"a launched job of {self.launch.world_size} ranks: every plan measured ran with "
                      f"{plan_label(self.distributed)} (by memory fit), the same plan on every rank at every step, "
                      "timed by the slowest rank and decided by rank 0"] if self.distributed else []
        kinds = candidates_of(settings, self.hardware, model, optimizer, loader, in_loop=True)
        self.strategy = Search(settings, kinds)
        self.copies, self.epochwise, self.offered = kinds["copies"], kinds["epochwise"], offered(kinds)
        try:
            self.current = accelerate(model, optimizer, loader, plan=dict(self.distributed), device=device)
        except BaseException:
            self.hold.release()
            raise
        self.search = SearchState(since_step=self.current.steps)  # what the report says auto has done so far
        self.current.report.search = self.search
        self.faults = Faults(model, settings.tolerance,  # losses that are not finite, judged under the plain loop
                             optimizer if self.ranks.world_size == 1 else None)
        self.loader = SearchLoader(self)
        self.saved: dict[str, dict] = {}  # accelerator name -> its state when its plan last stepped aside
        self.result: TuneResult | None = None
        self.cache_key = self.ended_at = None
        self.switch_s, self.switched_at = 0.0, clock.now()
        self.bypassed = self.switching = False
        mine = weakref.WeakMethod(self._optimizer_steps)  # your optimizer must not keep a dropped search alive
        self.watching = optimizer.register_step_pre_hook(lambda *args: mine() and mine()(*args))
        self.turns = Turns(self)
        self.turns.answer()

    def __getattr__(self, name: str) -> Any:
        if "current" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.current, name)

    @property
    def phase(self) -> str:  # measuring, chosen (measuring what budget is left), settled, ended early
        return self.search.phase

    @property
    def measuring(self) -> bool:
        return self.phase in ("measuring", "chosen")

    @property
    def arms(self) -> list:  # every plan that took (or waits for) turns, the plain loop first (results.Arm)
        return self.turns.arms

    def backward(self, loss: torch.Tensor) -> None:
        if self.bypassed and self.measuring:
            self._end_bypassed()
        if self.measuring:
            self.faults.backward(loss)
        self.current.backward(loss)

    def step(self) -> bool:
        if self.measuring:
            self.turns.before_update()
        skipped = self.current.step()  # its optimizer steps are the run's own (watch.stepping)
        if self.measuring:
            self.search.step = self.current.steps
            self.turns.after_step()
        return skipped

    def close(self) -> None:
        """Close the run; while auto measured, the report says what it chose so far (or nothing)."""
        if self.phase == "measuring":
            self.search.phase, self.search.cached = "ended early", "nothing cached"
            say(self)
        elif self.phase == "chosen":
            self._settle(ENDED, switch=False)
        with deferred():
            self.faults.remove()
            self.watching.remove()
            interrupted = self._open_run() if self.switching else None
            for run in dict.fromkeys(r for r in (interrupted, self.current) if r is not None):  # the newest first
                if not run.closed:
                    run.close()
            self.hold.release()  # the group leaves with the last run that held it (when accel joined it)
            self.ranks = RankAgreement(None)  # its reference to the group, which would keep gloo's threads alive

    def load(self, path) -> dict:
        """Resume: the checkpoint's plan is the answer, once its state fits this run (else refused, nothing changed)."""
        saved = read_saved(path)  # read once, checked whole: its plan, the fit and the load below all use it
        # its plan as saved_plan builds it: nothing that would run code, errors naming the file
        plan, before = plan_of(path, saved.state["plan"]).to_dict(), self.current.plan.to_dict()
        if saved.sharded:  # shards load at any world size: this job's ddp or fsdp in place of its own
            plan = training_plan(plan)
        else:
            problems = self.current.state_problems({**saved.state, "accelerators": {}, "accelerators_per_rank": []})
            if problems:
                raise CheckpointError(f"{path} does not fit this run; nothing was loaded: " + "; ".join(problems))
        if self.switch(plan) is None:
            raise CheckpointError(f"{path}: its plan {plan_label(plan)} is refused here; nothing was loaded")
        try:
            info = load_saved(self.current, path, saved)
        except BaseException:
            try:  # twice if a Ctrl-C lands on the call (accel.run.interrupts)
                clean_up(self._switch_back, before)
            except BaseException:
                clean_up(self._switch_back, before)
                raise
            raise
        self.loader.pending = None  # the checkpoint's plan is the answer: no verdict's loader joins after it
        if self.measuring:
            self._settle(f"resumed from {path}", plan=plan, why=f"resumed from {path}: its plan {plan_label(plan)} is "
                                                                "taken as it was saved, nothing measured")
        return info

    def _switch_back(self, plan: dict[str, dict]) -> None:
        """The plan was switched away and back under this chunk (a refused run.load): it starts again."""
        self.switch(plan)
        self.turns.chunk.steps, self.turns.chunk.untimed, self.faults.record = 0, 1, []

    def switch(self, plan: dict[str, dict], arm: Any = None) -> bool | None:
        """accelerate() on your objects with this plan: True when switched, False when it was in place, None when
        refused or failed (the arm's status says why). A Ctrl-C waits until the switch is whole."""
        plan = {**plan, **self.distributed}
        if self.current.plan.to_dict() == plan and not self.current.closed:
            self.switched_at = clock.now()
            return False
        began, leaving = clock.now(), [a.name for a in self.current.accelerators]
        with deferred():
            # each plan's state (amp's GradScaler) waits for its next turn
            self.saved.update({name: self.current.accelerator_state_dict(name) for name in leaving})
            self.switching = True
            try:
                run = accelerate(*self.objects, plan=plan, device=self.device)
            except (PlanError, AccelerateError) as error:  # the earlier run is back as it was
                self.switching = False
                if arm is not None:
                    lines = [line.strip(" -") for line in str(error).splitlines()]
                    arm.status = "refused" if isinstance(error, PlanError) else "failed"
                    arm.reason = "; ".join(line for line in lines[1:] if line)[:300] or lines[0]
                return None
            finally:
                self.switched_at = clock.now()
                self.switch_s += self.switched_at - began
            self.current, self.switching, run.report.search, run.report.tuning = run, False, self.search, self.result
            self.faults.attach()  # after the plan's own hooks on your model
            for accelerator in run.accelerators:  # those handed over by the run before already have theirs
                if accelerator.name not in leaving and accelerator.name in self.saved:
                    with contextlib.suppress(ValueError):  # another configuration of it: it starts afresh
                        run.load_accelerator_state(accelerator.name, self.saved[accelerator.name])
        return True

    def on_batch(self, batch: Any) -> None:
        """Each batch of run.loader: a bypass said before ends the search; the first looks the setup up in the cache."""
        if self.bypassed and self.measuring:
            self._end_bypassed()
        if self.cache_key is not None or not self.settings.cache or not self.measuring:
            return
        self.cache_key = plancache.setup_key(*self.objects, batch, self.device, self.hardware, TrainStep(),
                                             self.settings.key())
        result = self.ranks.decide(cached_answer(self.cache_key, self.settings.cache, self.started,  # rank 0's
                                                 self.offered))
        if result is not None:
            result = self.for_ranks(result)
            result.settings = {**result.settings, "settled_at_step": self.current.steps}
            self._settle("from the cache", result=result)

    def _optimizer_steps(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer step not through run.step(): nothing can be timed, so the search ends on the plain loop, said
        at once; the switch waits for the next batch or call (not inside the step)."""
        if self.current.watch.stepping or self.bypassed or not self.measuring:
            return  # (the run's own steps too: a sharded save or load builds an optimizer's state with one)
        if self.current.closed or self._open_run() is not self.current:
            return self._settle("your loop made another run on your model (accelerate() again): auto stopped "
                                "measuring", switch=False)
        self.bypassed = True
        warnings.warn("accel: plan='auto' times your steps between run.step() calls, and your loop called "
                      "optimizer.step() itself: nothing can be measured, so the plain loop stays (nothing applied); "
                      "call run.step() once per batch to let auto measure", BypassWarning, stacklevel=loops_level())
        if not self.current.plan.to_dict().keys() - self.distributed.keys():
            self._end_bypassed()

    def _end_bypassed(self) -> None:
        for arm in (a for a in self.arms[1:] if a.status in ("waiting", "measuring")):
            arm.status, arm.reason = "not measured", "your loop steps the optimizer itself"
        self._settle("your loop bypasses run.step()", plan={}, why=(
            "your loop calls optimizer.step() itself, not run.step(): plan='auto' times the steps between run.step() "
            "calls, so nothing was measured: the plain loop is kept"))

    def choose(self) -> None:
        """The first verdict is in: said and remembered at once; what budget is left measures on."""
        self.search.phase, self.search.chosen_at = "chosen", self.current.steps
        self.result = self.current.report.tuning = verdict(self)
        say(self)

    def finish(self) -> None:
        """The comparisons are over: the plan chosen is taken (a rebuilt loader chosen at the next epoch)."""
        self._settle("the budget ran out before every verdict was clear" if self.turns.cut else "settled")

    def _settle(self, how: str, why: str = "", plan: dict | None = None, result: TuneResult | None = None,
                switch: bool = True) -> None:
        search, self.ended_at = self.search, clock.now()
        search.phase, search.how, search.settled_at = "settled", how, self.current.steps
        search.chosen_at = self.current.steps if search.chosen_at is None else search.chosen_at
        self.result = self.current.report.tuning = verdict(self, why, plan, result)
        if switch:
            chosen, failed = self.loader.now(self.result.plan.to_dict()), Arm()
            if self.switch(chosen, failed) is None and chosen.keys() - self.distributed.keys():  # the plain loop, said
                why = f"it could not be put in place ({failed.status}: {failed.reason})"
                warnings.warn(f"accel: plan='auto' chose {plan_label(chosen)}, and {why}; your loop goes on with the "
                              "plain loop", RuntimeWarning, stacklevel=loops_level())
                return self._settle("settled", f"{plan_label(chosen)} was chosen, and {why}: the plain loop is kept",
                                    plan={})
        self.faults.remove()
        say(self)

    def for_ranks(self, result: TuneResult) -> TuneResult:
        return distribute(result, self.fit)

    def _open_run(self) -> Any:
        model = self.objects[0]
        return open_run(model._orig_mod if compiled(model) else model)
