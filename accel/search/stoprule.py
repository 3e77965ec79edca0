"""The stop rule of plan="auto" in your loop: a candidate hopelessly slower than its reference beside it stops
mid-chunk.

Why: bf16 emulated on a CPU without it was 14x slower, and a short run cannot afford the turns a verdict needs. Why
paired: against the plain loop's fastest round ever, a step time that grows (a curriculum) or a machine that gets busy
made a plan that changes nothing look 3x slower. The reference is its step beside the chunk, and the evidence the
chunk's fastest timed step: one spike of load cannot stop a candidate.
"""
from __future__ import annotations

from accel.search.settings import SLOW_STOP

STOP_COST_S = 0.5  # a candidate is stopped only once its slowness cost this much in one chunk
LEAST_STEPS = 2  # timed steps of the chunk before it can be stopped (one is a spike as much as a verdict)


def beside(reference: dict[int, float], round_index: int) -> float | None:
    """The reference's step beside a chunk of this round (round -> seconds per step): that round's when it ran, else
    its latest before; None before it ran at all."""
    earlier = [r for r in reference if r <= round_index]
    return reference[max(earlier)] if earlier else None


def stop_reason(fastest_s: float, timed: int, reference_s: float | None, against: str = "the plain loop") -> str:
    """Why the candidate stops now ("" when it does not): every timed step of its chunk so far (``fastest_s``, the
    fastest of ``timed``; on an accelerator their mean) over SLOW_STOP reference steps, at a cost over STOP_COST_S."""
    if reference_s is None or reference_s <= 0 or timed < LEAST_STEPS or fastest_s <= SLOW_STOP * reference_s \
            or (fastest_s - reference_s) * timed <= STOP_COST_S:
        return ""
    return (f"its steps took {fastest_s:.3f} s or more, over {SLOW_STOP:g}x {against}'s {reference_s:.3f} s in the "
            "round beside it")
