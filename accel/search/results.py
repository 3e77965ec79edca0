"""What a search asks and finds: the comparisons its strategy asks for and the arms that answer them (in your loop and
apart alike), a row per candidate and the result with its plan (one table for both searches), and what it remembers
through accel.search.cache: an established answer, and a costly candidate's warm-up."""
from __future__ import annotations

import datetime as _dt
import json
import statistics
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import accel.search.cache as plancache
from accel import clock
from accel.distributed.agreement import choose
from accel.errors import loops_level
from accel.files import cache_dir
from accel.measure import Ratio, paired, plan_label
from accel.plan import Plan
from accel.plan.contract import REGISTRY, Capability
from accel.run.report import render_table
from accel.search.settings import COSTLY_GUESS_S, Auto

SOURCE_WORDS = "the rest of the plan is the answer a single process measured on this setup"


@dataclass
class TuneRow:
    name: str  # accelerator names joined by '+', 'eager' for the plain loop
    plan: dict[str, dict]
    status: str  # measured, stopped early, not measured, refused, failed, loss off, by data wait
    against: str = ""  # what it was compared with
    ratio: dict[str, Any] | None = None  # its step over the other's, with the interval (Ratio.to_dict)
    vs_baseline: float | None = None  # its step over the plain loop's
    median_ms: float | None = None
    first_step_s: float | None = None
    warmup_s: float | None = None
    loss: float | None = None
    loss_ok: bool | None = None
    decision: str = ""
    reason: str = ""
    tests: str = ""  # the accelerator this row measures the effect of (dropped, kept, or added on top)
    losses: list[float] = field(default_factory=list, repr=False)


def timing_fields(median_s: float | None = None, first_s: float | None = None) -> dict[str, Any]:
    return {**({"median_ms": round(median_s * 1000, 3)} if median_s is not None else {}),
            **({"first_step_s": round(first_s, 4)} if first_s is not None else {})}


_KINDS = {"str": str, "bool": bool, "float": (int, float), "None": type(None)}


