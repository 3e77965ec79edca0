"""The object the training loop talks to: the run's model, optimizer and loader, and the accelerators' hooks.

    for batch in run.loader:
        with run.autocast():
            loss = loss_fn(run.model(batch[0]), batch[1])
        run.backward(loss)
        run.step()

The Run chains the runtime hooks of the applied accelerators in plan order (the earliest outermost). The
innermost backward is ``loss.backward()``; the innermost step is the optimizer's step (through the run's
GradScaler when an accelerator set one) followed by ``zero_grad``.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Mapping, MutableMapping, MutableSequence
from typing import Any, Callable, Iterator

import torch

from accel.accelerator import Accelerator
from accel.checkpoint import load as load_checkpoint
from accel.checkpoint import save as save_checkpoint
from accel.context import Context
from accel.loaders import release_workers
from accel.modules import origin
from accel.report import Report


def map_tensors(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """fn applied to every tensor of a batch, each container keeping its own type.

    Tuples, namedtuples, lists, dicts, OrderedDicts, defaultdicts, UserDicts (Hugging Face's BatchEncoding,
    with its attributes) and dataclasses; anything else (strings, numbers) passes unchanged.
    """
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(fn, item) for item in batch))
    if isinstance(batch, (list, tuple)):
        items = [map_tensors(fn, item) for item in batch]
        if type(batch) in (list, tuple) or not isinstance(batch, MutableSequence):
            return type(batch)(items)
        clone = copy.copy(batch)  # a list subclass keeps its type and attributes
        clone[:] = items
        return clone
    if isinstance(batch, Mapping):
        if not isinstance(batch, MutableMapping):
            return {key: map_tensors(fn, value) for key, value in batch.items()}
        clone = copy.copy(batch)  # keeps the type, a defaultdict's factory, a BatchEncoding's attributes
        for key, value in batch.items():
            clone[key] = map_tensors(fn, value)
        return clone
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = {f.name: map_tensors(fn, getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **fields)
    return batch


def describe_batch(batch: Any) -> str:
    """'a dict with keys ['image', 'label']' / 'a tuple of [Tensor, Tensor]' / 'a Tensor of shape (16, 3, 8, 8)':
    what a batch is, for the messages that say what was expected instead."""
    if isinstance(batch, torch.Tensor):
        return f"a Tensor of shape {tuple(batch.shape)}"
    if isinstance(batch, Mapping) or hasattr(batch, "keys"):
        return f"a {type(batch).__name__} with keys {list(batch.keys())}"
    if isinstance(batch, (list, tuple)):
        return f"a {type(batch).__name__} of {[type(item).__name__ for item in batch]}"
    return f"a {type(batch).__name__}"


def move(batch: Any, device: torch.device, non_blocking: bool = False, transforms=()) -> Any:
    """Every tensor of a batch on the device (then each per-tensor transform), containers kept."""
    def one(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(device, non_blocking=non_blocking)
        for transform in transforms:
            tensor = transform(tensor)
        return tensor

    return map_tensors(one, batch)


class DeviceLoader:
    """Wraps the run's DataLoader: batches arrive on the device, then go through the plan's batch transforms;
    epochs are counted so a distributed sampler reshuffles every epoch."""

    def __init__(self, loader: Any, device: torch.device, non_blocking: bool, transforms: list):
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking
        self.transforms = list(transforms)
        self.epoch = 0
        self._move = device.type != "cpu"

    def __iter__(self) -> Iterator[Any]:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        self.epoch += 1
        if not self._move and not self.transforms:
            yield from self.loader
            return
        for batch in self.loader:
            if self._move:
                batch = move(batch, self.device, self.non_blocking)
            for transform in self.transforms:
                batch = transform(batch)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # dataset, sampler, batch_size, ... of the wrapped loader
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


class Run:
    """The accelerated training objects. Use run.model, run.optimizer and run.loader in your loop."""

    def __init__(self, ctx: Context, report: Report, accelerators: list[Accelerator]):
        self.model = ctx.model
        self.optimizer = ctx.optimizer
        self.device = ctx.device
        self.plan = ctx.plan
        self.report = report
        self.decisions = ctx.decisions
        self.extras = ctx.extras
        self.grad_scaler = ctx.grad_scaler
        self.journal = ctx.journal
        self.accelerators = list(accelerators)  # the applied ones, in plan order, each with its own state
        self.loader = (DeviceLoader(ctx.loader, ctx.device, ctx.decisions.non_blocking, ctx.batch_transforms)
                       if ctx.loader is not None else None)
        self._user_loader = ctx.user_loader
        self.steps = 0  # run.step() calls (one per batch), restored by run.load
        self.optimizer_steps = 0  # steps the optimizer really took (not skipped, not accumulating)
        self._autocasts = [a for a in self.accelerators if a.overrides("autocast")]
        self._backward = self._chain("backward", lambda loss: loss.backward())
        self._step = self._chain("step", self._update)
        self._last_step = time.perf_counter()  # the first step's time includes compile and warm-up

    def _chain(self, hook: str, innermost: Callable) -> Callable:
        call = innermost
        for accelerator in reversed([a for a in self.accelerators if a.overrides(hook)]):
            call = (lambda method, proceed: lambda value: method(self, value, proceed))(getattr(accelerator, hook), call)
        return call

    def _update(self, optimizer: torch.optim.Optimizer) -> bool:
        """The innermost step: the optimizer's update (skipped by the GradScaler on inf/NaN), then zero_grad."""
        scaler = self.grad_scaler
        if scaler is None:
            optimizer.step()
            stepped = True
        else:
            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            stepped = scaler.get_scale() >= scale  # the scaler lowers its scale exactly when it skipped
        optimizer.zero_grad(set_to_none=True)
        return stepped

    @property
    def scaler(self):
        """The run's GradScaler (amp with fp16), or None."""
        return self.grad_scaler

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return self.decisions.compute_dtype if self._autocasts else None

    def autocast(self) -> contextlib.AbstractContextManager:
        """The contexts the plan chose for the forward pass and the loss (a no-op when none did)."""
        return self._entered() if self._autocasts else contextlib.nullcontext()

    @contextlib.contextmanager
    def _entered(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:  # entered at `with`; one that fails exits those before it
            for accelerator in self._autocasts:
                context = accelerator.autocast(self)
                if context is not None:
                    stack.enter_context(context)
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), through the plan's hooks (loss scaling, accumulation)."""
        self._backward(loss)

    def step(self) -> bool:
        """The optimizer step through the plan's hooks, then zero_grad; call it once per batch.

        Returns True when the optimizer did not step: the GradScaler skipped it (inf/NaN gradients) or gradients
        are still being accumulated. A learning-rate scheduler steps when it returns False.
        """
        if self.optimizer is None:
            raise RuntimeError("run.step() needs an optimizer: pass one to accel.accelerate(model, optimizer, ...)")
        stepped = self._step(self.optimizer)
        self.steps += 1
        self.optimizer_steps += bool(stepped)
        now = time.perf_counter()
        self.report.step_times.append(now - self._last_step)
        self._last_step = now
        return not stepped

    def accelerator(self, name: str) -> Accelerator:
        """The applied accelerator of that name (its runtime state, e.g. grad_clipping's last norm)."""
        for accelerator in self.accelerators:
            if accelerator.name == name:
                return accelerator
        raise KeyError(f"no applied accelerator {name!r} in this run; applied: {[a.name for a in self.accelerators]}")

    def wrappers(self) -> list[torch.nn.Module]:
        """The model at each level, outermost first (compiled, DDP, ...) down to the user's module."""
        levels = [self.model]
        for accelerator in reversed(self.accelerators):
            inner = accelerator.unwrap(levels[-1])
            if inner is not levels[-1]:
                levels.append(inner)
        if origin(levels[-1]) is not levels[-1]:
            levels.append(origin(levels[-1]))
        return levels

    def unwrap(self) -> torch.nn.Module:
        """The user's plain module under every wrapper (DDP, compile, hooks): what to save and evaluate."""
        return self.wrappers()[-1]

    def save(self, path) -> None:
        """Checkpoint model, optimizer, each accelerator's state, counters, RNG states and the plan.

        Every rank calls it; rank 0 writes, atomically, with a checksum over the tensors.
        """
        save_checkpoint(self, path)

    def load(self, path) -> dict:
        """Restore a checkpoint written by run.save into this run; returns {"step", "epoch", "path"}.

        Everything is checked before anything changes: a refused load leaves the run as it was.
        """
        return load_checkpoint(self, path)

    def close(self) -> None:
        """Put the process back as it was before accelerate() (threads, affinity, environment, backend flags, a
        process group accel started) and stop the workers of a loader the run rebuilt."""
        if self.loader is not None and self.loader.loader is not self._user_loader:
            release_workers(self.loader.loader)
        self.journal.rollback()
