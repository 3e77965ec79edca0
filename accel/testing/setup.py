"""A user's training code as check_equivalence trains it, twice, from the same seed: the objects (``Setup``), what
the loop holds (``Held``) and what it does around its steps (``Loop``: one real behaviour each, a scheduler, a
learning-rate write, an EMA, accelerate() again...; tests/zoo/loops has one of each)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from accel.measure import TrainStep
from accel.run import Run


@dataclass
class Held:
    """The objects the user's loop holds after accelerate(), and the user's own evaluation of a model."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    evaluate: Callable[[nn.Module], torch.Tensor]


class Loop:
    """A plain loop: nothing but the steps. Subclasses act at the same points every time: ``wrap`` (the model and
    loader first), ``prepare`` (before accelerate()), ``start`` (after it), ``before`` (may return a new run) and
    ``after`` each ``step``, ``finish`` once closed; ``observed``: what the harness compares beside the weights."""

    name: ClassVar[str] = "plain"

    def wrap(self, model: nn.Module, loader: Any) -> tuple[nn.Module, Any]:
        return model, loader

    def prepare(self, held: Held) -> None:
        pass

    def step(self, index: int, run: Run, held: Held, batch: Any,
             loss_of: Callable[[Run, Any], torch.Tensor]) -> torch.Tensor:
        """One batch, as the README loop writes it: the loss under run.autocast(), run.backward(loss), run.step()."""
        return TrainStep(step_fn=loss_of)(run, batch)

    def finish(self) -> None:
        pass

    def start(self, held: Held, run: Run) -> None:
        pass

    def before(self, step: int, held: Held, run: Run) -> Run:
        return run

    def after(self, step: int, held: Held, run: Run, loss: float) -> None:
        pass

    def observed(self) -> dict[str, torch.Tensor]:
        return {}


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
