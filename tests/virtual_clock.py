"""A clock that moves only when told: search verdicts tested on exact step times, whatever the machine's load.

    clock = VirtualClock()
    clock.per_forward(model, 0.01)         # every forward of the model (and of its copies) costs 10 ms
    with accel.clock.use(clock):
        result = accel.tune(model, optimizer, loader, ...)

Real compute time does not count at all: a step costs what the hooks advance, so ratios are exact. Every step
must advance it (a step of 0 s has no ratio: give the plain model a base cost). Budgets (budget_s, deadlines) are
spent in virtual seconds only; with nothing advancing the clock they never run out, and a search then ends by its
round limits (tune's 8 rounds a comparison, the in-loop search's MAX_ROUNDS): nothing in accel waits for the clock.
"""
from __future__ import annotations

from typing import Any

from torch import nn


class VirtualClock:
    """A callable returning seconds that only ``advance`` moves; install it with accel.clock.use(clock)."""

    def __init__(self, start: float = 0.0):
        self.time = float(start)

    def __call__(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds})")
        self.time += seconds

    def per_forward(self, module: nn.Module, seconds: float) -> Any:
        """Every forward of ``module`` costs ``seconds`` (a forward pre-hook; copies of the module keep it and
        advance this same clock). Returns the hook's handle (``.remove()``)."""
        def cost(_module: nn.Module, _args: Any) -> None:
            self.advance(seconds)

        return module.register_forward_pre_hook(cost)

    def __deepcopy__(self, memo: dict) -> VirtualClock:
        return self  # a copied model's costs are read on the same clock: there is one time

    def __copy__(self) -> VirtualClock:
        return self

    def __repr__(self) -> str:
        return f"VirtualClock({self.time:g} s)"
