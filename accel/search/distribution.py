"""Under a launcher, plan="auto" chooses ddp or fsdp by whether the training state fits a rank's memory.

Every ddp rank holds the whole model, its gradients and its optimizer state; fsdp holds 1/world of each. ddp is
the faster of the two wherever it fits (docs/distributed.md measured fsdp's step at 1.5x ddp's on 2 CPU ranks),
so auto keeps ddp until the state would take more than FIT of a rank's memory (the rest is for activations,
buffers and the allocator), then shards. The ranks must agree without talking (no process group exists yet),
so the memory is the device's total (the host's, shared by the node's ranks, on a CPU), the same on every rank
of a uniform job, never a reading of what is free at this moment.

The rest of the plan is the answer a single process measured on the same setup, from the plan cache (one key for
the setup, accel.plan.cache.setup_key): the ranks measure nothing themselves, so none can choose on its own.
``distribute`` adds the distribution accelerator to a search's result and says where the rest came from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from accel.plan.contract import REGISTRY, Capability

FIT = 0.5  # the training state may take this fraction of a rank's memory
# tensors of optimizer state per trainable parameter element, for optimizers whose state is not there yet
STATE_PER_PARAMETER = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2, "Adadelta": 2, "Rprop": 2,
                       "ASGD": 2, "Adagrad": 1, "SGD": 1, "RMSprop": 1, "Adafactor": 1}


@dataclass
class Footprint:
    """Bytes of the training state: parameters, their gradients, the optimizer's state."""

    parameters: int
    gradients: int
    optimizer: int
    how: str  # where the optimizer's share comes from (its state, or its class)

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer


def footprint(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> Footprint:
    parameters = list({id(p): p for p in model.parameters()}.values())  # tied weights once
    trainable = [p for p in parameters if p.requires_grad]
    size = sum(p.numel() * p.element_size() for p in parameters)
    gradients = sum(p.numel() * p.element_size() for p in trainable)
    if optimizer is None:
        return Footprint(size, gradients, 0, "no optimizer")
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.dim()]
    if state:  # measured from the state it holds (a resumed optimizer)
        return Footprint(size, gradients, sum(t.numel() * t.element_size() for t in state),
                         f"{type(optimizer).__name__}'s state as it is")
    per = _state_per_parameter(optimizer)
    return Footprint(size, gradients, int(per * gradients),
                     f"{type(optimizer).__name__}: {per:g} tensor(s) of state per parameter")


def _state_per_parameter(optimizer: torch.optim.Optimizer) -> float:
    name, defaults = type(optimizer).__name__, optimizer.defaults
    if name == "SGD":
        return 1 if defaults.get("momentum") else 0
    if name == "RMSprop":
        return 1 + bool(defaults.get("centered")) + bool(defaults.get("momentum"))
    per = STATE_PER_PARAMETER.get(name, 2)  # an unknown optimizer: as Adam, the common case
    return per + (1 if defaults.get("amsgrad") else 0)


def rank_memory(device: torch.device, local_world_size: int) -> tuple[int, str]:
    """A rank's memory in bytes and where it comes from."""
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "get_device_properties"):
        total = module.get_device_properties(device).total_memory
        return total, f"{device.type} memory {total / 2**30:.1f} GiB"
    total = _host_memory()
    share = total // max(1, local_world_size)
    return share, f"host memory {total / 2**30:.1f} GiB shared by {local_world_size} rank(s) on the node"


def _host_memory() -> int:
    total = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.exists() and limit.read_text().strip().isdigit():  # a container's limit is what the ranks may use
        total = min(total, int(limit.read_text()))
    return total


def distributors() -> tuple[str, str]:
    """The registered accelerators that distribute (``model.distributed``): the one that keeps each rank's model
    whole (ddp) and the one that shards it (``model.sharded``: fsdp)."""
    found = sorted(c.name for c in REGISTRY.values() if Capability.MODEL_DISTRIBUTED in c.provides)
    sharded = [n for n in found if Capability.MODEL_SHARDED in REGISTRY[n].provides]
    return next(n for n in found if n not in sharded), sharded[0]


def choose(model, optimizer, device: torch.device, world_size: int, local_world_size: int,
           memory: int | None = None) -> tuple[dict[str, dict], str]:
    """({ddp: {}} or {fsdp: {...}}, why): the whole model's wrapper when the state fits FIT of a rank's memory."""
    whole_name, sharded_name = distributors()
    need = footprint(model, optimizer)
    if memory is None:
        memory, where = rank_memory(device, local_world_size)
    else:
        where = f"the {memory / 2**30:.2f} GiB per rank you gave"
    budget = FIT * memory
    whole = (f"parameters + gradients + optimizer state {_gib(need.total)} per rank "
             f"({need.how}) against {FIT:.0%} of {where}")
    if need.total <= budget:
        return {whole_name: {}}, f"{whole_name}: {whole}: it fits, and {whole_name}'s step is the faster"
    sharded = math.ceil(need.total / world_size)
    over = f"sharded over {world_size} ranks"
    if sharded <= budget:
        return {sharded_name: {}}, f"{sharded_name}: {whole}: it does not fit whole; {over} {_gib(sharded)}"
    if device.type != "cpu":
        return ({sharded_name: {"cpu_offload": True}},
                f"{sharded_name} with cpu_offload: {whole}: even {over} ({_gib(sharded)}) it does not fit, so "
                "parameters and optimizer state live in host memory")
    return ({sharded_name: {}}, f"{sharded_name}: {whole}: even {over} ({_gib(sharded)}) it may not fit: more ranks "
            "or activation_checkpointing would help")


SOURCE_WORDS = "the rest of the plan is the answer a single process measured on this setup"


def answer_source(result) -> str:
    """Where a launched job's plan (but ddp or fsdp) came from, for its why: the cache's single-process answer,
    when and under which key; "" for a result that was not read from the cache."""
    if not result.from_cache:
        return ""
    search = result.settings.get("search", "apart (accel.tune)")
    return (f"{SOURCE_WORDS} ({search}, measured {result.measured_at or 'at an unknown time'}, cache key "
            f"{result.key[:12]}): every rank takes it")


def distribute(result, model, optimizer, device: torch.device, launch, memory: int | None = None):
    """A TuneResult for a launched job of several ranks: its plan plus ddp or fsdp, chosen by memory fit, a row
    saying so, and the why (with where the rest of the plan came from). Unchanged in a single process; adding
    twice adds once."""
    from accel.search.results import TuneRow
    from accel.plan import Plan

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
    return with_source(result)


def with_source(result):
    """The result, its why saying where a cached answer came from (once)."""
    source = answer_source(result)
    if source and SOURCE_WORDS not in result.why:
        head, sep, tail = result.why.partition("; ")
        result.why = f"{head}; {source}{sep}{tail}" if sep else f"{result.why}; {source}" if result.why else source
    return result


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**28 else f"{size / 2**20:.1f} MiB"
