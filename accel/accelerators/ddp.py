"""ddp: DistributedDataParallel over the process group the launcher describes, with a sharded loader.

What it does: joins the process group from torchrun, Open MPI, Intel MPI/MPICH or SLURM variables (backend:
nccl on cuda, xccl on xpu, gloo on cpu; ccl when asked for and importable), wraps the run's model in DDP on
this rank's device (decided before any stage, so each rank's model goes straight to its own device), and
gives each rank a DistributedSampler shard of the loader that keeps the user's shuffle and generator seed;
``run.loader`` calls ``set_epoch`` every epoch. In a single process (no launcher) it is skipped with the
reason. Applied after surgery, kernels and precision, before compile (which then wraps the DDP module).

When it helps: more devices or machines. When it hurts: on one 2-core CPU, 2 gloo ranks x 1 core ran the
book's CNN at 0.60x the speed of 1 process x 2 threads here (the all-reduce of 8.5 MB a step costs more than
it saves); NOTES.md found the two equal on a Zen 3.

Live objects: DDP wraps your model (``run.unwrap()`` is it), so its modes, hooks and state stay live. One
thing DDP cannot follow: it registers the parameters that require gradients when it wraps the model, so a
layer unfrozen later (``requires_grad_(True)``) would train on each rank's own gradients. With more than one
rank, accel warns (``StaleWarning``) at the first step after such a change: call ``accel.accelerate()`` again
after unfreezing, which wraps the model anew and continues the run.

What it keeps: the same math as one process training on the global batch (2 ranks x 32 samples matched
1 process x 64 to 1e-5 in loss); with world size 1, exactly the plain loop, the user's sampler kept. DDP
broadcasts rank 0's weights and registers gradient hooks on the parameters, as PyTorch's DDP always does.
"""
from __future__ import annotations

import os
import warnings

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

from accel.accelerator import SAME_MATH, Accelerator, Option, Stage, positive, register
from accel.distributed import init_process_group
from accel.errors import Problem, Skip, StaleWarning
from accel.hardware import importable, is_accelerator
from accel.loaders import rebuild_loader, rebuild_problem
from accel.modules import trainable

BACKENDS = ("auto", "gloo", "nccl", "xccl", "ccl", "mpi")
DEVICE_BACKEND = {"cuda": "nccl", "xpu": "xccl"}  # every other device: gloo
BACKEND_DEVICES = {"nccl": ("cuda",), "xccl": ("xpu",), "gloo": ("cpu", "cuda"), "ccl": ("cpu", "xpu"),
                   "mpi": ("cpu", "cuda")}


def comm_hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


def distributed_sampler(loader: DataLoader, world: int, rank: int):
    """A DistributedSampler that keeps the user's shuffle and, if the loader has a generator, its seed."""
    from torch.utils.data.distributed import DistributedSampler

    seed = loader.generator.initial_seed() if loader.generator is not None else 0
    return DistributedSampler(loader.dataset, num_replicas=world, rank=rank,
                              shuffle=isinstance(loader.sampler, RandomSampler), seed=seed)


