"""A user's training code as check_equivalence trains it, twice, from the same seed, and what each training saw and
left. The code: the objects (``Setup``), what the loop holds (``Held``) and what it does around its steps (``Loop``:
one real behaviour each, a scheduler, a learning-rate write, an EMA, accelerate() again...; tests/zoo/loops has one of
each). What it left (``Trace``): the batches, the outputs' structure, the losses and learning rates, then the
model's, the user's and the loop's state, and the process around it."""
from __future__ import annotations

import functools
import gc
import hashlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.modules.module as torch_module
import torch.optim.optimizer as torch_optimizer
from torch import nn

from accel.batches import map_tensors
from accel.errors import loops_level
from accel.measure import TrainStep, endless
from accel.modules import tied_groups
from accel.run import Run
from accel.run.device_loader import release_workers
from accel.testing.snapshots import snapshot, whole


@dataclass
class Held:
    """The objects the user's loop holds after accelerate(), and the user's own evaluation of a model."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    evaluate: Callable[[nn.Module], torch.Tensor]


class Loop:
    """A plain loop: nothing but the steps. Subclasses act at the same points every time: ``wrap`` (the model and
    loader first), ``prepare`` (before accelerate()), ``start`` (after it), ``before`` (may return a new run) and
    ``after`` each ``step``, ``finish`` once closed; ``observed``: what the harness compares beside the weights."""

    name: ClassVar[str] = "plain"

    def wrap(self, model: nn.Module, loader: Any) -> tuple[nn.Module, Any]:
        return model, loader

    def prepare(self, held: Held) -> None:
        pass

    def step(self, index: int, run: Run, held: Held, batch: Any,
             loss_of: Callable[[Run, Any], torch.Tensor]) -> torch.Tensor:
        """One batch, as the README loop writes it: the loss under run.autocast(), run.backward(loss), run.step()."""
        return TrainStep(step_fn=loss_of)(run, batch)

    def finish(self) -> None:
        pass

    def start(self, held: Held, run: Run) -> None:
        pass

    def before(self, step: int, held: Held, run: Run) -> Run:
        return run

    def after(self, step: int, held: Held, run: Run, loss: float) -> None:
        pass

    def observed(self) -> dict[str, torch.Tensor]:
        return {}


@dataclass
class Setup:
    """A user's training objects; step_fn(run, batch) -> loss when batches are not (inputs, targets); the loop's
    behaviour around the steps; evaluate(model) -> the model's output on held-out data (for validation, EMA)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None  # None: the loop updates the weights itself
    loader: Any
    step_fn: Callable[[Run, Any], torch.Tensor] | None = None
    loop: Loop = field(default_factory=Loop)
    evaluate: Callable[[torch.nn.Module], torch.Tensor] | None = None

    def held(self, run: Run | None = None) -> Held:
        """What the loop holds: the user's objects, or where the run's report names one stale, the run's."""
        stale = run.report.stale if run is not None else {}
        return Held(run.unwrap() if "model" in stale else self.model,
                    run.optimizer if "optimizer" in stale else self.optimizer, self.loader, self.evaluate)


def fingerprint(batch: Any) -> str:
    """The batch's containers and every tensor's dtype, shape and values, as a short text."""
    def one(tensor: torch.Tensor) -> str:
        data = tensor.detach().cpu().contiguous()
        digest = hashlib.blake2b(data.reshape(-1).view(torch.uint8).numpy().tobytes(), digest_size=6).hexdigest()
        return f"{str(data.dtype)[6:]}{list(data.shape)}:{digest}"

    described = map_tensors(one, batch)
    return f"{type(batch).__name__}:{described!r}"


def record_output(outputs: list[str], module: torch.nn.Module, args: Any, output: Any) -> None:
    """A forward hook, bound by functools.partial (which pickles: a loop that saves its whole model, as upstream
    scripts checkpoint with ``torch.save(model, path)``, can still be traced): each output's structure."""
    outputs.append(repr(map_tensors(lambda t: f"{str(t.dtype)[6:]}{list(t.shape)}", output)))


# torch and its compiler set these (names, or prefixes) the first time they run in a process: not the plan's
TORCH_SETS_ON_IMPORT = ("KMP_INIT_AT_FORK", "KMP_DUPLICATE_LIB_OK", "TORCHINDUCTOR_", "_TORCHINDUCTOR_",
                        "CUDA_MODULE_LOADING", "TRITON_")


def process_state() -> tuple:
    """Threads, environment, affinity, the backend flags an accelerator may set (amp sets TF32 on CUDA) and torch's
    process-wide hooks (channels_last registers one while a run is open)."""
    affinity = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    environ = {k: v for k, v in os.environ.items() if not k.startswith(TORCH_SETS_ON_IMPORT)}
    flags = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.get_float32_matmul_precision())
    return torch.get_num_threads(), environ, affinity, flags, global_hooks()


def _global_hook_dicts() -> dict[str, dict]:
    """torch's dicts of the hooks it calls for every module or optimizer in the process, by name: those of
    register_module_forward_pre_hook and its kind, register_optimizer_step_pre_hook and its (each keyed by its
    handle's id; the flags torch keeps beside some, keyed alike, included)."""
    return {f"{where.__name__}.{name}": hooks for where in (torch_module, torch_optimizer)
            for name, hooks in vars(where).items() if name.startswith("_global_") and isinstance(hooks, dict)}


def global_hooks() -> dict[str, dict]:
    """A copy of torch's process-wide hooks (``_global_hook_dicts``): one left registered runs in every later model."""
    return {name: dict(hooks) for name, hooks in _global_hook_dicts().items()}


