"""What happened to each accelerator, printable as a table and available as data; the one table renderer."""
from __future__ import annotations

import json
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def render_table(header: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> list[str]:
    """Aligned lines: columns padded to their widest cell (``right`` ones right-aligned), the last left as it is."""
    cells = [[str(c) for c in header]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
    return ["  ".join([*(row[i].rjust(w) if i in right else row[i].ljust(w) for i, w in enumerate(widths)), row[-1]])
            .rstrip() for row in cells]


@dataclass
class Row:
    name: str
    stage: str
    status: str  # "applied", "skipped", or "idle" (applied, then the loop went around the run: accel/run/watch.py)
    reason: str = ""
    changes: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class StepTimes:
    """Seconds between consecutive Run.step calls, in bounded memory: how many, the first (compile and warm-up),
    up to ``WARM`` steps in which torch.compile compiled again (with its seconds), and the latest ``KEPT`` others."""

    KEPT = 1024
    WARM = 64

    def __init__(self):
        self.count, self.first = 0, 0.0
        self.latest: deque[float] = deque(maxlen=self.KEPT)
        self.recompiled: dict[int, tuple[float, float]] = {}  # step number -> (its seconds, compile seconds in it)

    def append(self, seconds: float, compiled_s: float = 0.0) -> None:
        """One step's seconds; ``compiled_s``: what torch.compile spent compiling in it (warm-up, not a step)."""
        if not self.count:
            self.first = seconds
        elif compiled_s > 0 and len(self.recompiled) < self.WARM:
            self.recompiled[self.count + 1] = (seconds, compiled_s)
        else:
            self.latest.append(seconds)
        self.count += 1

    def __len__(self) -> int:
        return self.count

    def steady(self) -> list[float]:
        """The latest steps that compiled nothing, after the first (the first alone while it is the only one)."""
        return list(self.latest) or [self.first]

    def __repr__(self) -> str:
        return (f"StepTimes(count={self.count}, first={self.first:.4g}, latest={len(self.latest)} kept, "
                f"recompiled={len(self.recompiled)})")


@dataclass
class Report:
    device: str
    hardware: str
    rows: list[Row] = field(default_factory=list)
    step_times: StepTimes = field(default_factory=StepTimes)  # seconds between consecutive Run.step calls, bounded
    setup_s: float = 0.0
    tuning: Any = None  # accel.search.TuneResult when the plan was measured ("auto"): the ablation and the why
    decisions: dict[str, str] = field(default_factory=dict)  # device, rank, dtype, threads, workers...
    stale: dict[str, str] = field(default_factory=dict)  # "model"/"optimizer" -> what went stale and what to use
    continued: str = ""  # what this run took over from an earlier run on the same model
    search: Any = None  # plan="auto"'s words (accel.search.words.SearchState), kept current while it measures

    def shown_rows(self) -> list[Row]:
        """The rows as printed and exported: under plan="auto", each with who put it there (never "asked for")."""
        return [self.search.row_view(r) for r in self.rows] if self.search is not None else self.rows

    def row(self, name: str) -> Row:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no accelerator {name!r} in this report; it has: {[r.name for r in self.rows]}")

    @property
    def applied(self) -> list[str]:
        return [r.name for r in self.rows if r.status == "applied"]

    @property
    def skipped(self) -> list[str]:
        return [r.name for r in self.rows if r.status == "skipped"]

    def timing(self) -> dict[str, Any]:
        """The first step and the steps that compiled (warm-up, recompiles) kept apart from the steady steps."""
        times = self.step_times
        if not times.count:
            return {"steps": 0}
        median = statistics.median(times.steady())
        recompiles = {step: round(compile_s, 3) for step, (_, compile_s) in times.recompiled.items()}
        warm = [seconds for seconds, _ in times.recompiled.values()]
        return {
            "steps": times.count,
            "first_step_s": round(times.first, 4),
            "steady_median_ms": round(median * 1000, 3),
            "warmup_s": round(sum(max(0.0, t - median) for t in (times.first, *warm)), 4),
            **({"recompiles": recompiles} if recompiles else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "hardware": self.hardware, "setup_s": round(self.setup_s, 4),
                "decisions": self.decisions, "stale": self.stale, "continued": self.continued,
                "accelerators": [asdict(r) for r in self.shown_rows()],
                "timing": self.timing(), **({"search": self.search.to_dict()} if self.search is not None else {}),
                **({"tuning": self.tuning.to_dict()} if self.tuning is not None else {})}

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), default=str, **kwargs)

    def __str__(self) -> str:
        lines = [f"accel report: device {self.device}; {self.hardware}"]
        decided = {k: v for k, v in self.decisions.items() if k != "device"}
        if decided:
            lines.append("decided: " + ", ".join(f"{k}={v}" for k, v in decided.items()))
        body = []
        for r in self.shown_rows():
            changes = ", ".join(f"{k}={v}" for k, v in r.changes.items())
            detail = f"{r.reason}; {changes}" if r.reason and r.status in ("applied", "idle") else r.reason or changes
            body.append((r.name, r.stage, r.status, detail))
            body += [("", "", "warning", w) for w in r.warnings]
        lines += render_table(("accelerator", "stage", "status", "why / what changed"), body)
        if not self.rows:
            lines.append("(empty plan: nothing applied)")
        lines += [f"stale: your {what}: {why}" for what, why in self.stale.items()]
        if self.continued and self.search is None:  # under plan="auto", each switch's: in to_dict() only
            lines.append(f"continued: {self.continued}")
        if self.search is not None:
            lines += self.search.lines()
        if self.tuning is not None:
            lines.append(str(self.tuning))
        timing = self.timing()
        if timing["steps"] and self.search is None:  # the search's own words say its steps and what they cost
            again = ", ".join(f"step {i} ({s} s)" for i, s in timing.get("recompiles", {}).items())
            lines.append(f"steps: {timing['steps']}, first step {timing['first_step_s']} s "
                         f"(warm-up/compile {timing['warmup_s']} s" + (f", recompiled at {again}" if again else "")
                         + f"), steady median {timing['steady_median_ms']} ms")
        return "\n".join(lines)