def _of_its_kinds(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values``, each of the kind its field of ``cls`` declares (str, a number, a dict, a list...): a cache entry
    with a list where a name belongs passed the table's printing and raised later, from the user's loop."""
    for f in fields(cls):
        kinds = tuple(_KINDS.get(kind, dict if kind.startswith("dict") else list if kind.startswith("list") else
                                 object) for kind in str(f.type).split(" | "))
        if f.name in values and not isinstance(values[f.name], kinds):
            raise TypeError(f"{cls.__name__}.{f.name} is a {type(values[f.name]).__name__}")
    return values


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
    established: bool = True  # False: the rounds could not establish the answer (a busy machine, the budget)

    @property
    def ablation(self) -> dict[str, float | None]:
        """Each accelerator's effect where it was measured: the time with it over the time without it."""
        effects: dict[str, float | None] = {}
        for row in self.rows:
            ratio = (row.ratio or {}).get("estimate")
            if row.against == "eager" and len(row.plan) == 1:
                effects[row.name] = ratio
            elif row.tests and ratio:  # a plan without it (1 / ratio) or with it on top (ratio)
                effects[row.tests] = round(ratio if row.tests in row.plan else 1 / ratio, 4)
        return effects

    @classmethod
    def measured(cls, plan: dict[str, dict], rows: list[TuneRow], why: str, baseline_ms: float | None,
                 elapsed_s: float, settings: dict[str, Any], established: bool = True) -> TuneResult:
        return cls(Plan(plan), rows, why, baseline_ms, elapsed_s, settings,
                   measured_at=_dt.datetime.now().isoformat(timespec="seconds"), established=established)

    def row(self, name: str) -> TuneRow:
        return next(r for r in self.rows if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "plan": self.plan.to_dict(), "ablation":
                self.ablation, "elapsed_s": round(self.elapsed_s, 2), "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneResult:
        """The result a cache entry holds; a TypeError where a value is not of its field's kind (a file's word)."""
        known = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
        return cls(**{**_of_its_kinds(cls, known), "plan": Plan(data["plan"]),
                      "rows": [TuneRow(**_of_its_kinds(TuneRow, r)) for r in data["rows"]]})

    def __str__(self) -> str:
        source = (f"from the cache (measured {self.measured_at}, key {self.key[:12]})" if self.from_cache
                  else f"in {self.elapsed_s:.1f} s")
        body = [(r.name, r.status, r.against, str(Ratio(r.ratio["samples"])) if r.ratio and r.ratio["samples"] else "",
                 "" if r.median_ms is None else f"{r.median_ms:.1f}",
                 "" if r.first_step_s is None else f"{r.first_step_s:.2f}",
                 "" if r.loss is None else f"{r.loss:.4f}", r.decision or r.reason) for r in self.rows]
        table = render_table(("candidate", "status", "vs", "time ratio (90%)", "ms/step", "first s", "loss", "note"),
                             body, right=(4, 5, 6))
        return "\n".join([f"accel tune: chose {self.plan.names() or 'the empty plan'} {source}", *table,
                          "why: " + self.why])


def offered(kinds: dict[str, Any]) -> list[dict[str, dict]]:
    """Every candidate plan of a search (settings.candidates_of's kinds), whichever way it measures them."""
    return [plan for kind in ("copies", "epochwise", "costly", "stepwise") for plan in kinds.get(kind, ())]


def unoffered(plan: dict[str, dict], candidates: Iterable[dict[str, dict]]) -> list[str]:
    """Each accelerator of ``plan`` with options no candidate gives it, in words: a search answers with candidates it
    tried (their loss checked) and nothing else, so a cache entry (a file anyone with the folder's access may write)
    holding other options is no search's answer here (threads past this machine's cores, float16 on a CPU)."""
    tried: dict[str, list] = {}
    for candidate in candidates:  # as an entry holds them (JSON: a tuple comes back a list)
        for name, options in json.loads(json.dumps(candidate, default=str)).items():
            tried.setdefault(name, []).append(options)
    return [f"{name} {json.dumps(options, default=str)}" for name, options in plan.items()
            if options not in tried.get(name, [])]


def cached_answer(facts: dict[str, Any] | None, cache: Any, started: float,
                  candidates: Iterable[dict[str, dict]] = ()) -> TuneResult | None:
    """The remembered answer for these key facts, marked as from the cache, or None: a damaged entry, or one whose
    accelerators' options are not among ``candidates`` (the search's here, offered(); said)."""
    hit = plancache.lookup(facts, cache) if facts is not None and cache else None
    if hit is None:
        return None
    try:
        result = TuneResult.from_dict(hit)
        str(result), result.to_dict()  # its table and numbers (the ablation) as the report gives them: values of
        # the wrong kind are a damaged entry
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):  # a damaged entry: measure again
        return None
    if extra := unoffered(result.plan.to_dict(), candidates):
        warnings.warn(f"accel: the plan cache entry {result.key[:12]} in {cache_dir(cache)} sets "
                      f"{'; '.join(extra)}, which no search of this setup tries here: it is not taken (a search "
                      "measures again; its answer, once established, replaces the entry)", stacklevel=loops_level())
        return None
    result.from_cache, result.elapsed_s = True, clock.now() - started
    return result


def keep_answer(result: TuneResult, facts: dict[str, Any] | None, cache: Any, established: bool) -> None:
    """Remember an established answer (its key goes on the result)."""
    if facts is not None and cache and established:
        result.key = plancache.store(facts, result.to_dict(), cache)


LONG_RUN_SHARE = 0.02  # in a run of known length, a costly warm-up may take this share of the run still ahead


def run_ahead_s(expected_steps: int | None, steps_done: int, step_s: float | None) -> float:
    """The seconds the run still has ahead at this step time, when its length is known (else 0)."""
    return max(expected_steps - steps_done, 0) * step_s if expected_steps and step_s else 0.0


def warmup_fit(candidate: dict[str, dict], facts: dict[str, Any] | None, cache: Any, left_s: float,
               ahead_s: float = 0.0) -> tuple[bool, float, str]:
    """Whether a costly candidate's warm-up (as last measured on this setup, else assumed) fits the budget left, or a
    small share of a run known to be long (then kept only if it pays back); the seconds it may take past the budget
    (0: within it); why, past it or out."""
    seen = plancache.known_warmup(facts, candidate, cache)
    guess_s, known = (COSTLY_GUESS_S, "assumed before one is measured here") if seen is None else (
        seen, "as measured on this setup before")
    allowance, guess = LONG_RUN_SHARE * ahead_s, f"its warm-up (about {guess_s:.0f} s, {known})"
    if left_s >= guess_s:
        return True, 0.0, ""
    if guess_s <= allowance:
        return True, allowance, (f"tried past the budget: {guess} is within {LONG_RUN_SHARE:.0%} of the run still "
                                 f"ahead ({ahead_s:.0f} s at the best plan's step), and a second run starts warm")
    return False, 0.0, (f"{guess} does not fit the {max(left_s, 0):.0f} s of budget left"
                        + (f", nor {LONG_RUN_SHARE:.0%} of the run still ahead ({ahead_s:.0f} s)" if ahead_s else ""))


@dataclass
class Comparison:
    """A reference and its challengers, measured in the same rounds until each ratio is decided at ``thresholds``."""

    reference: dict[str, dict]
    challengers: list[dict[str, dict]]
    thresholds: tuple[float, ...]
    what: str  # what is measured now, in words (the report says it)
    costly: bool = False  # the challenger adds a costly accelerator: its warm-up must fit first

    @property
    def added(self) -> dict[str, dict]:
        """What the (first) challenger adds to the reference (a costly candidate)."""
        return {k: v for k, v in self.challengers[0].items() if k not in self.reference}


@dataclass
class Arm:
    """One plan as an executor measured it in a comparison (its answer to the strategy); in your loop the same record
    takes its turns across comparisons (turns.py), its status current: waiting, measuring, then how it ended."""

    plan: dict[str, dict] = field(default_factory=dict)
    status: str = "measured"  # measured, refused, failed, loss off, stopped early, not measured (waiting, measuring)
    reason: str = ""
    ratio: Ratio = field(default_factory=Ratio)  # its step over the reference's, from the rounds both ran
    rounds: dict[int, float] = field(default_factory=dict)  # round -> its seconds per step
    fields: dict[str, Any] = field(default_factory=dict)  # its row's numbers (median_ms, first_step_s, loss...)
    warmup_s: float = 0.0  # its first step beyond the reference's step (a costly candidate's warm-up)
    reference_s: float | None = None  # the reference's step in the same rounds
    note: str = ""  # the executor's word on its row (a warm-up tried past the budget)
    first_s: float | None = None  # in your loop: its first step after the first switch to it (compile lands there)
    steps: int = 0
    against: Arm | None = None  # the reference of its last comparison

    @property
    def name(self) -> str:
        return plan_label(self.plan) if self.plan else "the plain loop"

    @property
    def usable(self) -> bool:
        return self.status == "measured" and bool(self.ratio.samples)

    def ratio_to(self, other: Arm) -> Ratio:
        return paired(self.rounds, other.rounds)

    def median_s(self) -> float | None:
        return statistics.median_high(self.rounds.values()) if self.rounds else None


OUT = "the budget ran out"


def admit(request: Comparison, settings: Auto, facts: dict | None, deadline: float, steps_done: int,
          step_s: float | None, agree: Callable = lambda verdict: verdict) -> tuple[float, str, list[Arm]]:
    """A comparison's deadline (a costly warm-up may go past the budget on a long run's allowance), the word on its
    rows, and its outcomes when it is not measured: the warm-up does not fit, or the budget ran out (``agree``: every
    rank takes rank 0's verdict)."""
    note = ""
    if request.costly:
        ahead = run_ahead_s(settings.expected_steps, steps_done, step_s)
        fits, allowance, note = agree(warmup_fit(request.added, facts, settings.cache, deadline - clock.now(), ahead))
        if not fits:
            return deadline, note, [Arm(request.challengers[0], "not measured", note)]
        deadline = clock.now() + 2 * allowance if allowance else deadline
    out = [Arm(plan, "not measured", OUT) for plan in request.challengers] if agree(clock.now() >= deadline) else []
    return deadline, note, out


def memory_fit(model, optimizer, device: Any, launch, memory: int | None = None) -> tuple[dict[str, dict], str]:
    """The wrapper a launched job's every plan carries, by memory fit, and why (({}, "") in a single process):
    decided once, before the first step, so that the answer names the wrapper its plans ran with."""
    if launch is None or launch.world_size <= 1:
        return {}, ""
    return choose(model, optimizer, device, launch.world_size, launch.local_world_size, memory)


def distribute(result, fit: tuple[dict[str, dict], str]):
    """A TuneResult for a launched job (``fit``: memory_fit's): with the wrapper, a row and the why saying so, and
    where a cached rest of the plan came from (once; unchanged in a single process)."""
    chosen, why = fit
    if not chosen:
        return result
    if not any(r.status == "memory fit" for r in result.rows):
        plan = {k: v for k, v in result.plan.to_dict().items()
                if Capability.MODEL_DISTRIBUTED not in REGISTRY[k].provides}
        result.plan = Plan({**plan, **chosen})
        result.rows.append(TuneRow(next(iter(chosen)), chosen, "memory fit", decision=why,
                                   reason="chosen by memory fit, not timed"))
        result.why = f"{why}; {result.why}" if result.why else why
    if result.from_cache and SOURCE_WORDS not in result.why:
        source = (f"{SOURCE_WORDS} ({result.settings.get('search', 'apart (accel.tune)')}, measured "
                  f"{result.measured_at or 'at an unknown time'}, cache key {result.key[:12]}): every rank takes it")
        head, sep, tail = result.why.partition("; ")
        result.why = f"{head}; {source}{sep}{tail}" if sep else f"{result.why}; {source}" if result.why else source
    return result
