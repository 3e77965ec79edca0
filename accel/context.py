"""The state accelerators read and change, in stage order, on the way from the user's objects to a Run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from accel.hardware import Hardware

if TYPE_CHECKING:
    from accel.plan import Plan


@dataclass
class Context:
    """What the plan works on. Accelerators replace model/optimizer/loader here, never in place of the user's.

    batch_transforms run on every batch after it reaches the device (channels_last adds one);
    ``unwrappers`` peel wrappers (DDP, compile) off the model, outermost first, for ``Run.unwrap``.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    loader: Any
    device: torch.device
    hardware: Hardware
    plan: Plan
    autocast_dtype: torch.dtype | None = None
    scaler: Any = None
    non_blocking: bool = False
    batch_transforms: list[Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        """Whether the plan holds an accelerator of this name (for conflicts and cooperation)."""
        return name in self.plan.names()

    def get(self, name: str):
        return self.plan.get(name)
