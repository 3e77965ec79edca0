"""What ddp and fsdp share (the base class of both, not an accelerator): joining the launcher's process group
(journaled: the last run that joined it leaves it), this rank's device, and each rank's DistributedSampler shard of
the loader, keeping the user's shuffle and seed. The backend follows the device unless asked for."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from accel.distributed.group import DEVICE_BACKEND, join_group
from accel.errors import Problem, StaleWarning, loops_level
from accel.hardware import importable, is_accelerator
from accel.plan.contract import Accelerator, GradientSync, State
from accel.plan.options import Options, option, positive
from accel.run.device_loader import rebuild_loader, rebuild_problem

BACKENDS = ("auto", "gloo", "nccl", "xccl", "ccl", "mpi")
BACKEND_DEVICES = {"nccl": ("cuda",), "xccl": ("xpu",), "gloo": ("cpu", "cuda"), "ccl": ("cpu", "xpu"),
                   "mpi": ("cpu", "cuda")}
LAUNCHERS = ("RANK/WORLD_SIZE from accel launch or torchrun, OMPI_COMM_WORLD_*, PMI_*, or "
             "SLURM_PROCID/SLURM_NTASKS")


@dataclass(frozen=True, kw_only=True)
class DataParallelOptions(Options):
    """What ddp's and fsdp's options share (each subclasses it)."""

    backend: str = option("auto", choices=BACKENDS, help="auto = nccl on cuda, xccl on xpu, gloo on cpu")
    timeout_s: int | float = option(600, (int, float), check=positive,
                                    help="a collective waiting longer than this raises instead of hanging")
    shard_loader: bool = option(True, help="put a DistributedSampler in the loader")


DO = TypeVar("DO", bound=DataParallelOptions)
DS = TypeVar("DS", bound=State)


class DataParallel(Accelerator[DO, DS], GradientSync[DS]):
    """The process group, the device and the loader's shard: what every data-parallel wrapper needs. A wrapper
    plays GradientSync: the run turns its gradient reduction off while a step schedule accumulates."""

    def stale(self, state: DS) -> str | None:
        """What the loop changed that the wrapper does not follow (said once per run, a StaleWarning), or None."""
        return None

    def warn_stale(self, state: DS) -> None:
        """The StaleWarning, once per run, pointing at the loop's own line: the first frame outside accel's and
        torch's folders, however many hooks and wrappers are between."""
        if state.warned or not (message := self.stale(state)):
            return
        state.warned = True
        warnings.warn(f"accel: {self.name}: {message}", StaleWarning, stacklevel=loops_level())

    def watch_forward(self, ctx, model: torch.nn.Module, state: DS) -> None:
        """Ask ``stale`` before each forward too, until the run's first ``step``: a loop that steps its optimizer
        itself never reaches ``step``, and what it changed must be said all the same. A loop that calls run.step()
        is asked there, and pays nothing per forward: its first step removes the hook (``state.watching``)."""
        said = torch.compiler.disable(lambda *_: state.watching and self.warn_stale(state))  # eager under compile too

        def watch():
            state.watching = model.register_forward_pre_hook(said)
            return state.watching
        ctx.journal.hook(f"{self.name}: what the loop changed that it does not follow, said before a forward until "
                         "the first run.step()", watch)

    def step(self, run, state: DS, optimizer, proceed):
        if state.watching is not None:
            state.watching, watching = None, state.watching
            watching.remove()
        self.warn_stale(state)
        return proceed(optimizer)

    def held_gradients(self, state: DS) -> list[torch.Tensor]:
        """Gradients it holds unreduced outside ``.grad``: none (DDP accumulates in ``.grad``)."""
        return []

    def backend_for(self, device: torch.device) -> str:
        backend = self.config.backend
        return DEVICE_BACKEND.get(device.type, "gloo") if backend == "auto" else backend

    def launch_problems(self, ctx) -> list[Problem]:
        """The launcher's address, the backend for this device, one device per local rank."""
        launch = ctx.decisions.launch
        problems = []
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(key):
                problems.append(Problem(
                    self.name, f"launched by {launch.launcher} (rank {launch.rank} of {launch.world_size}) but "
                    f"{key} is not set", field=key,
                    allowed="export MASTER_ADDR=<rank 0's host> MASTER_PORT=<a free port> (accel launch and "
                            "torchrun set both)"))
        port = os.environ.get("MASTER_PORT", "")
        if port and (not port.isdigit() or not 0 < int(port) < 65536):
            problems.append(Problem(self.name, "MASTER_PORT is not a port number", field="MASTER_PORT", value=port,
                                    allowed="1-65535"))
        backend = self.backend_for(ctx.device)
        if ctx.device.type not in BACKEND_DEVICES.get(backend, ()):
            problems.append(Problem(self.name, f"backend {backend!r} does not serve device {ctx.device}",
                                    field="backend", value=self.config.backend,
                                    allowed="'auto' or " + ", ".join(b for b, d in BACKEND_DEVICES.items()
                                                                     if ctx.device.type in d), kind="conflict"))
        elif backend == "ccl" and not importable("oneccl_bindings_for_pytorch"):
            problems.append(Problem(self.name, "backend 'ccl' needs oneccl_bindings_for_pytorch (Intel's index only)",
                                    field="backend", value="ccl", allowed="pip install oneccl_bind_pt", kind="missing"))
        elif backend in ("gloo", "nccl", "mpi") and not getattr(torch.distributed, f"is_{backend}_available")():
            problems.append(Problem(self.name, f"this torch build has no {backend} backend", field="backend",
                                    value=backend, kind="missing"))
        count = ctx.hardware.devices.get(ctx.device.type, 0)
        if is_accelerator(ctx.device) and count > 1 and launch.local_rank >= count:
            problems.append(Problem(self.name, f"local rank {launch.local_rank} has no {ctx.device.type} device "
                                    f"({count} visible): one device per local rank", field="nproc_per_node",
                                    value=launch.local_world_size, allowed=f"at most {count}", kind="conflict"))
        return problems

    def group_backend(self, device: torch.device) -> str:
        """The backend the process group is started with (fsdp adds gloo for shards kept in host memory)."""
        return self.backend_for(device)

    def join(self, ctx) -> dict[str, str]:
        """Join the process group (unless the script did) and make this rank's device current; say how."""
        backend = self.group_backend(ctx.device)
        if backend == "ccl":
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the ccl backend)
        join_group(ctx.journal, ctx.decisions.launch, backend, self.config.timeout_s)
        launch = ctx.decisions.launch
        changes = {"launcher": launch.launcher, "rank": f"{launch.rank}/{launch.world_size}",
                   "local_rank": f"{launch.local_rank}/{launch.local_world_size}",
                   "backend": torch.distributed.get_backend(), "timeout_s": self.config.timeout_s}
        if is_accelerator(ctx.device):  # the device the core decided for this local rank
            module = getattr(torch, ctx.device.type)
            index = ctx.device.index if ctx.device.index is not None else module.current_device()
            ctx.journal.layer(("current device", ctx.device.type), f"{ctx.device.type} device {ctx.device}",
                              module.current_device, module.set_device, index)
            changes["device"] = str(ctx.device)
        return changes

    def shard(self, ctx) -> str:
        """Give each rank its shard of the loader's samples; say what was done."""
        loader, launch = ctx.loader, ctx.decisions.launch
        if loader is None:
            return "none given"
        if not self.config.shard_loader:
            return "kept (shard_loader=False): every rank sees every sample"
        if launch.world_size == 1:
            return "kept (world size 1: the one rank sees every sample, in your sampler's order)"
        if (rebuild_problem(loader) or isinstance(loader.dataset, IterableDataset)
                or loader.batch_size is None):
            warnings.warn(f"{self.name}: only a map-style DataLoader built with batch_size can be sharded; every rank "
                          "sees every sample of this loader", stacklevel=loops_level())
            return "not sharded (not a map-style DataLoader with batch_size)"
        if not isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
            warnings.warn(f"{self.name}: the loader's {type(loader.sampler).__name__} is kept; shard it per rank "
                          "yourself", stacklevel=loops_level())
            return f"not sharded (custom sampler {type(loader.sampler).__name__})"
        seed = loader.generator.initial_seed() if loader.generator is not None else 0  # the user's seed and shuffle
        sampler = DistributedSampler(loader.dataset, num_replicas=launch.world_size, rank=launch.rank,
                                     shuffle=isinstance(loader.sampler, RandomSampler), seed=seed)
        ctx.loader = rebuild_loader(loader, sampler=sampler)
        return (f"DistributedSampler(shuffle={sampler.shuffle}, seed={sampler.seed}): "
                f"{sampler.num_samples} of {len(loader.dataset)} samples per rank")
