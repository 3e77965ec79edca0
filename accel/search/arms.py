"""The arms of plan="auto" in your loop: the plans that take turns, how each ended, and which ones there are.

The arms are the plain loop, the stack of every candidate that can be switched between steps, and that stack
without each member (its ablation). A costly candidate (compile) is no arm of the rounds: it comes last, on top of
the winner (compilelast.py); a candidate that rebuilds the loader cannot change mid-epoch and is decided by the
loop's wait for data (settle.py). Plans here are ``dict[str, dict]`` (verdicts.py says why).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from accel.plan.contract import REGISTRY
from accel.search.strategies import stack_of
from accel.measure import Ratio, paired, plan_label


@dataclass
class Arm:
    """One plan taking turns: its step time per round, and how it ended."""

    plan: dict[str, dict]
    tests: str = ""  # the accelerator whose effect it shows (the stack without it), or "" for a whole stack
    rounds: dict[int, float] = field(default_factory=dict)  # round -> seconds per step in its chunk of that round
    status: str = "measuring"  # measuring, settled, slower, not faster, not needed, refused, failed, loss off (a
    # loss not finite under it and not under the plain loop), stopped early, not measured
    reason: str = ""
    first_s: float | None = None  # its first step after the first switch to it (compile lands there)
    steps: int = 0
    decided_by: str = ""  # a measured signal instead of timed turns (the loader: the loop's wait for data)

    @property
    def name(self) -> str:
        return plan_label(self.plan)

    def ratio_to(self, other: Arm) -> Ratio:
        """Its step time over the other's, from the rounds both ran."""
        return paired(self.rounds, other.rounds)

    def median_s(self) -> float | None:
        """The median of its rounds' step times, or None before it was timed."""
        ordered = sorted(self.rounds.values())
        return ordered[len(ordered) // 2] if ordered else None


@dataclass
class Candidates:
    """The candidates sorted by how they join: in the rounds, at an epoch's start, last (costly), or not in your
    loop at all (those that train a copy of your model: a switch back would leave your model behind)."""

    stepwise: list[dict[str, dict]]
    epochwise: list[dict[str, dict]]
    costly: list[dict[str, dict]]
    apart: list[dict[str, dict]] = field(default_factory=list)

    @classmethod
    def of(cls, candidates: list[dict[str, dict]]) -> Candidates:
        candidates = [c for c in candidates if c]
        apart = [c for c in candidates if any(REGISTRY[n].trains_a_copy for n in c)]
        candidates = [c for c in candidates if c not in apart]
        costly = [c for c in candidates if any(REGISTRY[n].costly_setup for n in c)]
        epochwise = [c for c in candidates if c not in costly and any(REGISTRY[n].switch_at == "epoch" for n in c)]
        return cls([c for c in candidates if c not in costly and c not in epochwise], epochwise, costly, apart)


def apart_arms(apart: list[dict[str, dict]]) -> list[Arm]:
    """What trains a copy of your model, named as not measured in your loop, and where it can be."""
    why = ("it trains a copy of your model, which a switch back to another plan would leave behind: measured apart "
           "on copies by accel.tune (or plan=accel.Auto(step_fn=...)), or ask for it in a plan")
    return [Arm(c, status="not measured", reason=why) for c in apart]


def starting_arms(stepwise: list[dict[str, dict]], given: bool, notes: list[str]) -> list[Arm]:
    """The plain loop first; then the user's candidates each, or the stack of all and the stack without each."""
    arms = [Arm({}, status="measuring")]
    if given:
        return arms + [Arm(c) for c in stepwise]
    full, left_out = stack_of(stepwise)
    if left_out:
        notes.append("left out of the stack: " + "; ".join(left_out))
    if full:
        arms.append(Arm(full))
        if len(full) > 1:
            arms += [Arm({k: v for k, v in full.items() if k != name}, tests=name) for name in full]
    return arms


def finite(losses: list[torch.Tensor]) -> bool:
    return bool(torch.isfinite(torch.cat([loss.detach().float().reshape(-1) for loss in losses])).all())