@register
class DDP(Accelerator):
    """Data parallel training: each rank a shard of every epoch, gradients averaged in buckets during backward."""

    name = "ddp"
    stage = Stage.DISTRIBUTION
    provides = ("model.distributed", "data.shard")
    keeps = SAME_MATH
    options = {
        "backend": Option("auto", (str,), choices=BACKENDS, help="auto = nccl on cuda, xccl on xpu, gloo on cpu"),
        "timeout_s": Option(600, (int, float), check=positive,
                            help="a collective waiting longer than this raises instead of hanging"),
        "bucket_cap_mb": Option(25, (int, float), check=positive, help="gradient bucket size"),
        "find_unused_parameters": Option(False, (bool,), help="for models whose forward skips parameters"),
        "static_graph": Option(False, (bool,), help="the graph is the same every step (lets DDP optimise)"),
        "gradient_as_bucket_view": Option(False, (bool,), help="gradients alias the buckets (saves a copy)"),
        "comm_hook": Option(None, (str, type(None)), choices=("fp16", "bf16"),
                            help="compress gradients to this dtype for the all-reduce"),
        "shard_loader": Option(True, (bool,), help="put a DistributedSampler in the loader"),
    }

    def backend_for(self, device: torch.device) -> str:
        return DEVICE_BACKEND.get(device.type, "gloo") if self.backend == "auto" else self.backend

    def decide(self, ctx):
        if ctx.decisions.launch is None:
            raise Skip("single process: no launcher environment (RANK/WORLD_SIZE from accel launch or torchrun, "
                       "OMPI_COMM_WORLD_*, PMI_*, or SLURM_PROCID/SLURM_NTASKS)")

    def check(self, ctx):
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
                                    field="backend", value=self.backend,
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

    def apply(self, ctx):
        backend = self.backend_for(ctx.device)
        if backend == "ccl":
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the ccl backend)
        if not torch.distributed.is_initialized():
            for key, value in ctx.decisions.launch.to_env().items():  # the launcher's variables, as env:// reads
                if key not in os.environ:  # them, journaled so a failed plan and run.close() take them back
                    ctx.journal.setenv(key, value)
            ctx.journal.change(f"process group ({backend})", lambda: init_process_group(backend, self.timeout_s),
                               torch.distributed.destroy_process_group)
        launch = ctx.decisions.launch
        changes = {"launcher": launch.launcher, "rank": f"{launch.rank}/{launch.world_size}",
                   "local_rank": f"{launch.local_rank}/{launch.local_world_size}",
                   "backend": torch.distributed.get_backend(), "timeout_s": self.timeout_s}
        device_ids = None
        if is_accelerator(ctx.device):  # the device the core decided for this local rank
            module = getattr(torch, ctx.device.type)
            ctx.journal.change(f"{ctx.device.type} device {ctx.device}", lambda: module.set_device(ctx.device),
                               (lambda old: lambda: module.set_device(old))(module.current_device()))
            device_ids = [ctx.device.index]
            changes["device"] = str(ctx.device)
        self.wrapper = ctx.model = torch.nn.parallel.DistributedDataParallel(
            ctx.model, device_ids=device_ids, bucket_cap_mb=self.bucket_cap_mb,
            find_unused_parameters=self.find_unused_parameters, static_graph=self.static_graph,
            gradient_as_bucket_view=self.gradient_as_bucket_view)
        if self.comm_hook is not None:
            ctx.model.register_comm_hook(state=None, hook=comm_hooks()[self.comm_hook])
            changes["comm_hook"] = f"{self.comm_hook}_compress_hook"
        changes["sampler"] = self.shard(ctx, launch)
        self.params = list(ctx.model.parameters())
        self.synced = trainable(self.params)
        self.world_size, self.warned = launch.world_size, False
        return changes

    def step(self, run, optimizer, proceed):
        if self.world_size > 1 and not self.warned and trainable(self.params) != self.synced:
            self.warned = True
            warnings.warn("accel: ddp: parameters were frozen or unfrozen after DDP wrapped the model; DDP "
                          "synchronizes only those that required gradients then, so the ranks now train apart: "
                          "call accel.accelerate() again after unfreezing (it wraps the model anew and continues "
                          "the run)", StaleWarning, stacklevel=3)
        return proceed(optimizer)

    def unwrap(self, model):
        return model.module if model is getattr(self, "wrapper", None) else model

    def shard(self, ctx, launch) -> str:
        """Give each rank its shard of the loader's samples; say what was done."""
        loader = ctx.loader
        if loader is None:
            return "none given"
        if not self.shard_loader:
            return "kept (shard_loader=False): every rank sees every sample"
        if launch.world_size == 1:
            return "kept (world size 1: the one rank sees every sample, in your sampler's order)"
        if (rebuild_problem(loader) or isinstance(loader.dataset, IterableDataset)
                or loader.batch_size is None):
            warnings.warn("ddp: only a map-style DataLoader built with batch_size can be sharded; every rank sees "
                          "every sample of this loader", stacklevel=2)
            return "not sharded (not a map-style DataLoader with batch_size)"
        if not isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
            warnings.warn(f"ddp: the loader's {type(loader.sampler).__name__} is kept; shard it per rank yourself",
                          stacklevel=2)
            return f"not sharded (custom sampler {type(loader.sampler).__name__})"
        sampler = distributed_sampler(loader, launch.world_size, launch.rank)
        ctx.loader = rebuild_loader(loader, sampler=sampler)
        return (f"DistributedSampler(shuffle={sampler.shuffle}, seed={sampler.seed}): "
                f"{sampler.num_samples} of {len(loader.dataset)} samples per rank")
