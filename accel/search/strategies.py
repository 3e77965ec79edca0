"""The strategies a search can follow: user-given candidates against the baseline, or the stack of everything
minus what does not pay, then the costly ones (compile) on top when they pay back."""
from __future__ import annotations

from accel import clock
from accel.plan.contract import REGISTRY
from accel.search.remembered import remember_warmup, starts_warm
from accel.search.results import TuneRow, not_measured
from accel.search.state import Search
from accel.search.verdicts import payback, run_ahead_s, warmup_fit
from accel.measure import Ratio, Trial, plan_label
from accel.plan import Plan


def stack_of(candidates: list[dict[str, dict]]) -> tuple[dict[str, dict], list[str]]:
    """One configuration per accelerator, in order, leaving out any that conflicts with those before it."""
    stack: dict[str, dict] = {}
    left_out = []
    for candidate in candidates:
        merged = {**stack, **{k: v for k, v in candidate.items() if k not in stack}}
        if merged == stack:
            continue
        _, problems = Plan.parse(merged)
        if problems:
            left_out.append(f"{plan_label(candidate)} ({problems[0].message})")
        else:
            stack = merged
    return stack, left_out


def rival_stacks(candidates: list[dict[str, dict]]) -> list[dict[str, dict]]:
    """For each candidate the stack left out for a conflict, the stack with it first: the members it conflicts
    with make way (ipex's fused update and fused_optimizer's). Measured beside the stack, so a conflict never
    decides by list order which of the two is tried (on an AMX Xeon, IPEX + bf16 stepped resnet18 at 64x64 in
    0.65-0.74 of channels_last+fused_optimizer+amp's time, benchmarks/bench_ipex.py; fused_optimizer came first)."""
    stack, _ = stack_of(candidates)
    rivals: list[dict[str, dict]] = []
    for candidate in candidates:
        if candidate.keys() <= stack.keys():
            continue
        rival, _ = stack_of([candidate, *candidates])
        if candidate.keys() <= rival.keys() and rival not in rivals:
            rivals.append(rival)
    return rivals


def given(search: Search, plans: list[dict[str, dict]]) -> Trial | None:
    """User-given candidates: each compared with the baseline; the fastest established one wins."""
    winners = []
    for plan in plans:
        if search.left() <= 0:
            search.rows.append(not_measured(plan, "eager", "time budget"))
            continue
        trial, row, ratio = search.measure_vs_base(plan)
        if search.established(ratio):
            winners.append((ratio.estimate, trial, row))
        elif ratio is not None:
            verdict = search.verdict(ratio)
            search.notes.append(verdict)
            row.decision = "not faster by the margin" if verdict == "not faster" else "not established (noisy)"
        search.lab.retire(trial)
    if not winners:
        return None
    winners.sort(key=lambda w: w[0])
    winners[0][2].decision = "chosen"
    return winners[0][1]


def search_stacks(search: Search, candidates: list[dict[str, dict]]) -> Trial | None:
    """Everything the hardware serves, minus what does not pay; then the costly ones on top of the best."""
    costly = [c for c in candidates if any(REGISTRY[n].costly_setup for n in c)]
    cheap = [c for c in candidates if c not in costly]
    stack, left_out = stack_of(cheap)
    rivals = rival_stacks(cheap)
    if left_out:
        measured = " (each measured in a rival stack, where what it conflicts with makes way)" if rivals else ""
        search.notes.append("left out of the stack: " + "; ".join(left_out) + measured)
    best: Trial | None = None
    best_ratio: Ratio | None = None
    if stack:
        trial, row, ratio = search.measure_vs_base(stack)
        row.decision = "the full stack"
        if trial.status == "ready" and row.status == "measured":
            best, best_ratio = trial, ratio
        else:
            search.lab.retire(trial)
            if len(stack) > 1:  # one member spoils it (fails, too slow, off in loss): measure each alone
                row.decision = "the full stack: cannot be timed; each alone instead"
                best, best_ratio = _singles_then_stack(search, [{k: v} for k, v in stack.items()])
    incumbent, incumbent_ratio = best, best_ratio
    if best is not None and len(best.plan) > 1 and search.time_left():
        smaller = _drop_what_does_not_pay(search, best)
        if smaller is not best:  # confirm the smaller stack against the baseline before giving up the full one
            ratio = search.compare(search.base, smaller, (1.0, 1 - search.margin))
            row = next(r for r in reversed(search.rows) if r.plan == smaller.plan)
            row.vs_baseline = round(ratio.estimate, 4)
            if search.established(ratio) or not search.established(best_ratio):
                row.decision += f"; vs eager {ratio}"
                search.lab.retire(best)
                incumbent, incumbent_ratio = smaller, ratio
            else:
                row.decision += f"; vs eager {ratio}, not established: the full stack stays"
                search.lab.retire(smaller)
    if not search.established(incumbent_ratio):
        if incumbent_ratio is not None:
            search.notes.append(search.verdict(incumbent_ratio))
        if incumbent is not None:
            search.lab.retire(incumbent)
        incumbent = None
    for rival in rivals:
        incumbent = _try_rival(search, incumbent, rival, stack)
    for candidate in costly:
        incumbent = _try_costly(search, incumbent, candidate)
    return incumbent


