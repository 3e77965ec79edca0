"""The one search, for plan="auto" in your loop and apart (accel.tune) alike: a sequence of comparisons, each a
reference and its challengers measured in the same interleaved rounds, and the verdicts that lead from one to the
next. Where the rounds come from is the executor's (turns.py: your own steps; offline.py: copies in a Lab).

It starts from what it knows. The hardware predicts a stack (every candidate, one configuration each: bf16 where
native, channels_last for convolutions, fused optimizers): it is measured against the plain loop first, and the first
verdict is in as soon as its interval says it pays (chosen) or does not (dropped: then each candidate alone, and the
stack of those that helped). What budget is left goes to the plan's ablations (an accelerator not shown to pay
goes), to rival stacks (a candidate left out for a conflict, first in its own stack) and last to costly candidates
(compile) on top, kept when their warm-up pays back. An executor answers a comparison it has no budget for with
outcomes "not measured", so the sequence always runs to its end.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generator

from accel.measure import Ratio, paired, plan_label
from accel.plan import Plan
from accel.search.results import TuneRow
from accel.search.verdicts import decided, established, no_faster, pays, payback, words


@dataclass
class Comparison:
    """A reference and its challengers, measured in the same rounds until each ratio is decided by ``thresholds``
    (verdicts.decided)."""

    reference: dict[str, dict]
    challengers: list[dict[str, dict]]
    thresholds: tuple[float, ...]
    what: str  # in words, for the report: what is measured now
    costly: bool = False  # the challenger adds a costly accelerator: its warm-up must fit first


@dataclass
class Outcome:
    """What an executor measured of one challenger: its status, its ratio to the reference and its rounds."""

    status: str = "measured"  # measured, refused, failed, loss off, stopped early, not measured
    reason: str = ""
    ratio: Ratio = field(default_factory=Ratio)
    rounds: dict[int, float] = field(default_factory=dict)  # round -> its seconds per step
    fields: dict[str, Any] = field(default_factory=dict)  # the row's numbers (median_ms, first_step_s, loss...)
    warmup_s: float = 0.0  # its first step beyond its steady step (a costly candidate's warm-up)
    reference_s: float | None = None  # the reference's step in the same rounds
    note: str = ""  # the executor's word on its row (a warm-up tried past the budget)

    @property
    def usable(self) -> bool:
        return self.status == "measured" and bool(self.ratio.samples)


def stack_of(candidates: list[dict[str, dict]]) -> tuple[dict[str, dict], list[str]]:
    """One configuration per accelerator, in order, leaving out any that conflicts with those before it."""
    stack: dict[str, dict] = {}
    left_out = []
    for candidate in candidates:
        merged = {**stack, **{k: v for k, v in candidate.items() if k not in stack}}
        if merged != stack:
            problems = Plan.parse(merged)[1]
            if problems:
                left_out.append(f"{plan_label(candidate)} ({problems[0].message})")
            else:
                stack = merged
    return stack, left_out


def rival_stacks(candidates: list[dict[str, dict]]) -> list[dict[str, dict]]:
    """For each candidate the stack left out for a conflict, the stack with it first: what it conflicts with makes
    way (ipex's fused update and fused_optimizer's). On an AMX Xeon IPEX + bf16 stepped resnet18 at 64x64 in 0.65-0.74
    of channels_last+fused_optimizer+amp's time (benchmarks/bench_ipex.py): list order must not decide it."""
    stack, rivals = stack_of(candidates)[0], []
    for candidate in candidates:
        rival = stack_of([candidate, *candidates])[0]
        if not candidate.keys() <= stack.keys() and candidate.keys() <= rival.keys() and rival not in rivals:
            rivals.append(rival)
    return rivals


