"""Under a launcher, plan="auto" adds the wrapper every rank runs (``model.distributed``) by memory fit: the one that
keeps each rank's model whole (ddp) where parameters + gradients + optimizer state fit FIT of a rank's memory (the
faster: docs/distributed.md measured fsdp's step at 1.5x ddp's on 2 CPU ranks), else the one that shards it
(``model.sharded``: fsdp). The ranks decide alike without talking: the memory is the device's total (the host's,
shared by the node's ranks, on a CPU), never what is free now. Apart, the rest of the plan is the answer a single
process measured on the setup, from the cache; ``distribute`` adds the wrapper and says where the rest came from."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from accel.plan import Plan
from accel.plan.contract import REGISTRY, Capability
from accel.search.results import TuneRow

FIT = 0.5  # the training state may take this fraction of a rank's memory
# tensors of optimizer state per trainable parameter element, for optimizers whose state is not there yet
STATE_PER_PARAMETER = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2, "Adadelta": 2, "Rprop": 2,
                       "ASGD": 2, "Adagrad": 1, "SGD": 1, "RMSprop": 1, "Adafactor": 1}
SOURCE_WORDS = "the rest of the plan is the answer a single process measured on this setup"


@dataclass
class Footprint:
    """Bytes of the training state, and where the optimizer's share comes from (its state, or its class)."""

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
        return total, f"{device.type} memory {total / 2**30:.1f} GiB"
    total = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemTotal:"))
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.exists() and limit.read_text().strip().isdigit():
        total = min(total, int(limit.read_text()))
    return total // max(1, local_world_size), (f"host memory {total / 2**30:.1f} GiB shared by {local_world_size} "
                                               "rank(s) on the node")


def choose(model, optimizer, device: torch.device, world_size: int, local_world_size: int,
           memory: int | None = None) -> tuple[dict[str, dict], str]:
    """({ddp: {}} or {fsdp: {...}}, why): the whole model's wrapper when the state fits FIT of a rank's memory."""
    found = sorted(c.name for c in REGISTRY.values() if Capability.MODEL_DISTRIBUTED in c.provides)
    sharded = next(n for n in found if Capability.MODEL_SHARDED in REGISTRY[n].provides)
    whole_name = next(n for n in found if n != sharded)
    need = footprint(model, optimizer)
    memory, where = rank_memory(device, local_world_size) if memory is None else (
        memory, f"the {memory / 2**30:.2f} GiB per rank you gave")
    whole = (f"parameters + gradients + optimizer state {_gib(need.total)} per rank ({need.how}) against "
             f"{FIT:.0%} of {where}")
    if need.total <= FIT * memory:
        return {whole_name: {}}, f"{whole_name}: {whole}: it fits, and {whole_name}'s step is the faster"
    shard, over = math.ceil(need.total / world_size), f"sharded over {world_size} ranks"
    if shard <= FIT * memory:
        return {sharded: {}}, f"{sharded}: {whole}: it does not fit whole; {over} {_gib(shard)}"
    if device.type != "cpu":
        return ({sharded: {"cpu_offload": True}}, (f"{sharded} with cpu_offload: {whole}: even {over} ({_gib(shard)}) "
                                                   "it does not fit, so parameters and optimizer state live in "
                                                   "host memory"))
    return {sharded: {}}, (f"{sharded}: {whole}: even {over} ({_gib(shard)}) it may not fit: more ranks or "
                           "activation_checkpointing would help")


def distribute(result, model, optimizer, device: torch.device, launch, memory: int | None = None):
    """A result (a TuneResult) for a launched job of several ranks: its plan plus the wrapper by memory fit, a row
    and the why saying so, and where a cached rest of the plan came from. Unchanged in a single process; once."""
    if launch is None or launch.world_size <= 1:
        return result
    if not any(r.status == "memory fit" for r in result.rows):
        chosen, why = choose(model, optimizer, device, launch.world_size, launch.local_world_size, memory)
        plan = {k: v for k, v in result.plan.to_dict().items()
                if Capability.MODEL_DISTRIBUTED not in REGISTRY[k].provides}
        result.plan = Plan({**plan, **chosen})
        result.rows.append(TuneRow(next(iter(chosen)), chosen, "memory fit", decision=why,
                                   reason="chosen by memory fit, not timed"))
        result.why = f"{why}; {result.why}" if result.why else why
    if result.from_cache and SOURCE_WORDS not in result.why:
        source = (f"{SOURCE_WORDS} ({result.settings.get('search', 'apart (accel.tune)')}, measured "
                  f"{result.measured_at or 'at an unknown time'}, cache key {result.key[:12]}): every rank takes it")
        head, sep, tail = result.why.partition("; ")
        result.why = f"{head}; {source}{sep}{tail}" if sep else f"{result.why}; {source}" if result.why else source
    return result


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**28 else f"{size / 2**20:.1f} MiB"