def remove_hooks_since(before: dict[str, dict]) -> None:
    """Remove the process-wide hooks registered since ``before`` (global_hooks()) and still registered, each said in
    a warning naming it; those of objects gone meanwhile remove themselves first (their finalizers)."""
    if global_hooks() == before:
        return
    gc.collect()
    for name, hooks in _global_hook_dicts().items():
        for key in hooks.keys() - before.get(name, {}).keys():
            hook = hooks.pop(key, None)
            if callable(hook):
                warnings.warn(f"accel.testing: {hook!r} was left registered in torch's {name}, called for every "
                              "module or optimizer of the process: removed", stacklevel=loops_level())


KERNEL_CHOICES = ("params", "fused", "foreach", "capturable", "differentiable")  # how a step runs, not what it does


@dataclass
class Trace:
    """What one training saw and left."""

    batches: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    trainable: dict[str, bool] = field(default_factory=dict)
    ties: list[tuple[str, ...]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)  # the optimizer's hyper-parameters, per group
    frozen_moved: list[str] = field(default_factory=list)
    rates: list[list[float]] = field(default_factory=list)  # the learning rates each step used, per group
    steps_counted: int = 0  # run.steps at the end (accelerate() again continues it)
    user: dict[str, torch.Tensor] = field(default_factory=dict)  # the user's own model and optimizer state
    observed: dict[str, torch.Tensor] = field(default_factory=dict)  # what the loop built (EMA, validation)
    closed: tuple = ()  # hooks and optimizer flags on the user's objects after run.close()
    run: Any = None


def copies(values: dict[str, Any], prefix: str = "", floats: bool = False) -> dict[str, torch.Tensor]:
    """The tensors among these values, whole (fsdp's shards gathered), copied to the cpu (as float32: ``floats``)."""
    found = {prefix + str(k): whole(v).detach().cpu() for k, v in values.items() if isinstance(v, torch.Tensor)}
    return {k: (v.float() if floats else v).clone() for k, v in found.items()}


def trained(run: Run, setup: Setup, steps: int, seed: int) -> Trace:
    """The README loop for `steps` batches, with the setup's loop behaviour, recording the batches, outputs, losses
    and learning rates, then the model's, the user's and the loop's state; then, whatever happened, close the run the
    loop ended with, finish the loop and release the loader's workers, and record how the user's objects run once
    closed (hooks, forwards, kernel flags)."""
    trace, hook = Trace(), None
    try:
        loop, held = setup.loop, setup.held(run)
        model = run.unwrap()
        frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
        user_names = {id(p): n for n, p in setup.model.named_parameters()}  # the optimizer's places, by your names
        groups = setup.optimizer.param_groups if setup.optimizer is not None else []  # (a loop may update by hand)
        start = [user_names.get(id(p)) for group in groups for p in group["params"]]
        hook = model.register_forward_hook(functools.partial(record_output, trace.outputs))
        step = TrainStep(step_fn=setup.step_fn)
        torch.manual_seed(seed)
        batches = endless(run.loader)
        run.model.train()
        loop.start(held, run)
        for i in range(steps):
            again = loop.before(i, held, run)
            if again is not run:  # accelerate() again: the new run's loader, from the start of an epoch
                run, batches = again, endless(again.loader)
            batch = next(batches)
            trace.batches.append(fingerprint(batch))
            trace.rates.append([group["lr"] for group in run.optimizer.param_groups] if run.optimizer else [])
            loss = float(loop.step(i, run, held, batch, step.loss))
            trace.losses.append(loss)
            loop.after(i, held, run, loss)
        hook.remove()
        trace.run = run  # the run at the end (the loop may have made another)
        trace.steps_counted = run.steps
        trace.observed = copies(loop.observed())
        names = {id(p): n for n, p in model.named_parameters()}
        trace.state = copies(model.state_dict())
        trace.user = copies(setup.model.state_dict(), "your model's ")
        for index, state in (setup.optimizer.state_dict()["state"] if setup.optimizer is not None else {}).items():
            trace.user.update(copies(state, f"your optimizer's {index}.", floats=True))
        trace.trainable = {n: p.requires_grad for n, p in model.named_parameters()}
        trace.ties = sorted(tuple(names) for names in tied_groups(model))  # in a fixed order
        trace.frozen_moved = [n for n, p in model.named_parameters() if n in frozen and not p.requires_grad  # (thawed:
                              and (p.shape != frozen[n].shape or not torch.equal(p.detach(), frozen[n]))]  # it trains)
        # The optimizer's state through state_dict() (what the user saves), each place named by the model's parameter,
        # or for a master copy that is not one (IPEX's fp32 weights) by the name its place held when training began.
        if run.optimizer is not None:
            params = [param for group in run.optimizer.param_groups for param in group["params"]]
            positions = [names.get(id(p)) or (start[i] if i < len(start) else None)
                         or f"(not in the model) {tuple(p.shape)}" for i, p in enumerate(params)]
            saved = run.optimizer.state_dict()
            trace.groups = [{k: v for k, v in group.items() if k not in KERNEL_CHOICES}
                            for group in saved["param_groups"]]
            trace.optimizer = {key: copies(saved["state"].get(index, {}), floats=True)
                               for index, key in enumerate(positions)}
    finally:
        if hook is not None:
            hook.remove()
        run.close()  # the run the loop ended with
        setup.loop.finish()
        release_workers(setup.loader)
    after = snapshot(setup.model, setup.optimizer)
    trace.closed = tuple(after.hooks), repr(after.kernels)
    return trace
