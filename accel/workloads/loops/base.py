"""The loop side of ordinary user code: what a training loop holds and the points where it acts around its steps.

Real loops do more than step: a scheduler built before or after ``accelerate()``, learning rates written into
``param_groups``, unfreezing, their own checkpoints, validation passes, a frozen BatchNorm, hooks, an EMA, and
``accelerate()`` once per epoch. Each ``Loop`` subclass in this package is one of those behaviours, a zoo entry
that ``check_equivalence`` runs in the plain loop and in the accelerated one, with the objects the user holds:
their own model, optimizer and loader (``Held``), or, where the report names one stale, what it says to use
instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from accel.run import Run


@dataclass
class Held:
    """The objects the user's loop holds after accelerate(), and the user's own evaluation of a model."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    evaluate: Callable[[nn.Module], torch.Tensor]


class Loop:
    """A plain loop: nothing but the steps. Subclasses do what real loops do, at the same points every time.

    ``wrap`` is what the user's code does to its model and loader before anything else (compile them, stream the
    data), ``prepare`` runs before accelerate() (on the user's objects), ``start`` after it, ``before``/``after``
    around each step, whose body is ``step``; ``before`` may return a new run (accelerate() again). ``observed`` is
    what the loop built that the harness compares as well as the weights (an EMA's weights, validation outputs);
    ``finish`` runs once the run is closed.
    """

    name: ClassVar[str] = "plain"
    holds_from_before: ClassVar[bool] = False  # it keeps an object built before accelerate() (a scheduler)
    needs_optimizer: ClassVar[bool] = True  # False: it updates the weights by hand and is given no optimizer
    changes_inputs: ClassVar[bool] = False  # it changes a batch tensor in place between forward and backward

    def wrap(self, model: nn.Module, loader: Any) -> tuple[nn.Module, Any]:
        return model, loader

    def prepare(self, held: Held) -> None:
        pass

    def step(self, index: int, run: Run, held: Held, batch: Any,
             loss_of: Callable[[Run, Any], torch.Tensor]) -> torch.Tensor:
        """One batch, as the README loop writes it."""
        with run.autocast():
            loss = loss_of(run, batch)
        run.backward(loss)
        run.step()
        return loss.detach()

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