class Search:
    """The decisions of one search and its table. ``comparisons()`` yields what to measure next and is sent each
    comparison's outcomes (one per challenger); ``best`` is the plan chosen so far ({}: the plain loop)."""

    def __init__(self, candidates: list[dict[str, dict]], costly: list[dict[str, dict]], given: bool,
                 margin: float, expected_steps: int | None):
        self.candidates, self.costly, self.given = candidates, costly, given
        self.margin, self.expected_steps = margin, expected_steps
        self.rows = [TuneRow("eager", {}, "measured", decision="baseline (the plain loop)")]
        self.notes: list[str] = []
        self.best: dict[str, dict] = {}
        self.vs_plain, self.path = 1.0, []  # the best plan's step over the plain loop's, and the ratios that led there
        self.decided = False  # the first verdict is in: a plan established faster, or none
        self.noisy = False  # a first verdict the rounds could not reach
        self.first_measured: bool | None = None  # whether the first verdict's candidates were all measured
        self._dropped: tuple | None = None  # the last ablation's verdict: (estimate, name, plan, outcome) dropped

    @property
    def established(self) -> bool:
        """An answer to remember: a plan established faster, or none faster where the first verdict's candidates
        were all measured and their rounds reached a verdict."""
        return bool(self.best) or (not self.noisy and self.first_measured is not False)

    def _row(self, plan: dict, out: Outcome, reference: dict, decision: str, tests: str = "") -> TuneRow:
        ratio = out.ratio if out.ratio.samples else None
        to_plain = self.vs_plain if reference == self.best else 1.0 if not reference else None
        row = TuneRow(plan_label(plan), plan, out.status, plan_label(reference), ratio.to_dict() if ratio else None,
                      round(ratio.estimate * to_plain, 4) if ratio and to_plain else None, decision=decision,
                      reason=out.reason, tests=tests, **out.fields)
        row.decision += f"; {out.note}" if out.note else ""
        self.rows.append(row)
        return row

    def _adopt(self, plan: dict, ratio: Ratio, reference: dict) -> None:
        """The best plan so far; its step over the plain loop's through the reference it was compared with."""
        self.vs_plain = ratio.estimate * (self.vs_plain if reference else 1.0)
        dropped, added = sorted(reference.keys() - plan.keys()), sorted(plan.keys() - reference.keys())
        how = (f"{plan_label(plan)} {ratio}" if not reference else f"without {'+'.join(dropped)}: {ratio}" if not
               added else f"{'+'.join(added)} on top: {ratio}" if not dropped else f"{plan_label(plan)}: {ratio}")
        self.best, self.path = dict(plan), ([(how, ratio)] if not reference else [*self.path, (how, ratio)])

    @property
    def best_why(self) -> str:
        """How the best plan was measured: its interval against the plain loop, or each ratio that led to it."""
        if len(self.path) == 1:
            ratio = self.path[0][1]
            return f"{ratio.low:.2f}-{ratio.high:.2f}, 90% interval" if ratio.rounds > 1 else "1 round"
        return "; ".join(how for how, _ in self.path)

    def comparisons(self) -> Generator[Comparison, list[Outcome], None]:
        margin = self.margin
        vs_plain = (1 - margin,)
        if self.given:
            if self.candidates:
                outs = yield Comparison({}, self.candidates, vs_plain, "each candidate against the plain loop")
                self.first_measured = all(o.status != "not measured" for o in outs)
                self.noisy = any(o.usable and words(o.ratio, margin) == "noisy" for o in outs)
                self._fastest(self.candidates, outs, "")
            self.decided = True
        stack, left_out = stack_of(self.candidates) if not self.given else ({}, [])
        rivals = rival_stacks(self.candidates) if not self.given else []
        if left_out:
            self.notes.append("left out of the stack: " + "; ".join(left_out) + (
                " (each measured in a rival stack, where what it conflicts with makes way)" if rivals else ""))
        if stack:
            (out,) = yield Comparison({}, [stack], vs_plain, f"the stack the hardware predicts ({plan_label(stack)})"
                                      " against the plain loop")
            self._row(stack, out, {}, "the stack the hardware predicts")
            self.first_measured = out.status != "not measured"
            if out.usable and established(out.ratio, margin):
                self._adopt(stack, out.ratio, {})
            self.noisy = out.usable and not (established(out.ratio, margin) or no_faster(out.ratio, margin))
            self.decided = True
            if not self.best and len(stack) > 1 and out.status != "not measured":  # dropped: each alone
                singles = [{k: v} for k, v in stack.items()]
                outs = yield Comparison({}, singles, vs_plain, "each candidate alone against the plain loop")
                helped = self._fastest(singles, outs, "alone")
                if len(helped) > 1:
                    together = {k: v for plan in helped for k, v in plan.items()}
                    (out,) = yield Comparison({}, [together], vs_plain, "the stack of what helped alone against "
                                                                         "the plain loop")
                    self._row(together, out, {}, "the stack of what helped alone")
                    if out.usable and established(out.ratio, margin) and out.ratio.estimate < self.vs_plain:
                        self._adopt(together, out.ratio, {})
        self.decided = True
        while len(self.best) > 1 and not self.given:
            yield from self._ablations()
            if not self._dropped:
                break
        for rival in rivals:
            yield from self._rival(rival, stack)
        for candidate in self.costly:
            yield from self._costly(candidate)

    def _fastest(self, plans: list[dict], outs: list[Outcome], alone: str) -> list[dict]:
        """Plans measured against the plain loop in the same rounds: the fastest established one is chosen, unless
        one with fewer accelerators under it is not shown slower (what is on top did not show it pays)."""
        won = [(o.ratio.estimate, i) for i, o in enumerate(outs) if o.usable and established(o.ratio, self.margin)]
        sfx = f" {alone}" if alone else ""
        said = {"faster": f"faster{sfx}, not the fastest", "not faster": f"not faster{sfx} by the margin",
                "noisy": f"not established{sfx} (noisy)"}
        rows = [self._row(plan, out, {}, said[words(out.ratio, self.margin)] if out.usable else "")
                for plan, out in zip(plans, outs)]
        if not won:
            return []
        best = min(won)[1]
        fewer = [i for _, i in won if plans[i].keys() < plans[best].keys()
                 and not established(paired(outs[best].rounds, outs[i].rounds), self.margin)]
        if fewer:
            extra = "+".join(sorted(plans[best].keys() - plans[min(fewer, key=lambda i: outs[i].ratio.estimate)].keys()))
            rows[best].decision = f"not needed: {extra} on top did not show it pays"
            best = min(fewer, key=lambda i: outs[i].ratio.estimate)
        self._adopt(plans[best], outs[best].ratio, {})
        rows[best].decision = "chosen" if not alone else f"helps {alone}: chosen"
        return [plans[i] for _, i in sorted(won)]

    def _ablations(self) -> Generator[Comparison, list[Outcome], None]:
        """The best plan without each of its accelerators, against it: each one not shown to pay goes (the one
        whose removal costs least first; the others are measured again against the smaller plan)."""
        best, margin = self.best, self.margin
        names = list(best)
        trimmed = [{k: v for k, v in best.items() if k != name} for name in names]
        outs = yield Comparison(best, trimmed, (1 + margin,), f"whether each accelerator of {plan_label(best)} pays")
        droppable = []
        for name, plan, out in zip(names, trimmed, outs):
            if not out.usable:
                self._row(plan, out, best, f"kept {name}: the plan without it could not be timed", tests=name)
                continue
            share = 1 / out.ratio.estimate
            if pays(out.ratio, margin) or out.ratio.rounds < 2 or out.ratio.estimate > 1 + margin:
                self._row(plan, out, best, f"kept {name}: {share:.2f} of the time with it", tests=name)
            else:
                droppable.append((out.ratio.estimate, name, plan, out))
        self._dropped = min(droppable, key=lambda d: d[0]) if droppable else None
        for estimate, name, plan, out in sorted(droppable, key=lambda d: d[0]):
            verdict = f"it does not pay ({1 / estimate:.2f} of the time with it)"
            if out is self._dropped[3]:
                self._row(plan, out, best, f"dropped {name}: {verdict}", tests=name)
            else:
                self._row(plan, out, best, f"{name}: {verdict}; measured again without {self._dropped[1]}", name)
        if self._dropped:
            self._adopt(self._dropped[2], self._dropped[3].ratio, best)

    def _rival(self, rival: dict, stack: dict) -> Generator[Comparison, list[Outcome], None]:
        """A rival stack against the best plan so far: it takes over only when established faster."""
        reference = dict(self.best)
        made_way = ", ".join(name for name in stack if name not in rival) or "nothing"
        (out,) = yield Comparison(reference, [rival], (1 - self.margin,), f"the rival stack {plan_label(rival)} "
                                  f"against {plan_label(reference) if reference else 'the plain loop'}")
        row = self._row(rival, out, reference, f"a rival stack: {made_way} made way for "
                                               f"{', '.join(n for n in rival if n not in stack)}")
        if out.usable and established(out.ratio, self.margin):
            self._adopt(rival, out.ratio, reference)
            row.decision += f"; {out.ratio} of {row.against}'s step: chosen"
        elif out.usable:
            row.decision += f"; {out.ratio} of {row.against}'s step: not established faster, not chosen"

    def _costly(self, candidate: dict) -> Generator[Comparison, list[Outcome], None]:
        """A costly accelerator (compile) on top of the best plan, kept when its warm-up pays back within the run."""
        reference, name = dict(self.best), "+".join(candidate)
        plan = {**reference, **candidate}
        on = plan_label(reference) if reference else "the plain loop"
        (out,) = yield Comparison(reference, [plan], (1 - self.margin / 2, 1 - self.margin), f"{name} on top of {on}",
                                  costly=True)
        if self.first_measured is None:
            self.first_measured = out.status != "not measured"
        if not out.usable:
            self._row(plan, out, reference, "", tests=name)
            return
        ratio, expected = out.ratio, self.expected_steps
        faster, break_even, keep = payback(ratio, out.reference_s or 0.0, out.warmup_s, self.margin, expected)
        if not faster:
            decision = f"{name}: not faster on top of {on} ({ratio})"
        elif not keep:
            decision = (f"{name}: {ratio.estimate:.2f} of the step, but its {out.warmup_s:.1f} s warm-up pays back "
                        f"after {break_even} steps, beyond the run's {expected}")
        else:
            decision = (f"{name}: kept, {ratio.estimate:.2f} of the step; its {out.warmup_s:.1f} s warm-up pays back "
                        f"after {break_even} steps" + (f" (run: {expected})" if expected else ""))
        self._row(plan, out, reference, decision, tests=name)
        if keep:
            self._adopt(plan, ratio, reference)

    def why(self, measured_in: str = "") -> str:
        """The one-line why of the choice."""
        measured = [r for r in self.rows[1:] if r.ratio]
        unmeasured = [r.name for r in self.rows[1:] if r.status == "not measured"]
        extra = "".join(f"; {n}" for n in self.notes)
        if self.best:
            return f"{plan_label(self.best)}: {self.vs_plain:.2f}x the plain loop's step ({self.best_why}){measured_in}{extra}"
        if unmeasured and not measured:
            return (f"the budget ran out before any candidate was compared with the plain loop ({', '.join(unmeasured)}"
                    f" not measured): the plain loop is kept (the empty plan), untested; give a larger budget_s{extra}")
        if self.noisy:
            return (f"the machine was too noisy to establish a plan faster than the plain loop ({len(measured)} "
                    f"compared): the plain loop is kept (the empty plan); run again when it is quieter{extra}")
        return (f"no plan was faster than the plain loop by more than {self.margin:.0%} with 95% confidence "
                f"({len(measured)} compared{measured_in}): the plain loop is kept (the empty plan){extra}")
