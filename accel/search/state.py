"""The state of one search: the lab it measures in, its rows, its deadline, and the tests every comparison uses."""
from __future__ import annotations

from typing import Any

from accel import clock
from accel.search.config import SLOW_STOP
from accel.search.results import TuneRow, timing_fields
from accel.search.verdicts import established, verdict
from accel.measure import Lab, Ratio, Trial


class Search:
    """One tune() call: the lab, the rows, and the decisions."""

    def __init__(self, lab: Lab, tolerance: float, margin: float, deadline: float, expected_steps: int | None):
        self.lab, self.tolerance, self.margin = lab, tolerance, margin
        self.deadline, self.expected_steps = deadline, expected_steps
        self.rows: list[TuneRow] = []
        self.base: Trial | None = None
        self.notes: list[str] = []
        self.cut_short = False  # a step of the search skipped for the budget: the answer is not one to remember
        self.facts: dict[str, Any] | None = None  # the cache's key facts (a measured warm-up is kept under them)
        self.cache: Any = False
        self.model: Any = None  # the user's model, device and CPU: whether compile would start warm
        self.device: Any = None
        self.cpu_model = ""

    def left(self) -> float:
        return self.deadline - clock.now()

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
            row.first_step_s = timing_fields(first_s=trial.first_s[0] if trial.first_s else None).get("first_step_s")
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
        for name, value in timing_fields(ratio, trial.median_s).items():
            setattr(row, name, value)
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
        return established(ratio, self.margin)

    def verdict(self, ratio: Ratio) -> str:
        """'faster' (established), 'not faster' (clearly not by the margin), or 'noisy' (cannot tell)."""
        return verdict(ratio, self.margin)
