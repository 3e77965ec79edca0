"""ddp: DistributedDataParallel over the process group the launcher describes, with a sharded loader.

What it does: joins the group (data_parallel.py), wraps the model in DDP after surgery, kernels and precision,
before compile, and turns gradient sync off while grad_accumulation holds the update; skipped in a single process.
When it helps: several devices or machines, not one small CPU.

What it keeps: the same math as one process on the global batch (``SAME_MATH``); a layer unfrozen after wrapping
is named with a ``StaleWarning``. Its card: docs/accelerators/ddp.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from accel.distributed.data_parallel import LAUNCHERS, DataParallel, DataParallelOptions
from accel.distributed.group import let_go
from accel.errors import Skip
from accel.hardware import is_accelerator
from accel.modules import trainable
from accel.plan.contract import SAME_MATH, Capability, Stage, State, register
from accel.plan.options import option, positive

__all__ = ["DDP", "DDPOptions", "DDPState"]


@dataclass(frozen=True, kw_only=True)
class DDPOptions(DataParallelOptions):
    bucket_cap_mb: int | float = option(25, (int, float), check=positive, help="gradient bucket size")
    find_unused_parameters: bool = option(False, help="for models whose forward skips parameters")
    static_graph: bool = option(False, help="the graph is the same every step (lets DDP optimise)")
    gradient_as_bucket_view: bool = option(False, help="gradients alias the buckets (saves a copy)")
    comm_hook: str | None = option(None, (str, type(None)), choices=("fp16", "bf16"),
                                   help="compress gradients to this dtype for the all-reduce")


@dataclass
class DDPState(State):
    wrapper: torch.nn.parallel.DistributedDataParallel  # accel's own DDP module around the model
    params: list[torch.nn.Parameter]  # the parameters DDP registered, checked for unfreezing every step
    registered: tuple[bool, ...]  # which of them required gradients when DDP wrapped the model (all it syncs)
    world_size: int
    warned: bool = False  # the StaleWarning about a parameter unfrozen later was given
    watching: Any = None  # the forward hook asking stale until the first run.step() (data_parallel.watch_forward)


@register
class DDP(DataParallel[DDPOptions, DDPState]):
    """Data parallel training: each rank a shard of every epoch, gradients averaged in buckets during backward."""

    name = "ddp"
    stage = Stage.DISTRIBUTION
    provides = (Capability.MODEL_DISTRIBUTED, Capability.DATA_SHARD)
    keeps = SAME_MATH

    def decide(self, ctx):
        if ctx.decisions.launch is None:
            raise Skip(f"single process: no launcher environment ({LAUNCHERS})")

    check = DataParallel.launch_problems  # what ddp checks: the launch

    def apply(self, ctx):
        config = self.config
        changes = self.join(ctx)
        device_ids = [ctx.device.index] if is_accelerator(ctx.device) else None
        wrapper = ctx.model = torch.nn.parallel.DistributedDataParallel(
            ctx.model, device_ids=device_ids, bucket_cap_mb=config.bucket_cap_mb,
            find_unused_parameters=config.find_unused_parameters, static_graph=config.static_graph,
            gradient_as_bucket_view=config.gradient_as_bucket_view)
        if config.comm_hook is not None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            changes["comm_hook"] = f"{config.comm_hook}_compress_hook"
            wrapper.register_comm_hook(state=None, hook=getattr(default_hooks, changes["comm_hook"]))
        if let_go(ctx.journal, "ddp: DistributedDataParallel's hold on the process group", wrapper,
                  ("reducer", "logger", "process_group")):  # without them its forward fails (or segfaults):
            ctx.journal.change("ddp: the wrapper, closed, runs your model alone (run.model after close)",
                               lambda: wrapper.__dict__.pop("forward", None),
                               lambda: setattr(wrapper, "forward", wrapper.module.__call__), kind="object")
        changes["sampler"] = self.shard(ctx)
        params = list(wrapper.parameters())
        state = DDPState(wrapper, params, trainable(params), ctx.decisions.launch.world_size, changes=changes)
        self.watch_forward(ctx, wrapper, state)
        return state

    def gradient_sync(self, run, state, enabled):
        """All-reduce gradients in the next backward (True), or let each rank accumulate its own (False): exactly
        what ``DistributedDataParallel.no_sync()`` sets, kept until the run says otherwise."""
        state.wrapper.require_backward_grad_sync = enabled

    def release_held_gradients(self, run, state):
        """The loop stepped the optimizer itself mid-accumulation: each rank's gradients, accumulated under no_sync,
        would be averaged only in the next synced backward, and the ranks would step apart until then. Averaged
        now, as DDP's all-reduce would (what was already reduced is the same on every rank and stays so)."""
        if state.world_size > 1:
            for param in state.params:
                if param.grad is not None:
                    torch.distributed.all_reduce(param.grad)
                    param.grad.div_(state.world_size)

    def stale(self, state):
        """A parameter unfrozen since DDP wrapped the model: DDP's reducer never registered it, so each rank trains
        it alone. One frozen since (a discriminator during the generator's step) is no miss: it trains on no rank,
        and DDP syncs it again once it is unfrozen."""
        unfrozen = any(now and not then for now, then in zip(trainable(state.params), state.registered))
        if state.world_size > 1 and unfrozen:
            return ("parameters were unfrozen after DDP wrapped the model; DDP synchronizes only those that required "
                    "gradients then, so the ranks now train apart: call accel.accelerate() again after unfreezing "
                    "(it wraps the model anew and continues the run)")
        return None

    def unwrap(self, state, model):
        return model.module if model is state.wrapper else model
