"""fsdp: shard the parameters, gradients and optimizer state over the ranks with PyTorch's FSDP2 (``fully_shard``).

What it does: joins the group as ``ddp`` does, ``fully_shard``s each repeated block and the root, and puts the
shards into the optimizer you hold; with ``amp`` it computes in the plan's dtype; ``run.save`` writes sharded
checkpoints. When it helps: a model with its optimizer state does not fit one rank (else ``ddp`` is faster).

What it keeps: the same math as one process on the global batch (``SAME_MATH``; BatchNorm statistics per rank);
your model, optimizer and parameters stay live. Its card: docs/accelerators/fsdp.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

import accel.accelerators.fsdp.surgery as surgery
from accel.distributed.data_parallel import LAUNCHERS, DataParallel, DataParallelOptions
from accel.distributed.group import let_go
from accel.errors import Problem
from accel.hardware import is_accelerator
from accel.modules import absent_classes, chosen_classes, listed, outermost, own_class, tied_groups
from accel.optim import foreign_tensors
from accel.plan.contract import SAME_MATH, Capability, Stage, State, dtype_name, register
from accel.plan.options import module_classes, option

__all__ = ["FSDP", "FSDPOptions", "FSDPState"]


@dataclass(frozen=True, kw_only=True)
class FSDPOptions(DataParallelOptions):
    blocks: str | list[str] = module_classes("class names of the modules to shard one by one; auto = the repeated "
                                             "blocks")
    reshard_after_forward: bool = option(True, help="free each block's gathered weights after its forward "
                                                    "(gathered again for backward): less memory, more traffic")
    reduce_dtype: str = option("float32", choices=("float32", "compute"),
                               help="with amp: reduce gradients in fp32, or in the compute dtype")
    cpu_offload: bool = option(False, help="keep shards and optimizer state in host memory (accelerators only)")


@dataclass
class FSDPState(State):
    """The model's sharding while the run holds it (None once run.close() or a later plan took it off; a failed
    later plan puts it back, redone), and what the hooks follow."""

    sharding: surgery.Sharding | None = None  # what fully_shard changed, to give the model back
    originals: surgery.Originals | None = None  # your own parameters while their shards train
    sync: bool = True  # reduce-scatter gradients in backward (False while a step schedule accumulates)
    warned: bool = False  # the StaleWarning about a gradient hook on a shard was given
    watching: Any = None  # the forward hook asking stale until the first run.step() (data_parallel.watch_forward)


def keeps_float32(module: nn.Module) -> bool:
    """A module whose parameters stay float32 under amp: a BatchNorm (autocast runs it in fp32), or a module with a
    parametrization (spectral_norm, weight_norm, orthogonal), whose weight is computed in the module's own code,
    with float32 buffers beside it (spectral_norm's power iteration fails on a bfloat16 weight)."""
    norm = isinstance(module, nn.modules.batchnorm._BatchNorm) and any(
        p is not None for p in module._parameters.values())
    return norm or parametrize.is_parametrized(module)


def tied_apart(model: nn.Module, modules: list[nn.Module], names: dict[int, str]) -> tuple[list, list]:
    """(the modules none of whose parameters is also held outside them, the others): a tied embedding and head, or
    two blocks sharing a weight, cannot be sharded in two FSDP groups."""
    groups, apart, tied = tied_groups(model), [], []
    for module in modules:
        prefix = f"{names[id(module)]}."
        (tied if any(len({n.startswith(prefix) for n in group}) > 1 for group in groups) else apart).append(module)
    return apart, tied


@register
class FSDP(DataParallel[FSDPOptions, FSDPState]):
    name = "fsdp"
    stage = Stage.DISTRIBUTION
    provides = (Capability.MODEL_DISTRIBUTED, Capability.DATA_SHARD, Capability.MODEL_SHARDED)
    conflicts = (Capability.MODEL_DISTRIBUTED,)  # ddp
    keeps = SAME_MATH

    def group_backend(self, device: torch.device) -> str:
        """With cpu_offload the shards live in host memory, and what gathers or reduces them as DTensors (run.close(),
        clip_grad_norm_, checkpoints) runs collectives on CPU tensors, which nccl and xccl cannot carry: the group
        gets gloo for those beside them (``cpu:gloo,cuda:nccl``)."""
        backend = self.backend_for(device)
        offloaded = self.config.cpu_offload and backend in ("nccl", "xccl")
        return f"cpu:gloo,{device.type}:{backend}" if offloaded else backend

    def check(self, ctx):
        try:
            from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: F401  (FSDP2: torch >= 2.6)
        except ImportError as error:
            return [Problem(self.name, f"this torch has no FSDP2 (torch.distributed.fsdp.fully_shard): {error}",
                            field="torch", allowed="torch >= 2.6", kind="missing")]
        config = self.config
        problems = []
        if ctx.decisions.launch is None:
            problems.append(Problem(self.name, f"not launched: no launcher environment ({LAUNCHERS}); fsdp shards "
                                    "over the ranks of a launched job (one rank, e.g. torchrun --nproc-per-node 1, "
                                    "is allowed and shards nothing)", field="launcher",
                                    allowed="accel launch, torchrun, mpirun or srun", kind="missing"))
        else:
            problems += self.launch_problems(ctx)
        if not list(ctx.model.parameters()):
            problems.append(Problem(self.name, "the model has no parameters to shard", field="model",
                                    value=type(ctx.model).__name__))
        if any(isinstance(m, FSDPModule) for m in ctx.model.modules()):
            problems.append(Problem(self.name, "the model is already sharded by FSDP (fully_shard was called on it)",
                                    field="model", value=type(ctx.model).__name__,
                                    allowed="the model before fully_shard", kind="conflict"))
        problems += absent_classes(self.name, "blocks", config.blocks, ctx.model)
        if config.cpu_offload and not is_accelerator(ctx.device):
            problems.append(Problem(self.name, f"offloading to CPU memory needs an accelerator device; the device is "
                                    f"{ctx.device}, whose memory already is CPU memory", field="cpu_offload",
                                    value=True, allowed="False on cpu", kind="conflict"))
        if foreign := (foreign_tensors(ctx.optimizer, ctx.model) if ctx.optimizer is not None else []):
            problems.append(Problem(self.name, f"the optimizer holds {len(foreign)} parameter(s) that are not the "
                                    f"model's ((param group, shape): {foreign[:5]}): fsdp replaces the model's "
                                    "parameters with their shards and cannot shard those", field="optimizer",
                                    allowed="an optimizer built over model.parameters()", kind="conflict"))
        return problems

    def apply(self, ctx):
        from torch.distributed.device_mesh import init_device_mesh  # FSDP2 (torch >= 2.6): check() found it here
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

        config = self.config
        changes = self.join(ctx)
        world = ctx.decisions.launch.world_size
        names = {id(m): name for name, m in ctx.model.named_modules()}
        blocks, tied = tied_apart(ctx.model, outermost(ctx.model, chosen_classes(ctx.model, config.blocks)[0]), names)
        if tied:  # FSDP2 refuses, at the first forward, one parameter in two groups: the root's group holds it
            changes["tied"] = listed([names[id(m)] for m in tied]) + " left to the root's group: a parameter of " \
                "each is tied to one outside it"
        kinds = sorted({own_class(m).__name__ for m in blocks})  # before FSDP renames the classes
        dtype = ctx.decisions.compute_dtype
        reduce = (torch.float32 if config.reduce_dtype == "float32" else dtype) if dtype is not None else None
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce)  # (no amp: FSDP2's default policy)
        mesh = init_device_mesh(ctx.device.type, (world,))  # kept by torch's caches past close: it lets go there
        let_go(ctx.journal, "fsdp: the device mesh's hold on the process group", mesh, ("_pg_registry",), dict)
        kwargs = {"mesh": mesh, "reshard_after_forward": config.reshard_after_forward, "mp_policy": policy,
                  "offload_policy": CPUOffloadPolicy() if config.cpu_offload else OffloadPolicy()}
        model, state = ctx.model, FSDPState(changes=changes)  # state.sharding: the model's sharding now
        kept = tied_apart(model, [m for m in model.modules() if keeps_float32(m) and m is not model], names)[0] + (
            [model] if keeps_float32(model) else []) if dtype is not None else []

        # torch 2.8's gloo reduce-scatter summed under ReduceOp.AVG; SUM and a division are right everywhere
        sums = torch.distributed.get_backend(mesh.get_group()) == "gloo"
        changes["gradient_reduction"] = ("sum, then divided by the world size (gloo's AVG reduce-scatter is not an "
                                         "average on every torch)" if sums else "average")

        def shard():  # also redone when a later plan on this model fails and this run is given back
            state.sharding = surgery.shard_model(model, blocks, kept, sums, **kwargs)
            state.originals = surgery.Originals(model, state.sharding)
            if not state.sync:  # redone mid-run: the new FSDP state reduces by default, the run said not to
                self.gradient_sync(None, state, False)

        def unshard():  # a collective; FSDP's own state (its gradient-sync flag with it) goes with the sharding
            if state.sharding is not None:
                sharding, state.sharding = state.sharding, None
                surgery.unshard_model(sharding)

        ctx.journal.change(f"fsdp: fully_shard on {len(blocks)} block(s) and the root", shard, unshard, kind="object")
        optimizer = ctx.optimizer
        follow = torch.compiler.disable(lambda *_: state.originals.follow(optimizer))  # eager under compile too
        if optimizer is not None:
            ctx.journal.change(
                "fsdp: the optimizer's parameters replaced by their shards",
                lambda: surgery.swap_parameters(optimizer, state.originals.shards, surgery.shard_like),
                lambda: surgery.swap_parameters(optimizer, {id(shard): mine for mine, shard in state.originals.pairs},
                                                lambda value, _: surgery.gather_state(value)),
                kind="object")
            ctx.journal.hook("fsdp: a group added later over your own parameters swapped for their shards at the "
                             "step", lambda: optimizer.register_step_pre_hook(follow))
        ctx.journal.hook("fsdp: your own parameters' unfreezing, and groups added over them, followed before each "
                         "forward", lambda: model.register_forward_pre_hook(follow, prepend=True))
        shared = torch.compiler.disable(lambda *hooked: state.originals.after_backward(*hooked))
        ctx.journal.hook("fsdp: the shards' gradients shared with your own parameters at the end of each backward",
                         lambda: model.register_forward_hook(shared))
        self.watch_forward(ctx, model, state)
        changes["sharded"] = (f"{len(blocks)} x {', '.join(kinds)}: "
                              + listed([names[id(m)] for m in blocks]) + ", then the root") if blocks else (
            "the root only (no repeated block found: name them with blocks=[...] to gather one block at a time)")
        changes["world"] = (f"{world} ranks: each holds 1/{world} of every parameter, gradient and optimizer state"
                            if world > 1 else "world size 1: one rank holds everything, nothing is sharded "
                            "(checkpoints are still sharded DCP directories, loadable at any world size)")
        changes["reshard_after_forward"] = config.reshard_after_forward
        if dtype is not None:
            changes["mixed_precision"] = f"param_dtype={dtype_name(dtype)}, reduce_dtype={dtype_name(reduce)}"
            if kept:
                changes["float32"] = (listed([names[id(m)] or "the root" for m in kept]) + " sharded with float32 "
                                      "parameters, as amp alone keeps them (autocast runs BatchNorm in fp32, and a "
                                      "parametrization computes its weight with float32 buffers)")
        if config.cpu_offload:
            changes["cpu_offload"] = "shards, gradients and optimizer state in host memory; the step runs there"
        changes["parameters"] = ("replaced in place by DTensor shards (your optimizer's groups hold them, and a "
                                 "group you add later over your own parameters takes theirs); run.close() gathers "
                                 "them back into your own parameters")
        changes["sampler"] = self.shard(ctx)
        changes["checkpoints"] = "run.save writes a sharded DCP directory"
        return state

    def stale(self, state):
        # the shards, and your own Parameters (autograd never reaches them while their shards train)
        if hooked := [state.originals.names[id(shard)] for pair in state.originals.pairs for shard in pair[1:]
                      if any(getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None)
                             for p in pair)]:
            return (f"a gradient hook on the parameter(s) {hooked[:4]} never runs: under FSDP2 autograd computes the "
                    "gradient of the gathered weight and the shard's gradient comes from the reduce-scatter; hook the "
                    "module instead (register_full_backward_hook), or run without fsdp")
        return None

    def gradient_sync(self, run, state, enabled):
        """Reduce-scatter gradients in backward (True), or keep accumulating them unreduced (False). The flag lives
        in FSDP2's state on the sharded modules, which run.close() takes off with the sharding."""
        state.sync = enabled
        if state.sharding is not None:
            state.sharding.sharded[-1].set_requires_gradient_sync(enabled)  # the root, and every block in it

    def held_gradients(self, state):
        """The gradients FSDP2 holds unreduced while gradient sync is off (accumulation's micro-steps): what a
        grad_accumulation that stands aside multiplies back."""
        sharded = state.sharding.sharded if state.sharding is not None else []
        return [g for _, held in surgery.held_by_parameter(sharded) for g in held]

    def release_held_gradients(self, run, state):
        """The loop stepped the optimizer itself mid-accumulation: FSDP2 would reduce what it holds only in the next
        synced backward, a step late. Reduced now into the shards' .grad, as its reduce-scatter would."""
        if state.sharding is not None:
            surgery.reduce_into_shards(state.sharding.sharded)

