"""Setup: a user's training code as check_equivalence trains it, twice, from the same seed: the objects, the
step, the loop's behaviour around the steps and the user's evaluation."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from accel.run import Run
from accel.workloads.loops import Held, Loop


@dataclass
class Setup:
    """A user's training objects; step_fn(run, batch) -> loss when batches are not (inputs, targets); the loop's
    behaviour around the steps; evaluate(model) -> the model's output on held-out data (for validation, EMA)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None  # None: the loop updates the weights itself
    loader: Any
    step_fn: Callable[[Run, Any], torch.Tensor] | None = None
    loop: Loop = field(default_factory=Loop)
    evaluate: Callable[[torch.nn.Module], torch.Tensor] | None = None

    def held(self, run: Run | None = None) -> Held:
        """What the loop holds: the user's objects, or where the run's report names one stale, the run's."""
        stale = run.report.stale if run is not None else {}
        return Held(run.unwrap() if "model" in stale else self.model,
                    run.optimizer if "optimizer" in stale else self.optimizer, self.loader, self.evaluate)
