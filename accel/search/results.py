"""What a search found: a row per candidate measured (or not, and why), and the result with its plan: the one table
of the search in your loop and apart, with the same rounding (timing_fields)."""
from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, field
from typing import Any

from accel.measure import Ratio, plan_label
from accel.plan import Plan
from accel.run.report import render_table


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


def timing_fields(ratio: Any = None, median_s: float | None = None, first_s: float | None = None) -> dict[str, Any]:
    """A row's measured numbers as both searches write them: the ratio (accel.measure.Ratio) with its interval,
    the median step in ms, the first step in s."""
    fields: dict[str, Any] = {}
    if ratio is not None and ratio.samples:
        fields["ratio"] = ratio.to_dict()
    if median_s is not None:
        fields["median_ms"] = round(median_s * 1000, 3)
    if first_s is not None:
        fields["first_step_s"] = round(first_s, 4)
    return fields


def not_measured(plan: dict[str, dict], against: str, reason: str) -> TuneRow:
    """The row of a candidate the search did not measure (the budget, a warm-up that does not fit), and why."""
    return TuneRow(plan_label(plan), plan, "not measured", against=against, reason=reason)


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

    @classmethod
    def measured(cls, plan: dict[str, dict], rows: list[TuneRow], why: str, baseline_ms: float | None,
                 elapsed_s: float, settings: dict[str, Any], established: bool = True) -> TuneResult:
        """A search's answer now: the plan (a dict inside the search) becomes a Plan here, at its edge."""
        return cls(Plan(plan), rows, why, baseline_ms, elapsed_s, settings,
                   measured_at=_dt.datetime.now().isoformat(timespec="seconds"), established=established)

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
        body = []
        for r in self.rows:
            ratio = Ratio(r.ratio["samples"]) if r.ratio and r.ratio.get("samples") else None
            body.append((r.name, r.status, r.against, str(ratio) if ratio else "",
                         f"{r.median_ms:.1f}" if r.median_ms is not None else "",
                         f"{r.first_step_s:.2f}" if r.first_step_s is not None else "",
                         f"{r.loss:.4f}" if r.loss is not None else "", r.decision or r.reason))
        table = render_table(("candidate", "status", "vs", "time ratio (90%)", "ms/step", "first s", "loss", "note"),
                             body, right=(4, 5, 6))
        return "\n".join([f"accel tune: chose {self.plan.names() or 'the empty plan'} {source}", *table,
                          "why: " + self.why])
