"""The object the training loop talks to: the run's model, optimizer and loader, and the accelerators' hooks.

    for batch in run.loader:
        with run.autocast():
            loss = loss_fn(run.model(batch[0]), batch[1])
        run.backward(loss)
        run.step()

The Run trains the user's own objects (an accelerator may wrap the model, and prune or IPEX replace it, which the
report and a StaleWarning then say), so what the user does to them stays live. It chains the runtime hooks of
the applied accelerators in plan order (the earliest outermost): ``forward_context`` (run.autocast()),
``backward``, ``step``, ``optimizer_step`` (the update itself: amp's GradScaler steps there) and
``unscale_gradients``. The innermost backward is ``loss.backward()``; the innermost step is the optimizer's
update followed by ``zero_grad``. The run owns its state: ``state_dict()``/``load_state_dict()`` hold the model,
the optimizer, the counters, each accelerator's state, the loader's generators and the random state.
"""
from __future__ import annotations

import contextlib
import copy
import weakref
from typing import Any, Callable, Iterator

import torch

from accel import clock, sharded_checkpoint
from accel.accelerator import Accelerator
from accel.batches import move
from accel.checkpoint import load as load_checkpoint
from accel.checkpoint import save as save_checkpoint
from accel.context import Context
from accel.errors import CheckpointError
from accel.loaders import release_workers
from accel.modules import compiled
from accel.randomness import loader_generators, rng_state, set_rng_state
from accel.report import Report
from accel.watch import Watch

_OPEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # the user's model -> weakref to its open Run


