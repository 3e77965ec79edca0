"""What plan="auto" in your loop needs under a launcher: every rank runs the same plan at every step.

DDP and FSDP need every rank in the same collectives, so the ranks cannot each follow their own search: a rank
whose clock said "faster" would switch while another did not, and both would hang in different collectives (or
train different things). So at a chunk's end:

- ``RankAgreement.chunk`` reduces what each rank measured: the chunk's timed seconds and the per-step times the
  stop rule reads, the max over ranks (a data-parallel step is as slow as its slowest rank), and whether any rank
  saw a non-finite loss;
- ``RankAgreement.decide`` hands rank 0's decision (the next plan, a verdict, settle) to every rank. Rank 0 decides
  from the agreed times; anything read from a rank's own clock (the budget's wall-clock deadline) is rank 0's.

``GroupHold`` keeps the process group across the search's plan switches: the search switches plan by accelerate()
on your objects with the earlier run closed, and the group is a layered setting (accel/run/journal.py) that the last
run leaving it would destroy; held, it stays until the search ends, so DDP and FSDP keep the group they train in.

In a single process both are no-ops: no collective is made.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

import torch

from accel.search import distribution
from accel.data_parallel import DEVICE_BACKEND, join_group
from accel.hardware.launch import BACKEND_DEVICE, launcher_environment
from accel.run.journal import Journal
from accel.measure import plan_label

Decision = TypeVar("Decision")


class RanksDiverged(RuntimeError):
    """The ranks did not run the same chunk: what they measured cannot be compared (a bug in the caller)."""


@dataclass(frozen=True)
class ChunkTimes:
    """What one rank measured over a chunk of steps of the plan in place."""

    seconds: float  # the chunk's timed seconds
    step_s: tuple[float, ...] = ()  # each timed step's seconds (the stop rule's samples)
    nonfinite: bool = False  # a loss that was inf or nan


@dataclass(frozen=True)
class AgreedChunk:
    """What every rank takes as the chunk's measurement."""

    seconds: float  # the slowest rank's chunk
    step_s: tuple[float, ...]  # step by step, the slowest rank's
    nonfinite: bool  # any rank's loss was not finite
    rank_seconds: tuple[float, ...]  # each rank's own chunk, by rank (for the report)

    @property
    def slowest_rank(self) -> int:
        return max(range(len(self.rank_seconds)), key=self.rank_seconds.__getitem__)


