"""Every loop behaviour of the zoo, by name (LOOPS): ``Case(loop="onecycle").build()`` runs with one of them.

    result = check_equivalence(["fused_optimizer"], Case(loop="onecycle").build)
"""
from __future__ import annotations

from accel.testing.trace import Held, Loop
from zoo.loops.between_steps import Ema, FrozenNorm, Hooks, OwnCheckpoint, Swa, Validation
from zoo.loops.driving import Again, HalfMigrated, OwnAccumulation, TwoModels
from zoo.loops.habits import InplaceInput, ManualUpdate
from zoo.loops.schedules import LambdaDecay, LrWrites, OneCycle, Plateau, Scheduler, Warmup
from zoo.loops.unfreezing import AddGroup, LateGroup, Unfreeze, layer
from zoo.loops.wrapping import Precompiled, SelfSharding, Stream

__all__ = ["BY_HAND", "LOOPS", "AddGroup", "Again", "Ema", "FrozenNorm", "HalfMigrated", "Held", "Hooks",
           "InplaceInput", "LambdaDecay",
           "LateGroup", "Loop", "LrWrites", "ManualUpdate", "OneCycle", "OwnAccumulation", "OwnCheckpoint", "Plateau",
           "Precompiled",
           "Scheduler", "SelfSharding", "Stream", "Swa", "TwoModels", "Unfreeze", "Validation", "Warmup", "layer"]

# the zoo's own flags on a loop: holds_from_before (it keeps an object built before accelerate(), a scheduler) and
# changes_inputs (it changes a batch tensor in place between forward and backward); unset: False
LOOPS: dict[str, type[Loop]] = {loop.name: loop for loop in (
    Loop, OneCycle, LambdaDecay, Plateau, Warmup, LrWrites, Unfreeze, AddGroup, LateGroup, OwnCheckpoint, Validation,
    FrozenNorm, Hooks, Ema, Swa, Again, HalfMigrated, OwnAccumulation, TwoModels, Stream, Precompiled, InplaceInput)}
BY_HAND: dict[str, type[Loop]] = {ManualUpdate.name: ManualUpdate}  # loops with no optimizer (Case(optimizer="none"))
