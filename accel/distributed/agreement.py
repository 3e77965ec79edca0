"""What keeps a launched job's ranks in step while plan="auto" measures: the wrapper every rank runs, chosen by
memory fit (``model.distributed`` whole where the training state fits FIT of a rank's memory, the device's total,
never what is free now, so the ranks agree without talking; else ``model.sharded``); the collectives that give every
rank the slowest rank's times and rank 0's decisions (``RankAgreement``); and ``GroupHold``, which keeps the process
group across plan switches. In a single process nothing makes a collective.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from accel.distributed.group import DEVICE_BACKEND, collective_device, join_group
from accel.files import size_text
from accel.hardware.launcher import launcher_environment
from accel.plan.contract import REGISTRY, Capability
from accel.run.journal import Journal

FIT = 0.5  # the training state may take this fraction of a rank's memory
# tensors of optimizer state per trainable parameter element, for optimizers whose state is not there yet
STATE_PER_PARAMETER = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2, "Adadelta": 2, "Rprop": 2,
                       "ASGD": 2, "Adagrad": 1, "SGD": 1, "RMSprop": 1, "Adafactor": 1}


@dataclass
class Footprint:
    """Bytes of the training state, and where the optimizer's share comes from."""

    parameters: int
    gradients: int
    optimizer: int
    how: str

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer


def footprint(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> Footprint:
    parameters = list({id(p): p for p in model.parameters()}.values())  # tied weights once
    size = sum(p.numel() * p.element_size() for p in parameters)
    gradients = sum(p.numel() * p.element_size() for p in parameters if p.requires_grad)
    if optimizer is None:
        return Footprint(size, gradients, 0, "no optimizer")
    name, defaults = type(optimizer).__name__, optimizer.defaults
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.dim()]
    if state:  # measured from the state it holds (a resumed optimizer)
        return Footprint(size, gradients, sum(t.numel() * t.element_size() for t in state), f"{name}'s state as it is")
    per = (bool(defaults.get("momentum")) if name == "SGD" else 1 + bool(defaults.get("centered")) +
           bool(defaults.get("momentum")) if name == "RMSprop" else STATE_PER_PARAMETER.get(name, 2)  # unknown: as Adam
           + bool(defaults.get("amsgrad")))
    return Footprint(size, gradients, int(per * gradients), f"{name}: {per:g} tensor(s) of state per parameter")


def rank_memory(device: torch.device, local_world_size: int) -> tuple[int, str]:
    """A rank's memory in bytes and where it comes from: the device's, or the host's share (a container's limit)."""
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and hasattr(module, "get_device_properties"):
        total = module.get_device_properties(device).total_memory
        return total, f"{device.type} memory {size_text(total)}"
    total = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemTotal:"))
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.exists() and limit.read_text().strip().isdigit():
        total = min(total, int(limit.read_text()))
    return total // max(1, local_world_size), (f"host memory {size_text(total)} shared by {local_world_size} "
                                               "rank(s) on the node")


def choose(model, optimizer, device: torch.device, world_size: int, local_world_size: int,
           memory: int | None = None) -> tuple[dict[str, dict], str]:
    """({ddp: {}} or {fsdp: {...}}, why): the whole model's wrapper when the state fits FIT of a rank's memory."""
    found = sorted(c.name for c in REGISTRY.values() if Capability.MODEL_DISTRIBUTED in c.provides)
    sharded = next(n for n in found if Capability.MODEL_SHARDED in REGISTRY[n].provides)
    whole_name = next(n for n in found if n != sharded)
    need = footprint(model, optimizer)
    memory, where = rank_memory(device, local_world_size) if memory is None else (
        memory, f"the {size_text(memory)} per rank you gave")
    whole = (f"parameters + gradients + optimizer state {size_text(need.total)} per rank ({need.how}) against "
             f"{FIT:.0%} of {where}")
    if need.total <= FIT * memory:
        return {whole_name: {}}, f"{whole_name}: {whole}: it fits, and {whole_name}'s step is the faster"
    shard = math.ceil(need.total / world_size)
    over = f"sharded over {world_size} ranks ({size_text(shard)})"
    if shard <= FIT * memory:
        return {sharded: {}}, f"{sharded}: {whole}: it does not fit whole; {over}"
    if device.type != "cpu":
        return ({sharded: {"cpu_offload": True}}, (f"{sharded} with cpu_offload: {whole}: even {over} it does not "
                                                   "fit, so parameters and optimizer state live in host memory"))
    return {sharded: {}}, (f"{sharded}: {whole}: even {over} it may not fit: more ranks or "
                           "activation_checkpointing would help")


Decision = TypeVar("Decision")


class RanksDiverged(RuntimeError):
    """The ranks did not run the same chunk (a bug in the caller)."""


@dataclass(frozen=True)
class ChunkTimes:
    """One rank's chunk: its timed seconds, each timed step, whether a loss was not finite."""

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

    def _max(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=collective_device(self.group))
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return tensor.cpu().tolist()

    def chunk(self, times: ChunkTimes) -> ChunkTimes:
        """The chunk as the slowest rank saw it, step by step, on every rank (RanksDiverged: not the same steps)."""
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
                                                group=self.group, device=collective_device(self.group))
        return box[0]

    def past(self, deadline: float, now: float) -> bool:
        """Whether the budget's deadline has passed, by rank 0's clock."""
        return self.decide(now >= deadline)


class GroupHold:
    """Holds the launcher's process group across plan switches through the layered setting ddp and fsdp join it by;
    ``release`` lets go (the group leaves if accel joined it and no open run has it; a group you joined stays)."""

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


def in_step(launch, model, optimizer, device: torch.device, memory: int | None = None):
    """(the wrapper every candidate carries by memory fit, the group held, the agreement); nothing in one process."""
    if launch is None or launch.world_size <= 1:
        return {}, GroupHold(), RankAgreement(None)
    carried, _ = choose(model, optimizer, device, launch.world_size, launch.local_world_size, memory)
    return carried, GroupHold(DEVICE_BACKEND.get(device.type, "gloo")).acquire(), RankAgreement.current()
