"""What plan="auto" has done so far, said by the report at every moment: measuring, ended before it settled, settled.

Why: a run that ended before auto settled printed the plan whose turn it was as "applied", amp with "why=asked for",
and nothing said auto was still measuring; a settled run still said "asked for". The TuningRun keeps one SearchState
current (at every turn, chunk and verdict) and hangs it on the report of every run it switches to, so
``print(run.report)`` and ``run.report.to_dict()`` both say: while measuring, since which step, the arms measured so
far with their ratios to the plain loop, and whose turn it is; after the loop ended or close() before it settled,
that nothing was chosen and nothing cached, and what was learned; once settled, who chose each accelerator (auto,
with the measured ratio), never "asked for".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ASKED = "asked for"  # an accelerator's words for an option the plan gave: under auto, the plan was auto's


@dataclass
class ArmSeen:
    """One arm as far as it was measured: its ratio to the plain loop's step beside it, its rounds, its status."""

    name: str
    status: str
    rounds: int
    ratio: str = ""  # "0.71 (0.66-0.77)": its step over the plain loop's, with the 90% interval
    estimate: float | None = None
    reason: str = ""
    step_ms: float | None = None  # the median of its rounds' steps


@dataclass
class SearchState:
    phase: str = "measuring"  # measuring, ended early, settled
    since_step: int = 0  # the step auto began measuring at
    step: int = 0  # the run's steps when this was last brought up to date
    turn: str = ""  # the arm whose turn it is (the plan in place while measuring)
    plan: dict[str, dict] = field(default_factory=dict)  # the plan in place
    arms: list[ArmSeen] = field(default_factory=list)
    chosen: dict[str, dict] | None = None  # settled: the plan auto chose (None while measuring or ended early)
    chosen_why: str = ""  # settled: why, e.g. "0.71x the plain loop's step (0.66-0.77)"
    by: dict[str, str] = field(default_factory=dict)  # settled: accelerator -> who chose it and on what measure
    faults: list[str] = field(default_factory=list)  # faults no arm paid for (the data's, the loop's)
    cached: str = "nothing cached"

    # --- kept current by the TuningRun ------------------------------------------------------------------------

    def update(self, run: Any) -> None:  # a TuningRun
        """Bring every field up to date from the run (cheap: a few ratios), in place: every report holds this one."""
        from accel.search.fault import summary

        self.step, self.plan = run.steps, run.current.plan.to_dict()
        self.turn = run.active.name if self.phase != "settled" else ""
        self.arms = [self._seen(run, arm) for arm in run.arms]
        self.faults = summary(run.blames)

    @staticmethod
    def _seen(run: Any, arm: Any) -> ArmSeen:
        against = run.compile_base if arm is run.compile_arm and run.compile_base is not None else run.plain
        ratio = arm.ratio_to(against) if arm.rounds and arm is not run.plain else None
        steps = sorted(arm.rounds.values())
        median = round(steps[len(steps) // 2] * 1000, 3) if steps else None
        status = "the plain loop (baseline)" if arm is run.plain else arm.status
        return ArmSeen(arm.name, status, len(arm.rounds), str(ratio) if ratio and ratio.samples else "",
                       round(ratio.estimate, 4) if ratio and ratio.samples else None, arm.reason, median)

    def settle(self, run: Any, cached: str) -> None:
        """Settled: the plan chosen, and each of its accelerators with who chose it and on what measure."""
        self.phase, self.cached = "settled", cached
        self.update(run)
        result = run.result
        self.chosen = result.plan.to_dict()
        winner = run.winner
        if result.from_cache:
            self.chosen_why = f"from the cache (measured {result.measured_at})"
        elif winner is None or winner is run.plain or not winner.rounds:
            self.chosen_why = result.why
        else:
            against = run.compile_base if winner is run.compile_arm and run.compile_base is not None else run.plain
            ratio = winner.ratio_to(against)
            self.chosen_why = (f"{ratio.estimate:.2f}x {'the plain loop' if against is run.plain else against.name}'s "
                               f"step ({ratio})")
        how = run.settle_how
        self.by = {}
        for name in self.chosen:
            decided = next((a for a in run.arms if a.decided_by and name in a.plan and a.status == "settled"), None)
            if result.from_cache:
                self.by[name] = f"chosen by plan='auto' {self.chosen_why}"
            elif how.startswith("resumed"):
                self.by[name] = f"taken by plan='auto' from the checkpoint ({how}): nothing measured"
            elif decided is not None:
                self.by[name] = f"chosen by plan='auto': {decided.reason}"
            elif winner is not None and winner is run.compile_arm and name == winner.tests:
                self.by[name] = f"chosen by plan='auto' on top of {run.compile_base.name}: {winner.reason}"
            else:
                self.by[name] = f"chosen by plan='auto': {self.chosen_why}"

    def end(self, run: Any) -> None:
        """The loop ended (close()) before auto settled: nothing chosen, nothing cached; what it learned stays."""
        self.phase, self.cached = "ended early", "nothing cached"
        self.update(run)
        for arm in self.arms:
            if arm.status == "measuring":
                arm.status = "unfinished (the loop ended before its verdict)"

    # --- what the report shows --------------------------------------------------------------------------------

    def row_view(self, row: Any) -> Any:  # an accel.run.report.Row
        """The report's row of an accelerator, with who put it there: auto's turn, or auto's choice."""
        if row.name not in self.plan or row.status == "skipped":
            return row
        if self.phase == "settled":
            who = self.by.get(row.name, "chosen by plan='auto'")
            short = "chosen by plan='auto'"
        elif self.phase == "measuring":
            who = f"plan='auto' (measuring: arm {self.turn}'s turn, not a choice)"
            short = "plan='auto' (measuring)"
        else:
            who = f"plan='auto' ended before it settled: arm {self.turn or _label(self.plan)}'s turn, not a choice"
            short = "plan='auto' (ended before it settled)"
        changes = {k: (short if v == ASKED else v) for k, v in row.changes.items()}
        reason = who + (f"; {row.reason}" if row.reason else "")
        return dataclasses.replace(row, reason=reason, changes=changes)

    def lines(self) -> list[str]:
        head = f"auto: {self.headline()}"
        body = [f"  {a.name}: {a.status}" + (f", {a.ratio} of the plain loop's step" if a.ratio else "")
                + (f" over {a.rounds} rounds" if a.rounds > 1 and a.ratio else "")
                + (f", {a.step_ms:.1f} ms a step" if a.step_ms is not None and not a.ratio else "")
                + (f" ({a.reason})" if a.reason and a.ratio not in a.reason else "") for a in self.arms]
        return [head, *body, *(f"  {f}" for f in self.faults)]

    def headline(self) -> str:
        if self.phase == "measuring":
            return (f"measuring since step {self.since_step} (step {self.step} now): nothing chosen yet, nothing "
                    f"cached yet; arm {self.turn}'s turn (the plan in place: {_label(self.plan)}); "
                    f"{self._learned()}")
        if self.phase == "ended early":
            return (f"ended at step {self.step}, before it settled (measuring since step {self.since_step}): nothing "
                    f"was chosen and nothing was cached; what it learned: {self._learned()}")
        chose = _label(self.chosen or {})
        chose = "the plain loop (nothing applied)" if chose == "eager" else chose
        return f"settled at step {self.step}: chose {chose}, {self.chosen_why}; {self.cached}"

    def _learned(self) -> str:
        measured = [a for a in self.arms if a.ratio]
        if not measured:
            plain = next((a for a in self.arms if a.step_ms is not None), None)
            return ("no arm compared with the plain loop yet" +
                    (f" (the plain loop: {plain.step_ms:.1f} ms a step)" if plain is not None else ""))
        return "measured so far: " + "; ".join(f"{a.name} {a.ratio} of the plain loop's step" for a in measured)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "headline": self.headline()}

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _label(plan: dict[str, dict]) -> str:
    from accel.measure import plan_label

    return plan_label(plan)