def _try_rival(search: Search, incumbent: Trial | None, rival: dict[str, dict], stack: dict[str, dict]) -> Trial | None:
    """A rival stack (rival_stacks) against the baseline, and against the best plan so far: it takes over only
    when established faster than both."""
    made_way = ", ".join(name for name in stack if name not in rival) or "nothing"
    if not search.time_left():
        search.rows.append(not_measured(rival, "eager", f"time budget (a rival stack: {made_way} made way)"))
        return incumbent
    trial, row, ratio = search.measure_vs_base(rival)
    row.decision = f"a rival stack: {made_way} made way for {', '.join(n for n in rival if n not in stack)}"
    if not search.established(ratio):
        search.lab.retire(trial)
        return incumbent
    if incumbent is not None:
        against = search.compare(incumbent, trial, (1 - search.margin,))
        if not against.below(1 - search.margin):
            row.decision += f"; {against} of {incumbent.name}'s step: not established faster, not chosen"
            search.lab.retire(trial)
            return incumbent
        row.decision += f"; {against} of {incumbent.name}'s step"
        search.lab.retire(incumbent)
    return trial


def _drop_what_does_not_pay(search: Search, full: Trial) -> Trial:
    """The stack without each member, all measured in the same interleaved rounds as the stack itself; every
    member whose removal does not slow the stack by more than the margin is dropped (their removal together is
    checked against the stack when it is more than one)."""
    arms: list[tuple[str, Trial, TuneRow]] = []
    for name in list(full.plan):
        if not search.time_left():
            break
        smaller = {k: v for k, v in full.plan.items() if k != name}
        trial = search.lab.trial(smaller)
        row = search.row_of(trial, against=full.name, tests=name)
        if search.usable(trial, row):
            arms.append((name, trial, row))
        else:
            row.decision = f"kept {name}: the stack without it cannot be timed"
            search.finish_row(row, trial)
            search.lab.retire(trial)
    if not arms:
        return full
    ratios = search.lab.rounds([t for _, t, _ in arms], full, (1 + search.margin,), deadline=search.deadline)
    dropped: list[tuple[float, str, Trial]] = []
    for name, trial, row in arms:
        ratio = ratios[id(trial)]
        search.finish_row(row, trial, ratio)
        if trial.status != "ready":
            row.decision = f"kept {name}: the stack without it broke"
        elif ratio.estimate <= 1 + search.margin:
            row.decision = f"dropped {name}: it does not pay ({1 / ratio.estimate:.2f} of the time with it)"
            dropped.append((ratio.estimate, name, trial))
        else:
            row.decision = f"kept {name}: {1 / ratio.estimate:.2f} of the time with it"
    dropped.sort(key=lambda d: d[0])
    chosen = dropped[0][2] if dropped else full
    together = None
    if len(dropped) > 1 and search.time_left():  # dropping them together may cost what each alone did not
        together = search.lab.trial({k: v for k, v in full.plan.items() if k not in {n for _, n, _ in dropped}})
        row = search.row_of(together, against=full.name)
        if together.plan and search.usable(together, row):
            ratio = search.compare(full, together, (1 + search.margin,))
            search.finish_row(row, together, ratio)
            names = ", ".join(n for _, n, _ in dropped)
            if together.status == "ready" and ratio.estimate <= 1 + search.margin:
                row.decision, chosen = f"dropped {names} together: not slower", together
            else:
                row.decision = f"without {names} together: slower; dropped only {dropped[0][1]}"
    for trial in [*(t for _, t, _ in arms), *([together] if together is not None else [])]:
        if trial is not chosen:
            search.lab.retire(trial)
    return chosen  # the full stack itself is the caller's to keep or retire


