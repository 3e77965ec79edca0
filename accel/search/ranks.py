"""What plan="auto" in your loop needs under a launcher: every rank runs the same plan at every step.

DDP and FSDP need every rank in the same collectives: a rank whose clock said "faster" would switch while another did
not, and both would hang (or train apart). So a chunk's times are the slowest rank's (``RankAgreement.chunk``: a data-
parallel step is as slow as its slowest rank), any rank's non-finite loss counts, and every decision read from a
rank's own clock or folder (the deadline, a warm-up's fit, the cache's answer) is rank 0's (``decide``). ``GroupHold``
keeps the process group across the search's plan switches (each switch closes a run, and the group is a layered
setting the last run leaving it would destroy). In a single process both make no collective.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from accel.distributed.data_parallel import DEVICE_BACKEND
from accel.distributed.group import BACKEND_DEVICE, join_group
from accel.hardware.launcher import launcher_environment
from accel.measure import plan_label
from accel.run.journal import Journal
from accel.search import distribution

Decision = TypeVar("Decision")


class RanksDiverged(RuntimeError):
    """The ranks did not run the same chunk: what they measured cannot be compared (a bug in the caller)."""


@dataclass(frozen=True)
class ChunkTimes:
    """What one rank measured over a chunk: its timed seconds, each timed step, whether a loss was not finite."""

    seconds: float
    step_s: tuple[float, ...] = ()
    nonfinite: bool = False


class RankAgreement:
    """The collectives that keep a search's ranks in step (``group`` None: a single process, no collective)."""

    def __init__(self, group: Any = None):
        self.group = group
        self.world_size = torch.distributed.get_world_size(group) if group is not None else 1
        self.rank = torch.distributed.get_rank(group) if group is not None else 0

    @classmethod
    def current(cls) -> RankAgreement:
        """Over the default group when one of several ranks is initialized; else the single-process one."""
        dist = torch.distributed
        several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        return cls(dist.group.WORLD if several else None)

    def _device(self) -> torch.device:
        kind = BACKEND_DEVICE.get(torch.distributed.get_backend(self.group), "cpu")
        return torch.device("cpu") if kind == "cpu" else torch.device(kind, getattr(torch, kind).current_device())

    def _max(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self._device())
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return tensor.cpu().tolist()

    def chunk(self, times: ChunkTimes) -> ChunkTimes:
        """The chunk as the slowest rank saw it, step by step, on every rank; RanksDiverged when the ranks timed a
        different number of steps (they did not run the same chunk)."""
        if self.group is None:
            return times
        steps = len(times.step_s)
        if self._max([steps, -steps]) != [steps, -steps]:
            raise RanksDiverged("the ranks timed different numbers of steps in one chunk: every rank must run the "
                                "same plan for the same steps")
        seconds, nonfinite, *step_s = self._max([times.seconds, float(times.nonfinite), *times.step_s])
        return ChunkTimes(seconds, tuple(step_s), nonfinite > 0)

    def any_true(self, flag: bool) -> bool:
        return bool(flag) if self.group is None else self._max([float(flag)])[0] > 0

    def slowest(self, seconds: float) -> float:
        return float(seconds) if self.group is None else self._max([float(seconds)])[0]

    def decide(self, decision: Decision) -> Decision:
        """Rank 0's decision (any picklable value) on every rank; the others' arguments are ignored."""
        if self.group is None:
            return decision
        box = [decision if self.rank == 0 else None]
        torch.distributed.broadcast_object_list(box, src=torch.distributed.get_global_rank(self.group, 0),
                                                group=self.group, device=self._device())
        return box[0]

    def past(self, deadline: float, now: float) -> bool:
        """Whether the budget's deadline has passed, by rank 0's clock."""
        return self.decide(now >= deadline)


class GroupHold:
    """Holds the launcher's process group across a search's plan switches, through the same layered setting ddp and
    fsdp join it by (accel.distributed.group.join_group); ``release`` lets go, and the group leaves if accel joined it
    and no open run has it. A group your script joined is yours: not held, and it stays."""

    def __init__(self, backend: str = "gloo", timeout_s: float = 600):
        self.backend, self.timeout_s, self.journal, self.held = backend, timeout_s, Journal(), False

    def acquire(self) -> GroupHold:
        launch = launcher_environment()
        if not self.held and launch is not None and launch.world_size > 1:
            join_group(self.journal, launch, self.backend, self.timeout_s)
            self.held = True
        return self

    def release(self) -> None:
        self.journal.rollback()
        self.held = False

    def __enter__(self) -> GroupHold:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def in_step(launch, model, optimizer, device: torch.device, settings, notes: list[str]):
    """(the plan part every candidate carries: ddp, or fsdp when the state does not fit a rank; the group held;
    the agreement). A single process: nothing carried, nothing held, no collective."""
    if launch is None or launch.world_size <= 1:
        return {}, GroupHold(), RankAgreement(None)
    carried, _ = distribution.choose(model, optimizer, device, launch.world_size, launch.local_world_size,
                                     settings.memory_per_rank)
    hold = GroupHold(DEVICE_BACKEND.get(device.type, "gloo")).acquire()
    notes.append(f"a launched job of {launch.world_size} ranks: every plan measured ran with {plan_label(carried)} (by "
                 "memory fit), the same plan on every rank at every step, timed by the slowest rank and decided by "
                 "rank 0")
    return carried, hold, RankAgreement.current()
