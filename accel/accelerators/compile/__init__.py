"""compile: torch.compile, applied last and outermost, so it sees every wrapper other accelerators added.

What it does: compiles the run's model (with ``regional``, each repeated block in place), reports the compiling
steps apart from the steady ones, and keeps inductor's code in accel's cache folder (cache.py), so a second run
starts warm. When it helps: GPUs, many small element-wise ops; on CPU convolutions it gains little for its warm-up.

What it keeps: the same math (``SAME_MATH``), the plain loop's dropout masks: docs/accelerators/compile.md.
"""
from __future__ import annotations

import importlib
import shutil
import warnings
from dataclasses import dataclass, field

import torch

import accel.accelerators.compile.cache as compile_cache
from accel.errors import LoopError, Problem, Skip, loops_level
from accel.hardware import PACKAGE_BACKENDS, torch_version
from accel.modules import (
    checkpoints_itself,
    compile_seconds,
    compiled,
    hands_blocks_a_cache,
    listed,
    outermost,
    repeated_blocks,
    running_statistics,
    trainable,
)
from accel.plan.contract import SAME_MATH, Accelerator, Capability, Stage, State, register
from accel.plan.options import Options, option

__all__ = ["Compile", "CompileOptions", "CompileState"]

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def has_compiler() -> bool:
    """inductor on a CPU writes C++: a compiler must be on PATH."""
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@dataclass(frozen=True, kw_only=True)
class CompileOptions(Options):
    mode: str | None = option(None, (str, type(None)), choices=MODES)
    backend: str = option("inductor", help="any name torch._dynamo.list_backends() gives, or one an optional package "
                          "registers (IPEX's)")
    fullgraph: bool = option(False, help="fail instead of falling back to eager at graph breaks")
    dynamic: bool | None = option(None, (bool, type(None)), help="None: let dynamo decide when shapes change")
    options: dict | None = option(None, (dict, type(None)), help="backend options (inductor config); excludes mode")
    regional: bool | None = option(None, (bool, type(None)), help="compile each repeated block (transformer layers, "
                                   "ResNet stages) in place instead of the whole model: one warm-up per block class. "
                                   "None: per block under fsdp (its blocks), the whole model otherwise")


@dataclass
class CompileState(State):
    wrapper: torch.nn.Module | None = None  # the OptimizedModule around the model (None: compiled in regions)
    compiles: list = field(default_factory=list)  # (step, seconds compiled in it): the warm-up, then each recompile
    compiled_s: float = 0.0  # torch's compile time in this process when last read (accel.modules.compile_seconds)

    @property
    def warmup_s(self) -> float:
        """Seconds compiled in the step that first compiled (0 until a step did)."""
        return self.compiles[0][1] if self.compiles else 0.0

    @property
    def recompile_s(self) -> float:
        """Seconds compiled in later steps: recompiles (a new sequence length, train/eval, a hook...)."""
        return sum(seconds for _, seconds in self.compiles[1:])


def sharded_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost modules under the root that FSDP2 sharded on their own (fully_shard), in the model's order."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return []
    return outermost(model, FSDPModule)


