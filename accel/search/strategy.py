"""The one search, in your loop (turns.py) and apart (offline.py): comparisons, each a reference and its challengers
measured in the same interleaved rounds, and the verdicts that lead from one to the next.

It measures the stack the hardware predicts against the plain loop first: chosen as soon as the interval says it
pays, else dropped (then each candidate alone, and what helped, together). The budget left goes to the plan's
ablations, rival stacks and costly candidates on top (docs/measurement.md). An executor answers a comparison it has no
budget for with outcomes "not measured", so the sequence always runs to its end.
"""
from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

from accel.measure import Ratio, paired, plan_label
from accel.plan import Plan
from accel.search.results import Arm, Comparison, TuneRow
from accel.search.settings import Auto


def established(ratio: Ratio | None, margin: float) -> bool:
    """Faster than what it is compared with, with 95% confidence, and by more than the margin."""
    return ratio is not None and bool(ratio.samples) and ratio.below(1.0) and ratio.estimate <= 1 - margin


def words(ratio: Ratio, margin: float) -> str:
    """'faster', 'not faster' (clearly not by the margin) or 'noisy' (the rounds cannot tell)."""
    if established(ratio, margin):
        return "faster"
    return "not faster" if ratio.above(1 - margin) or ratio.estimate > 1 else "noisy"


def stack_of(candidates: list[dict[str, dict]]) -> tuple[dict[str, dict], list[str]]:
    """One configuration per accelerator, in order, leaving out any that conflicts with those before it."""
    stack: dict[str, dict] = {}
    left_out = []
    for candidate in candidates:
        merged = {**stack, **{k: v for k, v in candidate.items() if k not in stack}}
        problems = Plan.parse(merged)[1] if merged != stack else []
        if problems:
            left_out.append(f"{plan_label(candidate)} ({problems[0].message})")
        else:
            stack = merged
    return stack, left_out


def rival_stacks(candidates: list[dict[str, dict]]) -> list[dict[str, dict]]:
    """For each candidate left out of the stack for a conflict, the stack with it first (what it conflicts with makes
    way): list order must not decide between them."""
    stack, rivals = stack_of(candidates)[0], []
    for candidate in candidates:
        rival = stack_of([candidate, *candidates])[0]
        if not candidate.keys() <= stack.keys() and candidate.keys() <= rival.keys() and rival not in rivals:
            rivals.append(rival)
    return rivals