def open_run(model: torch.nn.Module) -> "Run | None":
    """The run that trains this model now (made by accelerate() and not closed), or None."""
    ref = _OPEN.get(model)
    run = ref() if ref is not None else None
    return run if run is not None and not run.closed else None


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
        self.drawn: Callable[[], None] | None = None  # told of every batch (the run watching for own accumulation)

    def __iter__(self) -> Iterator[Any]:
        batches = self.start_epoch()
        if not self._move and not self.transforms and self.drawn is None:
            yield from batches
            return
        for batch in batches:
            if self.drawn is not None:
                self.drawn()
            yield self.prepare(batch)

    def start_epoch(self) -> Any:
        """The wrapped loader's batches for the next epoch, as they come (its sampler told the epoch)."""
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        self.epoch += 1
        return self.loader

    def prepare(self, batch: Any) -> Any:
        """One batch as the plan wants it: on the device, through the batch transforms."""
        if self._move:
            batch = move(batch, self.device, self.non_blocking)
        for transform in self.transforms:
            batch = transform(batch)
        return batch

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
        self.journal = ctx.journal
        self.accelerators = list(accelerators)  # the applied ones, in plan order, each with its own state
        self.loader = (DeviceLoader(ctx.loader, ctx.device, ctx.decisions.non_blocking, ctx.batch_transforms)
                       if ctx.loader is not None else None)
        self._user_loader = ctx.user_loader
        self.steps = 0  # run.step() calls (one per batch), restored by run.load
        self.optimizer_steps = 0  # steps the optimizer really took (not skipped, not accumulating)
        self.closed = False
        self._contexts = [a for a in self.accelerators if a.overrides("forward_context")]
        self._unscalers = [a for a in self.accelerators if a.overrides("unscale_gradients")]
        self._backward = self._chain("backward", lambda loss: loss.backward())
        self._optimizer_step = self._chain("optimizer_step", lambda optimizer: optimizer.step() or True)
        self._step = self._chain("step", self._update)
        self._last_step = clock.now()  # the first step's time includes compile and warm-up
        self.watch = Watch(self, self.accelerators)  # the loop's own backward, step or accumulation, noticed
        if self.watch.needed:
            self.watch.watch_optimizers(ctx.journal, [self.optimizer, ctx.user_optimizer])
            if self.loader is not None:
                self.loader.drawn = self.watch.batch_drawn
        _OPEN[ctx.user_model] = weakref.ref(self)

    def _chain(self, hook: str, innermost: Callable) -> Callable:
        call = innermost
        for accelerator in reversed([a for a in self.accelerators if a.overrides(hook)]):
            call = (lambda method, proceed: lambda value: method(self, value, proceed))(getattr(accelerator, hook), call)
        return call

    def _update(self, optimizer: torch.optim.Optimizer) -> bool:
        """The innermost step: the optimizer's update (through the optimizer_step hooks), then zero_grad."""
        stepped = self._optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        return bool(stepped)

    @property
    def scaler(self):
        """The GradScaler of the plan (amp's, with fp16), or None: to read its scale; amp steps it."""
        return next((a.scaler for a in self.accelerators if getattr(a, "scaler", None) is not None), None)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return self.decisions.compute_dtype if any("precision.autocast" in a.provides for a in self._contexts) else None

    def autocast(self) -> contextlib.AbstractContextManager:
        """The contexts the plan chose for the forward pass and the loss: autocast, DDP's no_sync while
        accumulating... (a no-op when none did)."""
        return self._entered() if self._contexts else contextlib.nullcontext()

    @contextlib.contextmanager
    def _entered(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:  # entered at `with`; one that fails exits those before it
            for accelerator in self._contexts:
                context = accelerator.forward_context(self)
                if context is not None:
                    stack.enter_context(context)
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), through the plan's hooks (loss scaling, accumulation)."""
        self.watch.before_backward()
        self._backward(loss)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Make the gradients true gradients before reading them (clipping, logging a norm): a plan that scales
        the loss (amp with fp16) divides them back here, once per step. A no-op otherwise."""
        for accelerator in self._unscalers:
            accelerator.unscale_gradients(self, optimizer if optimizer is not None else self.optimizer)

    def step(self) -> bool:
        """The optimizer step through the plan's hooks, then zero_grad; call it once per batch.

        Returns True when the optimizer did not step: the GradScaler skipped it (inf/NaN gradients) or gradients
        are still being accumulated. A learning-rate scheduler steps when it returns False.
        """
        if self.optimizer is None:
            raise RuntimeError("run.step() needs an optimizer: pass one to accel.accelerate(model, optimizer, ...)")
        self.watch.before_step(self._has_gradients)
        self.watch.stepping = True
        try:
            stepped = self._step(self.optimizer)
        finally:
            self.watch.stepping = False
        self.steps += 1
        self.optimizer_steps += bool(stepped)
        now = clock.now()
        self.report.step_times.append(now - self._last_step)
        self._last_step = now
        return not stepped

    def _has_gradients(self) -> bool:
        return any(p.grad is not None for group in self.optimizer.param_groups for p in group["params"])

    def accelerator(self, name: str) -> Accelerator:
        """The applied accelerator of that name (its runtime state, e.g. grad_clipping's last norm)."""
        for accelerator in self.accelerators:
            if accelerator.name == name:
                return accelerator
        raise KeyError(f"no applied accelerator {name!r} in this run; applied: {[a.name for a in self.accelerators]}")

    def wrappers(self) -> list[torch.nn.Module]:
        """The model at each level, outermost first (compiled, DDP, ...) down to the module that trains."""
        levels = [self.model]
        if compiled(self.model) and not any(a.unwrap(self.model) is not self.model for a in self.accelerators):
            levels.append(self.model._orig_mod)  # your own torch.compile wrapper, kept outermost
        for accelerator in reversed(self.accelerators):
            inner = accelerator.unwrap(levels[-1])
            if inner is not levels[-1]:
                levels.append(inner)
        return levels

    def unwrap(self) -> torch.nn.Module:
        """The module under every wrapper (DDP, compile): your model itself, unless the report names it stale
        (prune and IPEX train a copy of their own). What to save, evaluate and average."""
        return self.wrappers()[-1]

    # --- state ---------------------------------------------------------------------------------------------------

    def state_dict(self, model: bool = True) -> dict[str, Any]:
        """Everything this process needs to continue the run exactly: the model, the optimizer, the counters, each
        accelerator's state, the loader's sampler and generators, and the random state. ``model=False`` leaves
        the model's and optimizer's state out (a sharded checkpoint writes them through DCP)."""
        sampler, generators = self._sampling()
        return {
            "plan": self.plan.to_dict(),
            **({"model": self.unwrap().state_dict(),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None} if model else {}),
            "optimizer_class": type(self.optimizer).__name__ if self.optimizer is not None else None,
            "accelerators": {a.name: a.state_dict() for a in self.accelerators},
            "step": self.steps,
            "optimizer_steps": self.optimizer_steps,
            "epoch": self.loader.epoch if self.loader is not None else 0,
            "sampler": {k: getattr(sampler, k) for k in ("seed", "epoch", "num_replicas") if hasattr(sampler, k)},
            "loader_generators": [g.get_state() for g in generators],
            "rng": rng_state(),
        }

    def state_problems(self, state: dict[str, Any]) -> list[str]:
        """Why a state does not fit this run (model keys and shapes, the optimizer, accelerators), or nothing."""
        current = self.unwrap().state_dict()
        problems = _model_problems(unprefixed(state["model"], current), current)
        problems += _optimizer_problems(state["optimizer"], self.optimizer, state.get("optimizer_class"))
        stray = sorted(set(state.get("accelerators", {})) - {a.name for a in self.accelerators})
        if stray:
            problems.append(f"state of accelerators this run did not apply: {stray}")
        return problems

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict() returned. Everything is checked first: a ValueError names every part that
        does not fit, with nothing changed; a restore that fails half-way puts the run back as it was."""
        state = {**state, "model": unprefixed(state["model"], self.unwrap().state_dict())}
        problems = self.state_problems(state)
        if problems:
            raise ValueError("; ".join(problems))
        backup = self._backup()
        try:
            self._restore(state)
        except Exception:
            self._restore(backup)
            raise

    def _backup(self) -> dict[str, Any]:
        """The run's state, with its tensors copied to host memory (no second copy of the weights on a GPU)."""
        state = self.state_dict()
        state["model"] = {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v
                          for k, v in state["model"].items()}
        state["optimizer"] = copy.deepcopy(state["optimizer"])  # load_state_dict casts it back to each device
        state["accelerators"] = copy.deepcopy(state["accelerators"])
        return state

    def _restore(self, state: dict[str, Any]) -> None:
        self.unwrap().load_state_dict(state["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.restore_progress(state)

    def restore_progress(self, state: dict[str, Any]) -> None:
        """Everything of state_dict() but the model and optimizer: accelerators, counters, sampling, randomness."""
        for accelerator in self.accelerators:
            accelerator.load_state_dict(state.get("accelerators", {}).get(accelerator.name, {}))
        self.steps, self.optimizer_steps = state["step"], state.get("optimizer_steps", state["step"])
        if self.loader is not None:
            self.loader.epoch = state["epoch"]
        sampler, generators = self._sampling()
        if "seed" in state.get("sampler", {}) and hasattr(sampler, "seed"):
            sampler.seed = state["sampler"]["seed"]
        for generator, saved in zip(generators, state.get("loader_generators", [])):
            generator.set_state(saved)
        set_rng_state(state["rng"])

    def _sampling(self):
        """The loader's sampler and every generator it draws from (its own, its sampler's, its batch sampler's)."""
        loader = getattr(self.loader, "loader", None)
        return getattr(loader, "sampler", None), loader_generators(loader)

    @property
    def sharded(self) -> bool:
        """Whether the run's state is sharded over the ranks (fsdp): its checkpoints are DCP folders."""
        return any(a.shards_parameters for a in self.accelerators)

    def save(self, path) -> None:
        """Checkpoint the run's state_dict(), with the plan and a checksum: to a file, or under fsdp to a folder
        of shards (accel.sharded_checkpoint).

        Every rank calls it. A file: rank 0 writes it atomically, with every rank's random state. A folder: every
        rank writes its shards, and the folder replaces the last one only once it is whole.
        """
        if self.sharded:
            sharded_checkpoint.save(self, path)
        else:
            save_checkpoint(self, path)

    def load(self, path) -> dict:
        """Restore a checkpoint written by run.save into this run; returns {"step", "epoch", "path"}. A sharded
        folder loads at any world size, and into a run without fsdp (the whole state in one process).

        Everything is checked before anything changes: a refused load leaves the run as it was.
        """
        if sharded_checkpoint.is_sharded_checkpoint(path):
            return sharded_checkpoint.load(self, path)
        if self.sharded:
            raise CheckpointError(f"{path}: under fsdp, run.load reads the folder of shards that run.save wrote "
                                  "(this is a single-file checkpoint of a run without fsdp)")
        return load_checkpoint(self, path)

    # --- lifetime ------------------------------------------------------------------------------------------------

    def hand_over(self, successor: "Run") -> None:
        """This run is replaced by another on the same model (accelerate() again, once per epoch or with another
        plan): the successor continues its counters, the loader's epoch and the state of every accelerator both
        plans apply; this run is closed (accelerate() already undid its changes)."""
        successor.steps, successor.optimizer_steps = self.steps, self.optimizer_steps
        successor.watch.backwards = self.watch.backwards  # a backward of this run that the successor steps
        kept = [f"steps={self.steps}", f"optimizer_steps={self.optimizer_steps}"]
        if successor.loader is not None and self.loader is not None:
            successor.loader.epoch = self.loader.epoch
            kept.append(f"epoch={self.loader.epoch}")
        mine = {a.name: a for a in self.accelerators}
        for accelerator in successor.accelerators:
            if accelerator.name in mine:
                try:
                    accelerator.load_state_dict(mine[accelerator.name].state_dict())
                    kept.append(f"{accelerator.name}'s state")
                except ValueError as error:
                    kept.append(f"{accelerator.name} started afresh ({error})")
        successor.report.continued = "the earlier run on this model, now closed: " + ", ".join(kept)
        self._release_loader()
        self.closed = True

    def _release_loader(self) -> None:
        if self.loader is not None and self.loader.loader is not self._user_loader:
            release_workers(self.loader.loader)

    def close(self) -> None:
        """Put your objects and the process back as they were before accelerate() (hooks, optimizer flags, threads,
        affinity, environment, backend flags, a process group accel started), keeping what was trained, and stop
        the workers of a loader the run rebuilt."""
        self._release_loader()
        self.journal.rollback()
        self.closed = True


def unprefixed(saved: dict, current: dict) -> dict:
    """A model state saved through the user's own torch.compile wrapper (accel 0.2 saved it so: keys starting
    with ``_orig_mod.``), keyed as the module inside it, which is what run.unwrap() is now."""
    prefix = "_orig_mod."
    if saved and all(k.startswith(prefix) for k in saved) and not any(k.startswith(prefix) for k in current):
        return {k[len(prefix):]: v for k, v in saved.items()}
    return saved


def _model_problems(saved: dict, current: dict) -> list[str]:
    problems = []
    missing, unexpected = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
    if missing:
        problems.append(f"the model's {missing[:5]}{' ...' if len(missing) > 5 else ''} are not in the checkpoint")
    if unexpected:
        problems.append(f"the checkpoint's {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''} are not in the model")
    shapes = [f"{k} {tuple(saved[k].shape)} vs {tuple(v.shape)}" for k, v in current.items()
              if k in saved and isinstance(v, torch.Tensor) and isinstance(saved[k], torch.Tensor)
              and tuple(saved[k].shape) != tuple(v.shape)]
    if shapes:
        problems.append("shapes differ (checkpoint vs model): " + "; ".join(shapes[:5]))
    return problems


def _optimizer_problems(saved: dict | None, optimizer, saved_class: str | None = None) -> list[str]:
    if saved_class and optimizer is not None and saved_class != type(optimizer).__name__:
        return [f"the checkpoint holds a {saved_class}'s state, this run's optimizer is a {type(optimizer).__name__}"]
    if (optimizer is None) != (saved is None):
        return [f"the checkpoint has {'an' if saved is not None else 'no'} optimizer state, this run has "
                f"{'one' if optimizer is not None else 'none'}"]
    if optimizer is None:
        return []
    groups, current = saved.get("param_groups", []), optimizer.param_groups
    sizes, mine = [len(g["params"]) for g in groups], [len(g["params"]) for g in current]
    if sizes != mine:
        return [f"the optimizer's param groups hold {mine} parameters, the checkpoint's {sizes}"]
    params = [p for g in current for p in g["params"]]
    index = [i for g in groups for i in g["params"]]
    wrong = [f"param {i}" for i, p in zip(index, params)
             for t in saved.get("state", {}).get(i, {}).values()
             if isinstance(t, torch.Tensor) and t.dim() and tuple(t.shape) != tuple(p.shape)]
    return [f"optimizer state of another shape for {wrong[:5]}"] if wrong else []