class RankAgreement:
    """The collectives that keep a search's ranks in step. ``group``: the process group (None: a single process,
    where every call returns this rank's own values without a collective)."""

    def __init__(self, group: Any = None):
        self.group = group
        distributed = torch.distributed
        self.world_size = distributed.get_world_size(group) if group is not None else 1
        self.rank = distributed.get_rank(group) if group is not None else 0

    @classmethod
    def current(cls) -> RankAgreement:
        """Over the default group when one of several ranks is initialized; else the single-process no-op."""
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized() and distributed.get_world_size() > 1:
            return cls(distributed.group.WORLD)
        return cls(None)

    @property
    def deciding(self) -> bool:
        """Whether this rank's decisions are the ones every rank takes (rank 0)."""
        return self.rank == 0

    def _device(self) -> torch.device:
        backend = torch.distributed.get_backend(self.group)
        device = BACKEND_DEVICE.get(backend, "cpu")
        if device == "cpu":
            return torch.device("cpu")
        return torch.device(device, getattr(torch, device).current_device())

    def chunk(self, times: ChunkTimes) -> AgreedChunk:
        """The chunk as the slowest rank saw it, on every rank. Raises RanksDiverged when the ranks timed a
        different number of steps (they did not run the same chunk)."""
        if self.group is None:
            return AgreedChunk(times.seconds, tuple(times.step_s), times.nonfinite, (times.seconds,))
        distributed = torch.distributed
        device = self._device()
        mine = torch.tensor([times.seconds, float(times.nonfinite), float(len(times.step_s))], dtype=torch.float64,
                            device=device)
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        distributed.all_gather(every, mine, group=self.group)
        rows = torch.stack(every).cpu()
        counts = {int(n) for n in rows[:, 2].tolist()}
        if len(counts) > 1:
            raise RanksDiverged(f"the ranks timed different numbers of steps in one chunk ({sorted(counts)}): "
                                "every rank must run the same plan for the same steps")
        step_s = torch.tensor(list(times.step_s), dtype=torch.float64, device=device)
        if len(times.step_s):
            distributed.all_reduce(step_s, op=distributed.ReduceOp.MAX, group=self.group)
        seconds = rows[:, 0].tolist()
        return AgreedChunk(max(seconds), tuple(step_s.cpu().tolist()), bool(rows[:, 1].max() > 0), tuple(seconds))

    def any_true(self, flag: bool) -> bool:
        """Whether any rank says so (a non-finite loss outside a chunk's end, a rank that must stop)."""
        if self.group is None:
            return bool(flag)
        tensor = torch.tensor([float(flag)], device=self._device())
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return bool(tensor.item() > 0)

    def slowest(self, seconds: float) -> float:
        """The max over ranks of a time (a step, a warm-up)."""
        if self.group is None:
            return float(seconds)
        tensor = torch.tensor([float(seconds)], dtype=torch.float64, device=self._device())
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return float(tensor.item())

    def decide(self, decision: Decision) -> Decision:
        """Rank 0's decision on every rank (any picklable value: the next plan, a verdict, "settle"). The
        other ranks' arguments are ignored: they may pass what they would have decided, or None."""
        if self.group is None:
            return decision
        box = [decision if self.deciding else None]
        torch.distributed.broadcast_object_list(box, src=torch.distributed.get_global_rank(self.group, 0),
                                                group=self.group, device=self._device())
        return box[0]

    def past(self, deadline: float, now: float) -> bool:
        """Whether the budget's wall-clock deadline has passed, by rank 0's clock."""
        return self.decide(now >= deadline)


def slowest_steps(per_rank: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Step by step, the max over ranks (what ``RankAgreement.chunk`` computes with collectives), for ranks'
    times gathered by other means; the ranks must have timed the same number of steps."""
    counts = {len(steps) for steps in per_rank}
    if len(counts) > 1:
        raise RanksDiverged(f"the ranks timed different numbers of steps ({sorted(counts)})")
    return tuple(max(column) if all(math.isfinite(s) for s in column) else math.inf for column in zip(*per_rank))


class GroupHold:
    """Holds the process group the launcher describes across a search's plan switches.

    Joins it through the same layered setting ddp and fsdp join it by (accel.data_parallel.join_group): a run
    that closes takes its own layer off, and the group stays while this hold's layer is on; ``release`` takes it
    off, and the group leaves if accel joined it and no open run still has it. A group your script joined is
    yours: it is not held, and stays. Use as a context manager, or ``acquire`` / ``release``.
    """

    def __init__(self, backend: str = "gloo", timeout_s: float = 600):
        self.backend, self.timeout_s = backend, timeout_s
        self.journal = Journal()
        self.held = False

    def acquire(self) -> GroupHold:
        if self.held:
            return self
        launch = launcher_environment()
        if launch is None or launch.world_size <= 1:
            return self  # a single process: no group to hold
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


def in_step(launch, model, optimizer, device: torch.device, settings, notes: list[str]
            ) -> tuple[dict[str, dict], GroupHold, RankAgreement]:
    """What a search in your loop needs to keep its ranks in step: the plan part every candidate carries (ddp, or
    fsdp when the training state does not fit a rank: distribution.choose), the group held across its switches, and
    the agreement. A single process (or one rank): nothing carried, nothing held, no collective."""
    if launch is None or launch.world_size <= 1:
        return {}, GroupHold(), RankAgreement(None)
    carried, _ = distribution.choose(model, optimizer, device, launch.world_size, launch.local_world_size,
                                       settings.memory_per_rank)
    hold = GroupHold(DEVICE_BACKEND.get(device.type, "gloo")).acquire()
    notes.append(f"a launched job of {launch.world_size} ranks: every plan measured ran with {plan_label(carried)} (by "
                 "memory fit), the same plan on every rank at every step, timed by the slowest rank and decided by "
                 "rank 0")
    return carried, hold, RankAgreement.current()