class Search:
    """The decisions of one search and its table: ``comparisons()`` yields what to measure next and is sent each
    comparison's outcomes (one per challenger); ``best`` is the plan chosen so far ({}: the plain loop)."""

    def __init__(self, settings: Auto, kinds: dict[str, Any]):
        """``kinds``: the candidates by kind (settings.candidates_of)."""
        self.candidates, self.costly, self.given = kinds["stepwise"], kinds["costly"], kinds["given"]
        self.margin, self.expected_steps = settings.margin, settings.expected_steps
        self.rows = [TuneRow("eager", {}, "measured", decision="baseline (the plain loop)")]
        self.notes: list[str] = []
        self.best: dict[str, dict] = {}
        self.vs_plain, self.path = 1.0, []  # the best plan's step over the plain loop's; the ratios that led there
        self.decided = self.noisy = False  # the first verdict is in; it was one the rounds could not reach
        self.first_measured: bool | None = None  # whether the first verdict's candidates were all measured

    @property
    def established(self) -> bool:
        """An answer to remember: a plan established faster, or none with the first verdict measured and decided."""
        return bool(self.best) or (not self.noisy and self.first_measured is not False)

    @property
    def gain(self) -> str:
        """The best plan's step over the plain loop's, with its interval, or each ratio that led to it."""
        ratio = self.path[0][1] if len(self.path) == 1 else None
        how = ("; ".join(how for how, _ in self.path) if ratio is None else
               f"{ratio.low:.2f}-{ratio.high:.2f}, 90% interval" if ratio.rounds > 1 else "1 round")
        return f"{self.vs_plain:.2f}x the plain loop's step ({how})"

    def _row(self, plan: dict, out: Arm, reference: dict, decision: str, tests: str = "") -> TuneRow:
        ratio = out.ratio if out.ratio.samples else None
        to_plain = self.vs_plain if reference == self.best else 1.0 if not reference else None
        row = TuneRow(plan_label(plan), plan, out.status, plan_label(reference), ratio.to_dict() if ratio else None,
                      round(ratio.estimate * to_plain, 4) if ratio and to_plain else None, reason=out.reason,
                      decision="; ".join(w for w in (decision, out.note) if w), tests=tests, **out.fields)
        self.rows.append(row)
        return row

    def _adopt(self, plan: dict, ratio: Ratio, reference: dict) -> None:
        """The best plan so far; its step over the plain loop's, through the reference it was compared with."""
        self.vs_plain = ratio.estimate * (self.vs_plain if reference else 1.0)
        dropped, added = "+".join(sorted(reference.keys() - plan.keys())), "+".join(sorted(plan.keys() - reference))
        how = (f"{plan_label(plan)} {ratio}" if not reference else f"without {dropped}: {ratio}" if not added else
               f"{added} on top: {ratio}" if not dropped else f"{plan_label(plan)}: {ratio}")
        self.best, self.path = dict(plan), [*(self.path if reference else []), (how, ratio)]

    def comparisons(self) -> Generator[Comparison, list[Arm], None]:
        vs_plain = (1 - self.margin,)
        stack, left_out = stack_of(self.candidates) if not self.given else ({}, [])
        rivals = rival_stacks(self.candidates) if not self.given else []
        if left_out:
            self.notes.append("left out of the stack: " + "; ".join(left_out) + (
                " (each measured in a rival stack, where what it conflicts with makes way)" if rivals else ""))
        first = [stack] if stack else self.candidates if self.given else []
        if first:
            what = f"the stack the hardware predicts ({plan_label(stack)})" if stack else "each candidate"
            outs = yield Comparison({}, first, vs_plain, what + " against the plain loop")
            self.first_measured = all(o.status != "not measured" for o in outs)
            self.noisy = any(o.usable and words(o.ratio, self.margin) == "noisy" for o in outs)
            self._fastest(first, outs, "the stack the hardware predicts" if stack else "")
            if stack and not self.best and len(stack) > 1 and self.first_measured and not self.noisy:  # dropped
                self.decided = True
                singles = [{k: v} for k, v in stack.items()]
                outs = yield Comparison({}, singles, vs_plain, "each candidate alone against the plain loop")
                helped = self._fastest(singles, outs, "alone")
                if len(helped) > 1:
                    together = {k: v for plan in helped for k, v in plan.items()}
                    outs = yield Comparison({}, [together], vs_plain, "what helped alone, together, against the "
                                                                      "plain loop")
                    if outs[0].usable and outs[0].ratio.estimate < self.vs_plain:
                        self._fastest([together], outs, "what helped alone, together")
                    else:
                        self._row(together, outs[0], {}, "what helped alone, together: not chosen")
        self.decided = True
        while len(self.best) > 1 and not self.given and (yield from self._ablations()):
            pass
        for rival in rivals:
            yield from self._rival(rival, stack)
        for candidate in self.costly:
            yield from self._costly(candidate)

    def _fastest(self, plans: list[dict], outs: list[Arm], what: str) -> list[dict]:
        """The fastest established plan is chosen, unless one with fewer accelerators is not shown slower."""
        said = {"faster": "faster, not the fastest", "not faster": "not faster by the margin",
                "noisy": "not established (noisy)"}
        rows = [self._row(plan, out, {}, ": ".join(w for w in (what, said[words(out.ratio, self.margin)]
                                                                 if out.usable else "") if w))
                for plan, out in zip(plans, outs)]
        won = [(o.ratio.estimate, i) for i, o in enumerate(outs) if o.usable and established(o.ratio, self.margin)]
        if not won:
            return []
        best = min(won)[1]
        fewer = [i for _, i in won if plans[i].keys() < plans[best].keys()
                 and not established(paired(outs[best].rounds, outs[i].rounds), self.margin)]
        if fewer:
            smaller = min(fewer, key=lambda i: outs[i].ratio.estimate)
            extra = "+".join(sorted(plans[best].keys() - plans[smaller].keys()))
            rows[best].decision, best = f"not needed: {extra} on top did not show it pays", smaller
        self._adopt(plans[best], outs[best].ratio, {})
        rows[best].decision = ": ".join(w for w in (what, "chosen") if w)
        return [plans[i] for _, i in sorted(won)]

    def _ablations(self) -> Generator[Comparison, list[Arm], bool]:
        """The best plan without each of its accelerators, against it: the one whose removal costs least goes when not
        shown to pay (one round, or more than the margin slower without it, keeps it). True when one went."""
        best, names, margin = self.best, list(self.best), self.margin
        trimmed = [{k: v for k, v in best.items() if k != name} for name in names]
        outs = yield Comparison(best, trimmed, (1 + margin,), f"whether each accelerator of {plan_label(best)} pays")
        drop = [(o.ratio.estimate, i) for i, o in enumerate(outs) if o.usable and o.ratio.rounds > 1
                and o.ratio.estimate <= 1 + margin and not established(Ratio([1 / s for s in o.ratio.samples]), margin)]
        dropped = min(drop)[1] if drop else None
        for i, (name, plan, out) in enumerate(zip(names, trimmed, outs)):
            share = f"{1 / out.ratio.estimate:.2f} of the time with it" if out.usable else ""
            self._row(plan, out, best, f"dropped {name}: it does not pay ({share})" if i == dropped else
                      f"{name} does not pay either ({share}): measured again without {names[dropped]}"
                      if any(i == j for _, j in drop) else f"kept {name}" + (f": {share}" if share else ""), name)
        if dropped is not None:
            self._adopt(trimmed[dropped], outs[dropped].ratio, best)
        return dropped is not None

    def _rival(self, rival: dict, stack: dict) -> Generator[Comparison, list[Arm], None]:
        """A rival stack against the best plan so far: it takes over only when established faster."""
        reference, made_way = dict(self.best), ", ".join(name for name in stack if name not in rival) or "nothing"
        (out,) = yield Comparison(reference, [rival], (1 - self.margin,), f"the rival stack {plan_label(rival)} "
                                  f"against {plan_label(reference) if reference else 'the plain loop'}")
        row = self._row(rival, out, reference, f"a rival stack: {made_way} made way for "
                                               f"{', '.join(n for n in rival if n not in stack)}")
        if out.usable:
            won = established(out.ratio, self.margin)
            row.decision += f"; {out.ratio} of {row.against}'s step: " + (
                "chosen" if won else "not established faster, not chosen")
            if won:
                self._adopt(rival, out.ratio, reference)

    def _costly(self, candidate: dict) -> Generator[Comparison, list[Arm], None]:
        """A costly accelerator (compile) on top of the best plan, kept when its warm-up pays back within the run."""
        reference, name = dict(self.best), "+".join(candidate)
        plan, on = {**reference, **candidate}, plan_label(reference) if reference else "the plain loop"
        (out,) = yield Comparison(reference, [plan], (1 - self.margin / 2, 1 - self.margin), f"{name} on top of {on}",
                                  costly=True)
        self.first_measured = out.status != "not measured" if self.first_measured is None else self.first_measured
        if not out.usable:
            self._row(plan, out, reference, "", tests=name)
            return
        ratio, expected, warmup = out.ratio, self.expected_steps, out.warmup_s  # usable: it has samples
        gain_s = (out.reference_s or 0.0) * (1 - ratio.estimate)
        break_even = math.ceil(warmup / gain_s) if gain_s > 0 else None  # the step its extra warm-up pays back at
        faster = ratio.below(1 - self.margin / 2) and ratio.estimate <= 1 - self.margin
        keep = faster and (expected is None or (break_even or math.inf) < expected)
        self._row(plan, out, reference, tests=name, decision=(
            f"{name}: not faster on top of {on} ({ratio})" if not faster else
            f"{name}: {ratio.estimate:.2f} of the step, but its {warmup:.1f} s warm-up pays back after {break_even} "
            f"steps, beyond the run's {expected}" if not keep else
            f"{name}: kept, {ratio.estimate:.2f} of the step; its {warmup:.1f} s warm-up pays back after "
            f"{break_even} steps" + (f" (run: {expected})" if expected else "")))
        if keep:
            self._adopt(plan, ratio, reference)

    def why(self, at: str = "") -> str:
        """The one-line why of the choice."""
        measured = [r for r in self.rows[1:] if r.ratio]
        unmeasured = [r.name for r in self.rows[1:] if r.status == "not measured"]
        notes = "".join(f"; {n}" for n in self.notes)
        if self.best:
            return f"{plan_label(self.best)}: {self.gain}{at}{notes}"
        if unmeasured and not measured:
            return (f"the budget ran out before any candidate was compared with the plain loop ({', '.join(unmeasured)}"
                    f" not measured): the plain loop is kept (the empty plan), untested; give a larger budget_s{notes}")
        if self.noisy:
            return (f"no plan could be shown faster than the plain loop within the budget ({len(measured)} compared, "
                    f"each interval still holding both a gain and none): the plain loop is kept (the empty plan), "
                    f"and a later run measures again{notes}")
        return (f"no plan was faster than the plain loop by more than {self.margin:.0%} with 95% confidence "
                f"({len(measured)} compared{at}): the plain loop is kept (the empty plan){notes}")