def _singles_then_stack(search: Search, singles: list[dict[str, dict]]) -> tuple[Trial | None, Ratio | None]:
    """Each candidate against the baseline; the stack of those that helped, measured against it too."""
    helped: dict[str, dict] = {}
    for plan in singles:
        if search.left() <= 0:
            search.rows.append(not_measured(plan, "eager", "time budget"))
            continue
        trial, row, ratio = search.measure_vs_base(plan)
        if ratio is not None and ratio.estimate < 1.0:
            helped.update(plan)
            row.decision = "helps alone"
        search.lab.retire(trial)
    if not helped or search.left() <= 0:
        return None, None
    trial, row, ratio = search.measure_vs_base(helped)
    row.decision = "the stack of what helped alone"
    if row.status == "measured":
        return trial, ratio
    search.lab.retire(trial)
    return None, None


def _try_costly(search: Search, incumbent: Trial | None, candidate: dict[str, dict]) -> Trial | None:
    """A costly accelerator (compile) on top of the best plan so far, kept when it pays back within the run."""
    reference = incumbent or search.base
    plan = {**reference.plan, **candidate}
    warm = starts_warm(candidate, search.model, search.device, search.cpu_model)
    fit = warmup_fit(candidate, search.facts, search.cache, warm, search.left(),
                     run_ahead_s(search.expected_steps, 0, reference.median_s or reference.settled_step_s))
    if not fit.fits:
        search.cut_short = True
        search.rows.append(not_measured(plan, reference.name, fit.reason))
        return incumbent
    if fit.past_budget:  # its warm-up and its rounds, on the run's allowance
        search.deadline = clock.now() + 2 * fit.allowance_s
    trial = search.lab.trial(plan)
    row = search.row_of(trial, against=reference.name, tests=next(iter(candidate)))
    if row.status != "measured":
        search.finish_row(row, trial)
        search.lab.retire(trial)
        return incumbent
    ratio = search.compare(reference, trial, (1 - search.margin,))
    search.finish_row(row, trial, ratio)
    if trial.status != "ready":
        return incumbent
    extra_warmup = trial.warmup_s - reference.warmup_s
    remember_warmup(candidate, search.facts, search.cache, extra_warmup, warm)
    faster, break_even, pays = payback(ratio, reference.median_s or 0.0, extra_warmup, search.margin,
                                       search.expected_steps)
    name = "+".join(candidate)
    if not faster:
        row.decision = f"{name}: not faster on top of {reference.name} ({ratio})"
    elif break_even is None or not pays:
        row.decision = (f"{name}: {ratio.estimate:.2f} of the step, but its {extra_warmup:.1f} s warm-up pays back "
                        f"after {break_even} steps, beyond the run's {search.expected_steps}")
    else:
        row.decision = (f"{name}: kept, {ratio.estimate:.2f} of the step; its {extra_warmup:.1f} s warm-up pays back "
                        f"after {break_even} steps" + (f" (run: {search.expected_steps})" if search.expected_steps
                                                        else ""))
    if fit.past_budget:  # said in its row, whatever its verdict (a note would show only beside a chosen plan)
        row.decision += f"; {fit.reason}"
    row.vs_baseline = round(ratio.estimate * ((reference.median_s / search.base.median_s)
                                              if reference is not search.base and search.base.median_s else 1.0), 4)
    if pays:
        if incumbent is not None:
            search.lab.retire(incumbent)
        return trial
    search.lab.retire(trial)
    return incumbent
