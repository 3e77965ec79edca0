"""What an accelerator declares on its class, besides its hooks: its ``Stage`` (where a plan applies it), the
``Capability`` tokens its ``provides``/``after``/``before``/``conflicts`` name, and its ``Keeps`` card (what it
keeps of the user's training). Plain values, importable by anything that reads a declaration."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Stage(enum.IntEnum):
    """What an accelerator does; the library applies stages in this order, whatever the user wrote."""

    ENVIRONMENT = 0  # process state: threads, affinity, OpenMP variables
    DATA = 1  # how batches are loaded and moved
    SURGERY = 2  # changes the model's structure (pruning)
    KERNELS = 3  # swaps kernels, layouts or how modules run (IPEX, channels_last, fused optimizers, recompute)
    PRECISION = 4  # autocast and loss scaling
    STEP = 5  # how gradients become an update: accumulation, clipping
    DISTRIBUTION = 6  # process groups and wrappers (DDP)
    COMPILATION = 7  # torch.compile, always last and outermost


class Capability(str, enum.Enum):
    """What an accelerator provides, for another's ``after``/``before``/``conflicts`` (a checked name, not a
    free string: ``register`` refuses a dotted token that is not one of these), and what a search reads instead of
    names: ``data.loader`` (a rebuilt loader: it changes only between epochs), ``model.distributed`` (a wrapper
    every rank runs together), ``model.copy`` (it trains a copy of the model, so a search in your loop cannot
    switch it out again) and ``setup.costly`` (its first step builds what later steps reuse: tried last)."""

    DATA_LOADER = "data.loader"
    DATA_SHARD = "data.shard"
    GRADIENTS_CLIP = "gradients.clip"
    MODEL_COMPILE = "model.compile"
    MODEL_COPY = "model.copy"
    MODEL_DISTRIBUTED = "model.distributed"
    MODEL_KERNELS = "model.kernels"
    MODEL_LAYOUT = "model.layout"
    MODEL_RECOMPUTE = "model.recompute"
    MODEL_SHARDED = "model.sharded"
    MODEL_STRUCTURE = "model.structure"
    OPTIMIZER_UPDATE = "optimizer.update"
    PRECISION_AUTOCAST = "precision.autocast"
    PRECISION_LOSS_SCALING = "precision.loss_scaling"
    PROCESS_THREADS = "process.threads"
    SETUP_COSTLY = "setup.costly"
    STEP_SCHEDULE = "step.schedule"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:  # in messages, the token as a plan file or another accelerator writes it
        return repr(self.value)


@dataclass(frozen=True)
class Keeps:
    """What an accelerator keeps of the user's training: its card, checked by accel.testing.check_equivalence.

    weights: "exact" (bit for bit), "float" (the same math in another order: rtol/atol after a few steps),
    "tolerance" (lower precision: the losses within loss_rtol, the weights within rtol/atol), or "changed"
    (a declared change, e.g. pruning; only the structural promises are compared).
    Everything else is always compared: the batches the loop saw, parameter names, shapes, requires_grad,
    ties, the output's shape, and the user's objects left unchanged.
    """

    weights: str = "exact"
    rtol: float = 0.0
    atol: float = 0.0
    loss_rtol: float = 0.0
    structure: bool = True  # same parameter names and shapes (False: surgery)
    note: str = ""  # what it may change, in words


EXACT = Keeps()
SAME_MATH = Keeps("float", rtol=1e-3, atol=1e-4, loss_rtol=1e-4, note="the same math, summed in another order")
