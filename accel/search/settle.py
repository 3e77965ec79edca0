"""How plan="auto" in your loop ends: from the cache at the first batch, or settled by the verdicts (the budget,
the rounds, a resumed checkpoint, a loop that bypasses run.step()); the rebuilt loader decided by the loop's wait
for data; the plan taken; the result table written (results.py) and remembered (remembered.py), as tune() does."""
from __future__ import annotations

from typing import Any

from accel import clock
import accel.plan.cache as plancache
from accel.search import distribution
from accel.search.arms import Arm
from accel.search.fault import summary
from accel.search.remembered import cached_answer, keep_answer
from accel.search.results import TuneResult, TuneRow, timing_fields
from accel.search.verdicts import established, undecided
from accel.measure import TrainStep

DATA_WAIT = 0.10  # a rebuilt loader (workers) pays when the loop waits this fraction of its step for data


class Settling:
    """The ending of a TuningRun (inloop.py), apart because it is one job."""

    def first_batch(self, batch: Any) -> None:
        """At the first batch: the cache's answer, if this setup was measured before (the key needs the batch)."""
        self.loader_read = True
        if self.cache_key is not None or not self.settings.cache or self.phase == "settled":
            return
        model, optimizer, loader = self._objects
        self.cache_key = plancache.setup_key(model, optimizer, loader, batch, self.device, self.hardware,
                                             TrainStep(), self._key_settings())
        result = self.ranks.decide(cached_answer(self.cache_key, self.settings.cache, self.started))  # rank 0's
        if result is None:
            return
        result = self._for_ranks(result)
        result.settings = {**result.settings, "settled_at_step": self.steps}
        self.measured_s = result.elapsed_s
        self.result = result
        self._take(result.plan.to_dict())
        self.current.report.tuning = result
        self.phase = "settled"
        self.settled_at = self.steps
        self.capture.remove()
        self.search.settle(self, cached=f"from the cache, key {result.key[:12]}")

    def _key_settings(self) -> dict[str, Any]:
        s = self.settings
        return {"search": "your loop", "tolerance": s.tolerance, "margin": s.margin,
                "expected_steps": s.expected_steps, "accelerators": s.accelerators,
                "candidates": self.given if self.given is not None else "generated"}

    def _end_bypassed(self) -> None:
        for arm in self.arms:
            if arm is not self.plain and arm.status == "measuring":
                arm.status, arm.reason = "not measured", "your loop steps the optimizer itself"
        self.winner, self.settle_how = self.plain, "your loop bypasses run.step()"
        self._finish("your loop calls optimizer.step() itself, not run.step(): plan='auto' times the steps between "
                     "run.step() calls, so nothing was measured: the plain loop is kept")

    def _settle(self, how: str) -> None:
        margin = self.settings.margin
        self.plain.status = "baseline"
        rivals = [a for a in self.arms if a is not self.plain and a.rounds and a.status == "measuring"]
        faster = [a for a in rivals if established(a.ratio_to(self.plain), margin)]
        self.winner = min(faster, key=lambda a: a.ratio_to(self.plain).estimate) if faster else self.plain
        self._fewer_unless_shown(faster)
        for arm in rivals:
            if arm is not self.winner and arm.status == "measuring":
                arm.status = "not chosen"
                arm.reason = arm.reason or f"{arm.ratio_to(self.plain)} of the plain loop's step"
        self.winner.status = "settled"
        self.settle_how = how
        if how == "budget":
            self.notes.append("the budget ran out before every verdict was clear")
        for arm in self.arms:
            if arm.status == "measuring":
                arm.status = "not measured"
                arm.reason = "budget" if how == "budget" else how
        plan = dict(self.winner.plan)
        if self._try_compile(plan):
            return
        self._finish_with(plan)

    def _fewer_unless_shown(self, faster: list[Arm]) -> None:
        """Settled before every verdict was clear: an accelerator on top of a plan also faster than the plain loop
        stays only where it showed it pays (its plan established faster than the one without it). On vgg16 the
        budget ran out with threads on top 1.04x slower, inside the interval: the larger plan was kept."""
        best, margin = self.winner, self.settings.margin
        fewer = [a for a in faster if a.plan.keys() < best.plan.keys()
                 and not established(best.ratio_to(a), margin)]
        if not fewer:
            return
        self.winner = min(fewer, key=lambda a: a.ratio_to(self.plain).estimate)
        extra = "+".join(sorted(best.plan.keys() - self.winner.plan.keys()))
        best.status, best.reason = "not needed", (f"{best.ratio_to(self.winner)} of {self.winner.name}'s step: "
                                                  f"{extra} on top did not show it pays")

    def _finish_with(self, plan: dict[str, dict]) -> None:
        """Decide the loader by the measured data wait, take the plan, and write the result."""
        wait, spent = self.plain_wait
        share = wait / spent if spent else 0.0
        for candidate in self.epochwise:
            name = next(iter(candidate))
            arm = Arm(candidate, tests=name, decided_by="by data wait" if self.loader_read else "")
            if not self.loader_read:
                arm.status, arm.reason = "not measured", "your loop never iterated run.loader: its data wait is unknown"
            elif share >= DATA_WAIT:
                plan = {**plan, **candidate}
                arm.status, arm.reason = "settled", (f"your loop waited {share:.0%} of its step for data: it joins at "
                                                     "the next epoch")
            else:
                arm.status, arm.reason = "not needed", f"your loop waited {share:.0%} of its step for data"
            self.arms.append(arm)
        self._finish(self._why(plan), plan)

    def _why(self, plan: dict[str, dict]) -> str:
        winner = self.winner
        if winner is self.plain or winner is None:
            measured = [a for a in self.arms if a is not self.plain and a.rounds]
            if not measured:
                return "no candidate could be timed in your loop: the plain loop is kept"
            return (f"no plan was faster than the plain loop by more than {self.settings.margin:.0%} with 95% "
                    f"confidence ({len(measured)} measured; {self.settle_how}): the plain loop is kept")
        ratio = winner.ratio_to(self.plain) if winner is not self.compile_arm else None
        text = f"{winner.name}: " + (f"{ratio} of the plain loop's step" if ratio else winner.reason)
        return text + f", settled at step {self.steps} ({self.settle_how})"

    def _finish(self, why: str, plan: dict[str, dict] | None = None) -> None:
        plan = plan or {}
        self.phase = "settled"
        self.settled_at = self.steps
        self.measured_s = clock.now() - self.started
        rows = [self._row(a) for a in self.arms]
        settings = {**self._key_settings(), "budget_s": round(self.deadline - self.started, 1),
                    "settled_at_step": self.steps, "switch_s": round(self.switch_s, 3)}
        if not self.loader_read and self.settings.cache and any(a.rounds for a in self.arms):
            self.notes.append("your loop never iterated run.loader, so the cache was neither read nor written (its "
                              "key needs a batch)")
        self.notes += summary(self.blames)
        if self.notes:
            why += "; " + "; ".join(self.notes)
        margin = self.settings.margin
        self.result = TuneResult.measured(
            plan, rows, why, rows[0].median_ms, clock.now() - self.started, settings,
            established=self.winner is not self.plain or not any(  # undecided arms
                undecided(a.ratio_to(self.plain), margin) for a in self.arms[1:]
                if a.status == "not chosen" and a.rounds and a is not self.compile_arm))
        self.result = self._for_ranks(self.result)
        self._take(plan)
        self.current.report.tuning = self.result
        complete = (self.result.established and self.settle_how == "settled"
                    and not any(r.status == "not measured" for r in rows))
        # an answer measured with ddp or fsdp in every arm is not a single process's: the cache keeps those only
        keep_answer(self.result, self.cache_key, self.settings.cache, complete and not self.distributed)
        self.capture.remove()
        self.search.settle(self, cached=self._cached_words())

    def _for_ranks(self, result: TuneResult) -> TuneResult:
        """Under a launcher, the result as the ranks run it: with ddp or fsdp (its row and why), and where a cached
        answer came from."""
        if not self.distributed:
            return result
        model, optimizer, _ = self._objects
        return distribution.distribute(result, model, optimizer, self.device, self.launch,
                                       self.settings.memory_per_rank)

    def _cached_words(self) -> str:
        if self.result.key:
            return f"cached under key {self.result.key[:12]}"
        why = ("cache=False" if not self.settings.cache else "no batch was read for its key" if self.cache_key is None
               else "measured under a launcher: the cache keeps a single process's answers, which launched jobs of "
                    "the same setup take" if self.distributed else "only an established, complete answer is kept")
        return f"not cached ({why})"

    def _row(self, arm: Arm) -> TuneRow:
        """The result table's row of an arm (the same table tune() writes)."""
        against = self.compile_base if arm is self.compile_arm and self.compile_base is not None else self.plain
        ratio = arm.ratio_to(against) if arm is not self.plain and arm.rounds else None
        status = {"settled": "measured", "measuring": "measured", "baseline": "measured"}.get(arm.status, arm.status)
        if arm.status in ("slower", "not faster", "not needed", "not chosen") and arm.rounds:
            status = "measured"
        if arm.decided_by:
            status = arm.decided_by
        decision = ("chosen" if arm.status == "settled" and arm is not self.plain else
                    "baseline (your plain loop)" if arm is self.plain else "")
        return TuneRow(arm.name, arm.plan, status, against="" if arm is self.plain else
                       "eager" if against is self.plain else against.name,
                       vs_baseline=round(ratio.estimate, 4) if ratio and ratio.samples else None,
                       decision=decision, reason=arm.reason or f"{len(arm.rounds)} rounds, {arm.steps} steps",
                       tests=arm.tests, **timing_fields(ratio, arm.median_s(), arm.first_s))
