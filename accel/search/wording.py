"""The words of a search: the table a result prints and the one-line why of its choice."""
from __future__ import annotations

from typing import Any

from accel.measure import Ratio
from accel.run.report import render_table


def render(self: Any) -> str:  # a TuneResult
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


def why(search: Any, chosen: Any) -> str:  # a Search and its chosen Trial (or None)
    measured = [r for r in search.rows[1:] if r.ratio]
    unmeasured = [r.name for r in search.rows if r.status == "not measured"]
    if chosen is None and unmeasured and not measured:
        return (f"the budget ran out before any candidate was compared with the baseline ({', '.join(unmeasured)} "
                "not measured): the empty plan is kept, untested; give a larger budget_s")
    if chosen is None:
        if any(n == "noisy" for n in search.notes):
            return (f"the machine was too noisy to establish a plan faster than the baseline "
                    f"({len(measured)} comparisons): the empty plan is kept (run again when it is quieter)")
        left = f"; not measured for the budget: {', '.join(unmeasured)}" if unmeasured else ""
        return (f"no plan was faster than the baseline by more than {search.margin:.0%} with its loss within "
                f"tolerance ({len(measured)} comparisons): the empty plan is kept{left}")
    row = next(r for r in reversed(search.rows) if r.plan == chosen.plan)
    text = (f"{row.name}: {row.vs_baseline:.2f}x eager's step time (faster with 95% confidence), loss "
            f"{row.loss:.4f} vs {search.rows[0].loss:.4f} on the same first steps; {row.decision}")
    extra = [n for n in search.notes if n not in ("noisy", "not faster", "faster")]
    return text + ("; " + "; ".join(extra) if extra else "")
