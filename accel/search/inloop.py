"""plan="auto" in your loop: the first steps of your real training are the measurement.

    run = accel.accelerate(model, optimizer, loader, plan="auto")
    for x, y in run.loader:                       # your loop, unchanged
        ...; run.backward(loss); run.step()

``InLoopSearch`` is a controller that owns the run of the plan in place (``run.current``, an accel.Run made by
accelerate() on your own objects) and switches its plan between chunks of your steps, as the one search decides
(strategy.py: the stack the hardware predicts against the plain loop first, then what budget is left on ablations,
rival stacks and compile; turns.py measures it on your steps). Nothing is copied: every step is a real step of your
model and optimizer, and a switch is accelerate() again (the earlier run undone, its counters and state handed over),
so each plan keeps its card. It answers what the loop calls (run.loader, run.backward, run.step, run.load,
run.close); every other name is the run's of the plan in place: read run.model inside the loop, not once before it
(compile, when chosen, wraps it). The report (``run.report``, its ``search``: words.py) says at every moment what
auto measures, what it chose and why, and what measuring cost.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

from accel import clock
import accel.plan.cache as plancache
from accel.api import accelerate
from accel.errors import AccelerateError, BypassWarning, CheckpointError, MeasureError, PlanError
from accel.hardware import probe
from accel.measure import TrainStep, plan_label
from accel.modules import compiled
from accel.plan import Plan
from accel.plan.contract import Capability
from accel.run import open_run
from accel.run.checkpoint import decode_plan, read
from accel.run.context import placement
from accel.run.sharded_checkpoint import is_sharded_checkpoint
from accel.search import distribution
from accel.search.fault import Capture, interrupts_held, summary
from accel.search.ranks import in_step
from accel.search.remembered import cached_answer, keep_answer
from accel.search.results import TuneResult, TuneRow
from accel.search.settings import Auto, candidates_of, for_device, provides
from accel.search.strategy import Search
from accel.search.turns import Turns
from accel.search.words import SearchState, Seen, label

CHUNK_S = 0.5  # a chunk's timed steps take about this long (tests shorten it here)
DATA_WAIT = 0.10  # a rebuilt loader (workers) pays when the loop waits this fraction of its step for data
COPY = ("it trains a copy of your model, which a switch back to another plan would leave behind: measured apart on "
        "copies by accel.tune (or plan=accel.Auto(step_fn=...)), or ask for it in a plan")


class InLoopSearch:
    """What plan="auto" returns in your loop: a run whose plan auto switches between chunks of your steps while it
    measures. Use it as any run; ``run.search`` (also ``run.report.search``) says what auto has done so far, and
    ``run.report.tuning`` holds the search's table once it chose."""

    def __init__(self, settings: Auto, model, optimizer, loader, device: Any = "auto"):
        if optimizer is None or loader is None:
            missing = " and ".join(what for what, given in (("an optimizer", optimizer), ("a loader", loader))
                                   if given is None)
            raise MeasureError(
                f"plan='auto' measures your training steps: it needs {missing}. A model with no loader of its own (a "
                "GAN's generator) can be given the loader that paces its steps (the discriminator's): its turns are "
                "timed between your run.step() calls; or give it a plan (docs/two_models.md)")
        self.settings, self.started, self.chunk_s = settings, clock.now(), CHUNK_S
        self.objects = (model, optimizer, loader)
        hardware, problems = probe(), []
        decided = placement(device, hardware, problems)
        if decided is None:
            raise PlanError(problems)
        self.device, self.launch, self.hardware = decided.device, decided.launch, for_device(hardware, decided.device)
        self.notes: list[str] = []
        self.distributed, self.hold, self.ranks = in_step(decided.launch, model, optimizer, self.device, settings,
                                                          self.notes)
        candidates, given = candidates_of(settings, self.hardware, model, optimizer, loader)
        self.copies = [c for c in candidates if provides(c, Capability.MODEL_COPY)]
        self.epochwise = [c for c in candidates if c not in self.copies and provides(c, Capability.DATA_LOADER)]
        rest = [c for c in candidates if c not in self.copies and c not in self.epochwise]
        costly = [c for c in rest if provides(c, Capability.SETUP_COSTLY)]
        self.strategy = Search([c for c in rest if c not in costly], costly, given, settings.margin,
                               settings.expected_steps)
        try:
            self.current = accelerate(model, optimizer, loader, plan=dict(self.distributed), device=device)
        except BaseException:
            self.hold.release()
            raise
        self.search = SearchState(since_step=self.current.steps)  # what the report says auto has done
        self.current.report.search = self.search
        self.capture = Capture(model)  # your model's training forwards: what a fault is replayed on
        self.loader = SearchLoader(self)
        self.phase, self.how = "measuring", ""  # measuring, chosen (measuring what budget is left), settled
        self.blames: list = []  # faults no candidate paid for (the data's, the loop's)
        self.saved: dict[str, dict] = {}  # accelerator name -> its state when its plan last stepped aside
        self.result: TuneResult | None = None
        self.cache_key: dict | None = None
        self.pending: dict[str, dict] | None = None  # the plan to take at the next epoch (a rebuilt loader)
        self.data_wait_s = self.switch_s = 0.0
        self.switched_at = clock.now()
        self.loader_read = self.stepping = self.bypassed = self.switching = False
        self.chosen_at: int | None = None
        self.settled_at: int | None = None
        self.ended_at: float | None = None
        mine = weakref.WeakMethod(self._optimizer_steps)  # your optimizer must not keep a dropped search alive
        self.watching = optimizer.register_step_pre_hook(lambda *args: mine() and mine()(*args))
        self.turns = Turns(self)
        self.turns.start()

    def __getattr__(self, name: str) -> Any:
        """Every name but the loop's calls below is the run's of the plan in place (an accel.Run)."""
        current = self.__dict__.get("current")
        if current is None:
            raise AttributeError(name)
        return getattr(current, name)

    @property
    def measuring(self) -> bool:
        return self.phase in ("measuring", "chosen")

    @property
    def arms(self) -> list:
        """Every plan that took (or waits for) turns, the plain loop first (turns.Arm)."""
        return self.turns.arms

    # --- what the loop calls ---------------------------------------------------------------------------------------

    def autocast(self):
        return self.current.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        if self.bypassed and self.measuring:
            self._end_bypassed()
        if self.measuring:
            self.turns.losses.append(loss.detach())
            self.turns.calls += self.capture.take()
        self.current.backward(loss)

    def step(self) -> bool:
        if self.measuring:
            self.turns.before_update()
        self.stepping = True
        try:
            skipped = self.current.step()
        finally:
            self.stepping = False
        if self.measuring:
            self.search.step = self.current.steps
            self.turns.after_step()
        return skipped

    def close(self) -> None:
        """Close the run; while auto measured, the report says what it chose so far (or that nothing was chosen)."""
        if self.phase == "measuring":
            self.phase, self.search.cached = "ended early", "nothing cached"
            self.update_words()
        elif self.phase == "chosen":
            self._settle("the run ended while it measured what budget was left")
        with interrupts_held():
            self.capture.remove()
            self.watching.remove()
            model = self.objects[0]
            interrupted = open_run(model._orig_mod if compiled(model) else model) if self.switching else None
            for run in dict.fromkeys(r for r in (interrupted, self.current) if r is not None):  # the newest first
                if not run.closed:
                    run.close()
            self.hold.release()  # the group leaves with the last run that held it (when accel joined it)

    def load(self, path) -> dict:
        """Resume: the checkpoint's plan is the answer (nothing is measured), once its state fits this run; a
        checkpoint that does not fit is refused with nothing changed, the search going on as before."""
        if is_sharded_checkpoint(path):
            return self.current.load(path)
        state = read(path)
        plan = Plan(decode_plan(state["plan"], path)).to_dict()
        problems = self.current.state_problems({**state, "accelerators": {}})
        if problems:
            raise CheckpointError(f"{path} does not fit this run; nothing was loaded: " + "; ".join(problems))
        before = {k: v for k, v in self.current.plan.to_dict().items() if k not in self.distributed}
        if self.switch({k: v for k, v in plan.items() if k not in self.distributed}) is None:
            raise CheckpointError(f"{path}: its plan {plan_label(plan)} is refused here; nothing was loaded")
        try:
            info = self.current.load(path)
        except BaseException:
            self.switch(before)
            self.turns.restart_chunk()
            raise
        if self.measuring:
            self._settle(f"resumed from {path}", why=f"resumed from {path}: its plan {plan_label(plan)} is taken as "
                                                     "it was saved, nothing measured", plan=plan)
        return info

    # --- switching plans -------------------------------------------------------------------------------------------

    def switch(self, plan: dict[str, dict], arm: Any = None) -> bool | None:
        """accelerate() on your objects with this plan (the earlier run handed over): True when switched, False
        when it was in place, None when refused or failed (the arm's status says why). A Ctrl-C waits until the
        switch is whole; any other exception out of it leaves the run open on your model for close() to put back."""
        plan = {**plan, **self.distributed}
        if self.current.plan.to_dict() == plan and not self.current.closed:
            self.switched_at = clock.now()
            return False
        with interrupts_held():
            return self._switch(plan, arm)

    def _switch(self, plan: dict[str, dict], arm: Any) -> bool | None:
        model, optimizer, loader = self.objects
        began, leaving = clock.now(), [a.name for a in self.current.accelerators]
        for name in leaving:  # each plan's state (amp's GradScaler) waits for its next turn
            self.saved[name] = self.current.accelerator_state_dict(name)
        self.switching = True
        try:
            run = accelerate(model, optimizer, loader, plan=plan, device=self.device)
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
        self.current, self.switching = run, False
        run.report.search = self.search  # every plan's report says what auto has done so far
        self.capture.attach()  # after the plan's own hooks on your model
        for accelerator in run.accelerators:  # those handed over by the run before already have theirs
            if accelerator.name not in leaving and accelerator.name in self.saved:
                try:
                    run.load_accelerator_state(accelerator.name, self.saved[accelerator.name])
                except ValueError:  # another configuration of it (bf16 after fp16): it starts afresh
                    pass
        return True

    def _take(self, plan: dict[str, dict]) -> None:
        """The chosen plan now, but its rebuilt loader only from the next epoch."""
        now = {k: v for k, v in plan.items() if not provides({k: v}, Capability.DATA_LOADER)}
        self.pending = plan if now != plan else None
        self.switch({k: v for k, v in now.items() if k not in self.distributed})

    def epoch_boundary(self) -> None:
        if self.pending is not None:
            plan, self.pending = self.pending, None
            self.switch({k: v for k, v in plan.items() if k not in self.distributed})

    def on_batch(self, batch: Any) -> None:
        """Each batch of run.loader: a bypass said before ends the search now; at the first, the cache's answer for
        this setup, if it was measured before (the key needs the batch)."""
        self.loader_read = True
        if self.bypassed and self.measuring:
            self._end_bypassed()
        if self.cache_key is not None or not self.settings.cache or not self.measuring:
            return
        model, optimizer, loader = self.objects
        self.cache_key = plancache.setup_key(model, optimizer, loader, batch, self.device, self.hardware, TrainStep(),
                                             self.settings.key())
        result = self.ranks.decide(cached_answer(self.cache_key, self.settings.cache, self.started))  # rank 0's
        if result is not None:
            result = self._for_ranks(result)
            result.settings = {**result.settings, "settled_at_step": self.current.steps}
            self._settle("from the cache", result=result)

    def _optimizer_steps(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer step that did not come through run.step(): the search cannot time the loop's steps. It
        ends on the plain loop, said at once; the switch waits for the next batch or call (not inside the step)."""
        if self.stepping or self.bypassed or not self.measuring:
            return
        model = self.objects[0]
        if self.current.closed or open_run(model._orig_mod if compiled(model) else model) is not self.current:
            self._settle("your loop made another run on your model (accelerate() again): auto stopped measuring",
                         switch=False)
            return
        self.bypassed = True
        warnings.warn("accel: plan='auto' times your steps between run.step() calls, and your loop called "
                      "optimizer.step() itself: nothing can be measured, so the plain loop stays (nothing applied); "
                      "call run.step() once per batch to let auto measure", BypassWarning, stacklevel=3)
        if not {k for k in self.current.plan.to_dict() if k not in self.distributed}:
            self._end_bypassed()

    def _end_bypassed(self) -> None:
        for arm in self.arms[1:]:
            if arm.status in ("waiting", "measuring"):
                arm.status, arm.reason = "not measured", "your loop steps the optimizer itself"
        self._settle("your loop bypasses run.step()", plan={}, why=(
            "your loop calls optimizer.step() itself, not run.step(): plan='auto' times the steps between run.step() "
            "calls, so nothing was measured: the plain loop is kept"))

    # --- choosing and settling ---------------------------------------------------------------------------------------

    def choose(self) -> None:
        """The first verdict is in (strategy.Search.decided): the choice is said and remembered at once; what
        budget is left goes on measuring."""
        self.phase, self.chosen_at = "chosen", self.current.steps
        self.result = self._result()
        self.current.report.tuning = self.result
        keep_answer(self.result, self.cache_key, self.settings.cache, self._keepable())
        self.update_words()

    def finish(self) -> None:
        """The search's comparisons are done: the plan it chose is taken (a rebuilt loader at the next epoch)."""
        self._settle("the budget ran out before every verdict was clear" if self.turns.cut else "settled")

    def _settle(self, how: str, why: str = "", plan: dict | None = None, result: TuneResult | None = None,
                switch: bool = True) -> None:
        self.phase, self.how, self.settled_at, self.ended_at = "settled", how, self.current.steps, clock.now()
        if self.chosen_at is None:
            self.chosen_at = self.current.steps
        self.result = result or self._result(why, plan)
        if switch and how != "the run ended while it measured what budget was left":
            self._take(self.result.plan.to_dict())
        self.current.report.tuning = self.result
        if result is None:
            keep_answer(self.result, self.cache_key, self.settings.cache, self._keepable() and not why)
        self.capture.remove()
        self.update_words()

    def _keepable(self) -> bool:
        """An answer the cache keeps: established, and a single process's (launched jobs take those)."""
        return self.strategy.established and not self.distributed

    def _result(self, why: str = "", plan: dict | None = None) -> TuneResult:
        """The search's table and its answer so far: the strategy's rows, with the loader decided by the loop's
        wait for data and what trains a copy named."""
        rows, strategy = list(self.strategy.rows), self.strategy
        plain = self.turns.plain
        rows[0].median_ms = round(plain.median_s() * 1000, 3) if plain.rounds else None
        rows[0].vs_baseline, rows[0].reason = 1.0, f"{len(plain.rounds)} rounds, {plain.steps} steps"
        chosen = dict(strategy.best) if plan is None else dict(plan)
        wait, spent = self.turns.plain_wait
        share = self.ranks.decide(wait / spent if spent else 0.0)
        for candidate in self.epochwise if plan is None else []:
            row = TuneRow(plan_label(candidate), candidate, "by data wait", against="eager", tests=next(iter(candidate)))
            if not self.loader_read:
                row.status, row.reason = "not measured", "your loop never iterated run.loader: its data wait is unknown"
            elif share >= DATA_WAIT:
                chosen.update(candidate)
                row.decision, row.reason = "chosen", f"your loop waited {share:.0%} of its step for data: it joins " \
                                                     "at the next epoch"
            else:
                row.decision, row.reason = "not needed", f"your loop waited {share:.0%} of its step for data"
            rows.append(row)
        rows += [TuneRow(plan_label(c), c, "not measured", reason=COPY) for c in self.copies]
        notes = list(self.notes)
        if not self.loader_read and self.settings.cache and len(self.arms) > 1:
            notes.append("your loop never iterated run.loader, so the cache was neither read nor written (its key "
                         "needs a batch)")
        notes += summary(self.blames)
        if not why:
            nothing = not strategy.candidates and not strategy.costly and not self.epochwise
            why = ("nothing to measure: no accelerator offers a candidate for this model on this hardware" if nothing
                   else strategy.why(f", at step {self.current.steps} of your loop"))
        why += "".join(f"; {n}" for n in notes)
        record = {**self.settings.key(), "search": "your loop", "budget_s": round(self.turns.deadline - self.started, 1),
                  "chosen_at_step": self.chosen_at, "settled_at_step": self.current.steps,
                  "switch_s": round(self.switch_s, 3)}
        result = TuneResult.measured(chosen, rows, why, rows[0].median_ms, clock.now() - self.started, record,
                                     established=strategy.established)
        return self._for_ranks(result)

    def _for_ranks(self, result: TuneResult) -> TuneResult:
        """Under a launcher, the result as the ranks run it: with ddp or fsdp, and where a cached answer came from."""
        if not self.distributed:
            return result
        model, optimizer, _ = self.objects
        return distribution.distribute(result, model, optimizer, self.device, self.launch,
                                       self.settings.memory_per_rank)

    # --- the words ---------------------------------------------------------------------------------------------------

    def update_words(self) -> None:
        """Bring the report's words up to date (cheap: a few ratios), in place: every plan's report holds them."""
        words, turns = self.search, self.turns
        words.phase = self.phase
        words.step = self.current.steps
        words.in_place = {k: v for k, v in self.current.plan.to_dict().items() if k not in self.distributed}
        words.measuring = turns.request.what if turns.request is not None else ""
        words.plain_ms = round(turns.plain.median_s() * 1000, 3) if turns.plain.rounds else None
        if self.result is not None and self.phase in ("chosen", "settled"):
            self._chosen_words()
        chosen = words.chosen if self.phase in ("chosen", "settled") else None
        words.candidates = [self._seen(a, chosen) for a in self.arms[1:] if a.status != "waiting" or a.rounds]
        words.candidates += [Seen(plan_label(c), "not measured", reason=COPY) for c in self.copies]
        words.faults = summary(self.blames)
        words.cost = self._cost()

    @staticmethod
    def _seen(arm, chosen: dict | None) -> Seen:
        ratio = arm.ratio_to(arm.against) if arm.against is not None else None
        against = "the plain loop" if arm.against is None or not arm.against.plan else arm.against.name
        median = arm.median_s()
        return Seen(arm.name, "chosen" if arm.plan == chosen else arm.status, against, str(ratio) if ratio and ratio.samples else "",
                    round(ratio.estimate, 4) if ratio and ratio.samples else None, arm.reason, len(arm.rounds),
                    round(median * 1000, 3) if median else None)

    def _chosen_words(self) -> None:
        result, strategy = self.result, self.strategy
        plan = {k: v for k, v in result.plan.to_dict().items() if k not in self.distributed}
        if result.from_cache:
            why = f"from the cache (measured on this setup {result.measured_at}, key {result.key[:12]}): nothing measured"
            by = {name: f"chosen by plan='auto' from the cache (measured {result.measured_at})" for name in plan}
        elif self.how.startswith("resumed"):
            why = self.how
            by = {name: f"taken by plan='auto' from the checkpoint ({self.how}): nothing measured" for name in plan}
        elif strategy.best:
            why = f"{strategy.vs_plain:.2f}x the plain loop's step ({strategy.best_why})"
            by = {name: f"chosen by plan='auto': {why}" for name in plan}
        else:
            why, by = result.why.split("; ")[0], {}
        for row in result.rows:
            if row.decision == "chosen" and row.tests in plan:  # the loader, by the loop's wait for data
                by[row.tests] = f"chosen by plan='auto': {row.reason}"
        cached = (f"from the cache, key {result.key[:12]}" if result.from_cache else
                  f"cached for the next run of this setup (key {result.key[:12]})" if result.key else
                  f"not cached ({self._not_cached()})")
        self.search.choose(plan, self.chosen_at, why, cached, by)
        self.search.phase, self.search.how, self.search.settled_at = self.phase, self.how, self.settled_at

    def _not_cached(self) -> str:
        if not self.settings.cache:
            return "cache=False"
        if self.cache_key is None:
            return "no batch was read for its key"
        if self.distributed:
            return "measured under a launcher: the cache keeps a single process's answers"
        return "the search could not establish its answer"

    def _cost(self) -> dict[str, float]:
        """What measuring cost: its seconds and steps, and how much longer they took than the chosen plan's."""
        elapsed = (self.ended_at or clock.now()) - self.started
        steps = self.current.steps - self.search.since_step
        chosen = next((a for a in self.arms if self.result is not None and a.plan == {
            k: v for k, v in self.result.plan.to_dict().items() if k not in self.distributed}), self.turns.plain)
        step_s = chosen.median_s() or self.turns.plain.median_s() or 0.0
        return {"measured_s": round(elapsed, 3), "steps": steps, "extra_s": round(max(elapsed - steps * step_s, 0), 3),
                "switch_s": round(self.switch_s, 3)}


class SearchLoader:
    """run.loader of plan="auto": your batches, prepared by the plan in place, the loop's wait for each counted.
    Every other name is the run.loader's of the plan in place (accel.run.device_loader.DeviceLoader)."""

    def __init__(self, run: InLoopSearch):
        self.run = run

    def __iter__(self):
        run = self.run
        run.epoch_boundary()
        batches = iter(run.current.loader.start_epoch())
        while True:
            began = clock.now()
            try:
                batch = next(batches)
            except StopIteration:
                return
            run.data_wait_s += clock.now() - began
            run.on_batch(batch)
            loader = run.current.loader
            if loader.drawn is not None:
                loader.drawn()
            yield loader.prepare(batch)

    def __len__(self) -> int:
        return len(self.run.current.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "run":
            raise AttributeError(name)
        return getattr(self.run.current.loader, name)