@register
class Compile(Accelerator[CompileOptions, CompileState]):
    name = "compile"
    stage = Stage.COMPILATION
    provides = (Capability.MODEL_COMPILE, Capability.SETUP_COSTLY)
    keeps = SAME_MATH

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        if not (has_compiler() or hardware.devices.keys() - {"cpu"}) or compiled(model):
            return []
        # repeated blocks compile once per class: a shorter warm-up, for a search's budget; not where the blocks are
        # handed a KV cache, which dynamo compiles again per layer (docs/accelerators/compile.md)
        if repeated_blocks(model) and not hands_blocks_a_cache(model):
            return [{"regional": True}]
        return [] if checkpoints_itself(model) and running_statistics(model) else [{}]  # (check() says why)

    def check(self, ctx):
        import torch._dynamo

        problems = []
        config = self.config
        if config.mode is not None and config.options is not None:
            problems.append(Problem(self.name, "torch.compile takes either mode or options, not both", field="options",
                                    value=config.options, allowed="drop mode, or drop options", kind="conflict"))
        own, norms = checkpoints_itself(ctx.model), running_statistics(ctx.model)
        sharded = ctx.plan.providing(Capability.MODEL_SHARDED)  # (then its blocks, one by one)
        if own and norms and not (config.regional or config.regional is None and sharded):
            problems.append(Problem(self.name, f"the model checkpoints its own activations ({listed(own, 2)}) and "
                                    f"holds BatchNorm ({listed(norms, 3)}): compiled whole, its recomputation does not "
                                    "update the running statistics a second time as the plain loop's does (aot_eager: "
                                    "half the batches counted), or fails in backward (the eager backend: 'modified by "
                                    "an inplace operation')", field="regional", value=config.regional,
                                    allowed="regional=True (each block compiled, the checkpointing outside them), the "
                                    "model's own checkpointing turned off (timm: set_grad_checkpointing(False)), or no "
                                    "compile", kind="conflict"))
        if config.fullgraph and ctx.plan.providing(Capability.MODEL_DISTRIBUTED) and not (config.regional or sharded):
            problems.append(Problem(self.name, "fullgraph=True compiles the DDP wrapper whole, and its forward holds "
                                    "what dynamo cannot trace (DDP's logger): the first step would fail",
                                    field="fullgraph", value=True, allowed="fullgraph=False, or regional=True (each "
                                    "block compiled inside the wrapper)", kind="conflict"))
        # a backend an optional package registers (IPEX's 'ipex') is probed without importing it; torch's own list
        # decides the others
        if why := (PACKAGE_BACKENDS[config.backend][1]() if config.backend in PACKAGE_BACKENDS else None):
            problems.append(Problem(self.name, why, field="backend", value=config.backend, kind="missing"))
        elif config.backend not in (backends := sorted(torch._dynamo.list_backends(exclude_tags=()))
                                    + list(PACKAGE_BACKENDS)):
            problems.append(Problem(self.name, "unknown compile backend", field="backend", value=config.backend,
                                    allowed=", ".join(backends), kind="missing"))
        if config.backend == "inductor" and ctx.device.type == "cpu" and not has_compiler():
            problems.append(Problem(self.name, "inductor on CPU needs a C++ compiler (g++ or clang++) on PATH",
                                    field="backend", value="inductor", kind="missing"))
        return problems

    def apply(self, ctx):
        config = self.config
        if config.backend in PACKAGE_BACKENDS:  # imported only once check() passed: IPEX ends the process on a torch
            importlib.import_module(PACKAGE_BACKENDS[config.backend][0])  # it was not built for
        kwargs = {k: v for k, v in {"backend": config.backend, "fullgraph": config.fullgraph, "dynamic": config.dynamic,
                                    "mode": config.mode, "options": config.options}.items() if v is not None}
        import torch._dynamo

        sharded = sharded_blocks(ctx.model)  # the blocks FSDP2 shards one by one (fsdp's, or your fully_shard's)
        regional = config.regional or (config.regional is None and bool(sharded))
        blocks = (sharded or outermost(ctx.model, repeated_blocks(ctx.model))) if regional else []
        if regional and not blocks:
            raise Skip("regional: the model has no repeated block (a class with children occurring twice) to "
                       "compile one by one; regional=False compiles the whole model")
        # Hooks you register or remove after accelerate() must reach the compiled code: dynamo guards on them
        # (its default skips those guards, and a hook added later would silently never run). Put back by close.
        ctx.journal.setattr(torch._dynamo.config, "skip_nnmodule_hook_guards", False)
        changes = {**kwargs, "compiles": "on the first step (see timing)",
                   "hooks": "guarded: hooks you add or remove later recompile"}
        if config.backend == "inductor":  # the backend whose compiled graphs torch keeps on disk, in accel's folder
            import torch._inductor.config

            # inductor draws its own random numbers (dropout's masks differ from the plain loop's); with
            # fallback_random it calls torch's, the same numbers
            ctx.journal.setattr(torch._inductor.config, "fallback_random", True)
            changes["random"] = "the plain loop's random numbers (inductor's fallback_random: dropout's masks kept)"
            changes.update(compile_cache.keep_in_accel_cache(ctx, {**kwargs, "regional": regional}))
        if regional:  # each block compiled in place (``module.compile``): the blocks FSDP2 sharded, else the repeated
            names = {id(m): name for name, m in ctx.model.named_modules()}
            for block in blocks:
                ctx.journal.change(f"compile: {names.get(id(block), type(block).__name__)}",
                                   lambda b=block: b.compile(**kwargs),
                                   lambda b=block: setattr(b, "_compiled_call_impl", None), kind="object")
            kinds = sorted({type(b).__name__.removeprefix("FSDP") for b in blocks})
            changes["regions"] = (f"{len(blocks)} x {', '.join(kinds)} compiled in place, one by one"
                                  + (" (the blocks FSDP2 sharded)" if sharded else "") + ": "
                                  + listed([names.get(id(b), "?") for b in blocks]) + "; the rest runs eagerly")
            if hands_blocks_a_cache(ctx.model):
                changes["kv cache"] = ("the model's config.use_cache is True: Hugging Face hands every block its KV "
                                       "cache, and dynamo compiles a block again for each layer index, up to torch's "
                                       "recompile_limit (8), then runs the rest eagerly; set "
                                       "model.config.use_cache = False for training")
                warnings.warn(f"accel compile: {changes['kv cache']}", stacklevel=loops_level())
            return CompileState(changes=changes, compiled_s=compile_seconds())
        state = CompileState(torch.compile(ctx.model, **kwargs), changes=changes, compiled_s=compile_seconds())
        ctx.model = state.wrapper
        if torch_version() < (2, 15):  # older AOTAutograd trains a layer unfrozen later with its frozen graph
            params = list(state.wrapper.parameters())  # (2.15 recompiles by itself)
            compiled_with = trainable(params)  # their requires_grad when last compiled

            def recompile_on_unfreeze(module, args) -> None:
                nonlocal compiled_with
                if (now := trainable(params)) != compiled_with:
                    compiled_with = now
                    torch._dynamo.reset()  # drops the compiled graphs: the next call compiles with the new flags

            ctx.journal.hook("compile: recompile after unfreezing",
                             lambda: state.wrapper.register_forward_pre_hook(recompile_on_unfreeze))
            changes["unfreezing"] = "recompiles (torch < 2.15 does not by itself)"
        return state

    def step(self, run, state, optimizer, proceed):
        """Count what compiled since the last step (its warm-up, a recompile), in its state and its report row."""
        stepped = proceed(optimizer)
        if (now := compile_seconds()) > state.compiled_s:
            state.compiles.append((run.steps + 1, round(now - state.compiled_s, 3)))
            state.compiled_s = now
            again = [f"step {step} ({seconds} s)" for step, seconds in state.compiles[1:]]
            state.changes["compiles"] = (f"step {state.compiles[0][0]} ({state.warmup_s} s)" + (
                f"; recompiled at {', '.join(again)}: a change dynamo guards on (a new input shape, such as a "
                "sequence length per batch: pad to a few lengths or dynamic=True; train/eval; a hook)" if again
                else ""))
        return stepped

    def backward(self, run, state, loss, proceed):
        try:
            proceed(loss)
        except RuntimeError as error:
            if "double backward" not in str(error):
                raise
            for param in run.unwrap().parameters():  # partial sums of the failed pass: dropped, as zero_grad does
                param.grad = None
            others = [name for name in run.plan.names() if name != self.name]
            raise LoopError(
                "compile: your loop backpropagates through a gradient (a gradient penalty: torch.autograd.grad(..., "
                "create_graph=True)), and torch.compile's AOTAutograd does not run a double backward "
                f"({error}). Plans without compile run it: accel.accelerate(model, optimizer, loader, plan={others}). "
                "The run's weights, optimizer state and counters are as they were; the gradients held so far "
                "were dropped (as zero_grad does)") from error

    def unwrap(self, state, model):
        return model._orig_mod if state.wrapper is not None and model is state.wrapper else model
