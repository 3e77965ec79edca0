"""The stop rule of plan="auto" in your loop: a candidate hopelessly slower than its reference beside it stops mid-chunk.

Why it exists: bf16 emulated on a CPU without it was 14x slower; a short run cannot afford the turns a verdict needs.
Why it is paired: it once compared an arm's chunk with the plain loop's fastest round ever, so a step time that grows
(a curriculum lengthening the sequences) or a machine that gets busy made a plan that does nothing look 3x slower,
and under load every candidate was stopped. Now the reference is the plain loop's step beside the chunk (the same
round's, or its latest before), and the evidence is the arm's fastest timed step of the chunk, so one spike of load
in a chunk cannot stop an arm either: it takes every timed step of the chunk over SLOW_STOP plain steps.
"""
from __future__ import annotations

from accel.search.settings import SLOW_STOP

STOP_COST_S = 0.5  # an arm is stopped early only once its slowness cost this much in one chunk
LEAST_STEPS = 2  # timed steps of the chunk before it can be stopped (one is a spike as much as a verdict)


def beside(reference: dict[int, float], round_index: int) -> float | None:
    """The reference's step beside a chunk of round ``round_index`` (round -> seconds per step): that round's when it
    has run (the plain loop goes first in every other round), else its latest before (it went last in the round
    before, or first in the one before that); None before it ran at all."""
    if round_index in reference:
        return reference[round_index]
    earlier = [r for r in reference if r < round_index]
    return reference[max(earlier)] if earlier else None


def stop_reason(fastest_s: float, timed: int, reference_s: float | None, against: str = "the plain loop") -> str:
    """Why the arm stops now ("" when it does not): every timed step of its chunk so far (``fastest_s`` is the
    fastest of ``timed``; on an accelerator, their mean) over SLOW_STOP steps of the reference beside it, and its
    slowness has cost over STOP_COST_S in this chunk already (one slow millisecond step is not enough)."""
    if reference_s is None or reference_s <= 0 or timed < LEAST_STEPS:
        return ""
    if fastest_s > SLOW_STOP * reference_s and (fastest_s - reference_s) * timed > STOP_COST_S:
        return (f"its steps took {fastest_s:.3f} s or more, over {SLOW_STOP:g}x {against}'s {reference_s:.3f} s "
                "in the round beside it")
    return ""
