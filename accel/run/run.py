"""The object the training loop talks to: run.model, run.optimizer, run.loader, run.autocast(), run.backward(loss),
run.step(). It trains the user's own objects (a wrapper or a replacement is reported), chains the applied
accelerators' runtime hooks in plan order (the earliest outermost; innermost ``loss.backward()``, the optimizer's
update and ``zero_grad``) and asks those that play a role for the rest: run.scaler and run.unscale_gradients()
(``LossScaler``), run.accumulating (``StepSchedule``), gradient reduction (``GradientSync``)."""
from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from accel import clock
from accel.errors import LoopError, StaleWarning, loops_level
from accel.modules import compile_seconds, compiled
from accel.plan.contract import Accelerator, Capability, GradientSync, LossScaler, State, StepSchedule, overrides
from accel.run.context import Context
from accel.run.device_loader import DeviceLoader
from accel.run.interrupts import autograd_kept
from accel.run.report import Report
from accel.run.state import RunState
from accel.run.watch import Watch

R = TypeVar("R")
_OPEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # the user's model -> weakref to its open Run


def open_run(model: torch.nn.Module) -> Run | None:
    """The run that trains this model now (made by accelerate() and not closed), or None."""
    ref = _OPEN.get(model)
    run = ref() if ref is not None else None
    return run if run is not None and not run.closed else None


class Run(RunState):
    """The accelerated training objects. Use run.model, run.optimizer and run.loader in your loop."""

    def __init__(self, ctx: Context, report: Report, accelerators: list[Accelerator], states: dict[str, State]):
        self.model = ctx.model
        self.optimizer = ctx.optimizer
        self.device = ctx.device
        self.plan = ctx.plan
        self.report = report
        self.decisions = ctx.decisions
        self.journal = ctx.journal
        self.accelerators = list(accelerators)  # the applied ones, in plan order
        self.states = {a.name: states[a.name] for a in self.accelerators}  # what apply returned
        self.loader = (DeviceLoader(ctx.loader, ctx.device, ctx.decisions.non_blocking, ctx.batch_transforms,
                                    rebuilt=ctx.loader is not ctx.user_loader) if ctx.loader is not None else None)
        self.steps = 0  # run.step() calls (one per batch), restored by run.load
        self.optimizer_steps = 0  # steps the optimizer really took (not skipped, not accumulating)
        self.holding_gradients = False  # the last run.step() was held by a step schedule: the gradients accumulate
        self.closed = False
        self._closed_used = False  # the loop went on with it once closed (said once)
        self.taken_over = False  # accelerate() again on its model closed it (hand_over)
        self._contexts = [a for a in self.accelerators if overrides(a, "forward_context")]
        self._scalers = self.playing(LossScaler)
        self._schedules = self.playing(StepSchedule)
        self._syncing = self.playing(GradientSync)
        self._synced: bool | None = None  # what the wrappers were last told (None: not yet)
        self._backward = self._chain("backward", lambda loss: loss.backward())
        self._optimizer_step = self._chain("optimizer_step", lambda optimizer: optimizer.step() or True)
        self._step = self._chain("step", self._update)
        self._last_step = clock.now()  # the first step's time includes compile and warm-up
        self._compiled_s = compile_seconds()  # and recompiles (a new sequence length) land in later steps
        self.watch = Watch(self, ctx.journal, ctx.user_optimizer)  # the loop's own backward, step... noticed
        self._sync()
        _OPEN[ctx.user_model] = weakref.ref(self)

    def playing(self, role: type[R]) -> list[tuple[R, State]]:
        """The applied accelerators that play a role (accel.plan.contract), each with its state, in plan order."""
        return [(a, self.states[a.name]) for a in self.accelerators if isinstance(a, role)]

    def _chain(self, hook: str, innermost: Callable) -> Callable:
        call = innermost
        for accelerator in reversed([a for a in self.accelerators if overrides(a, hook)]):
            call = functools.partial(_hop, getattr(accelerator, hook), self, self.states[accelerator.name], call)
        return call

    def _update(self, optimizer: torch.optim.Optimizer) -> bool:
        """The innermost step: the optimizer's update (through the optimizer_step hooks), then zero_grad."""
        stepped = self._optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        self.holding_gradients = False
        return bool(stepped)

    @property
    def scaler(self):
        """The GradScaler of the plan (amp's, with fp16), or None: to read its scale; amp steps it."""
        return next((s for a, state in self._scalers if (s := a.grad_scaler(state)) is not None), None)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        autocasts = any(Capability.PRECISION_AUTOCAST in a.provides for a in self._contexts)
        return self.decisions.compute_dtype if autocasts else None

    # --- roles: what the run asks of the accelerators that play them ------------------------------------------

    @property
    def accumulating(self) -> bool:
        """Whether the step in progress only accumulates gradients (a step schedule holds its update)."""
        return any(a.accumulating(state) for a, state in self._schedules)

    def held_gradients(self) -> list[torch.Tensor]:
        """Gradients a wrapper holds unreduced, not yet in ``.grad`` (FSDP2 while accumulating)."""
        return [g for a, state in self._syncing for g in a.held_gradients(state)]

    def _sync(self, release: bool = False) -> None:
        """Tell the distribution wrappers whether the next forward and backward reduce gradients: not while a step
        schedule accumulates (DDP's no_sync, FSDP's set_requires_gradient_sync(False)), whatever the loop enters.
        ``release``: a schedule stood aside (accel/run/watch.py), so what the wrappers held while reduction was off
        reaches the loop's own step now, not the next synced backward."""
        enabled = not self.accumulating
        if self._syncing and enabled is not self._synced:
            for accelerator, state in self._syncing:
                accelerator.gradient_sync(self, state, enabled)
            for accelerator, state in self._syncing if release and enabled and self._synced is False else ():
                accelerator.release_held_gradients(self, state)
            self._synced = enabled

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The contexts the plan chose for the forward pass and the loss (autocast), and torch's autograd switch put
        back if the block raises (a compiled forward raising inside a ``no_grad`` region leaves it off)."""
        self._closed_said("with run.autocast()")
        with contextlib.ExitStack() as stack:  # entered at `with`; one that fails exits those before it
            stack.enter_context(autograd_kept())
            for accelerator in self._contexts:
                context = accelerator.forward_context(self, self.states[accelerator.name])
                if context is not None:
                    stack.enter_context(context)
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), through the plan's hooks (loss scaling, accumulation)."""
        self._closed_said("run.backward(loss)")
        self.watch.before_backward(self)
        self._backward(loss)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Make the gradients true gradients before reading them (clipping, logging a norm): a plan that scales
        the loss (amp with fp16) divides them back here, once per step. A no-op otherwise."""
        for accelerator, state in self._scalers:
            accelerator.unscale_gradients(self, state, optimizer if optimizer is not None else self.optimizer)

    def step(self) -> bool:
        """The optimizer step through the plan's hooks, then zero_grad; call it once per batch.

        Returns True when the optimizer did not step (the GradScaler skipped it, or gradients accumulate): a
        learning-rate scheduler steps when it returns False."""
        if self.optimizer is None:
            raise LoopError("run.step() needs an optimizer: pass one to accel.accelerate(model, optimizer, ...), or, "
                            "where your loop updates the weights itself, call nothing in its place")
        self._closed_said("run.step()")
        self.watch.before_step(self)
        self.watch.stepping = self.holding_gradients = True  # until the innermost step zeroes them
        try:
            stepped = self._step(self.optimizer)
        finally:
            self.watch.stepping = False
            self._sync()
        self.watch.after_step(stepped, self.optimizer)
        self.steps += 1
        self.optimizer_steps += bool(stepped)
        now, compiled = clock.now(), compile_seconds()  # torch.compile compiled in this step: warm-up, not its time
        self.report.step_times.append(now - self._last_step, compiled_s=compiled - self._compiled_s)
        self._compiled_s = compiled
        self._last_step = now
        return not stepped

    def _closed_said(self, call: str) -> None:
        """A loop that goes on with a closed run (accelerate() again took it over and the loop kept the old name, or
        it closed it early) trains through a plan that no longer applies: said once, at the loop's line."""
        if self.closed and not self._closed_used:
            self._closed_used = True
            warnings.warn(f"accel: {call} on a closed run (run.close(), or accelerate() again on its model took it "
                          "over): its plan's changes are undone and a newer run's counters, schedule and checkpoints "
                          "do not see this; use the run accelerate() returned last", StaleWarning,
                          stacklevel=loops_level())

    def save(self, path) -> None:
        if self.taken_over:  # its plan and counters, not the newer run's (one you closed saves what it trained)
            self._closed_said("run.save()")
        super().save(path)

    def load(self, path) -> dict:
        if self.taken_over:  # into a run no loop should use: the newer run resumes nothing
            self._closed_said("run.load()")
        return super().load(path)

    def accelerator(self, name: str) -> Accelerator:
        """The applied accelerator of that name: its options are ``.config``; its run state is ``run.state(name)``."""
        if name not in self.states:
            raise KeyError(f"no applied accelerator {name!r} in this run; applied: {list(self.states)}")
        return next(a for a in self.accelerators if a.name == name)

    def state(self, name: str) -> State:
        """The per-run state of the applied accelerator of that name (grad_clipping's ``last_norm``...)."""
        return self.states[self.accelerator(name).name]

    def accelerator_state_dict(self, name: str) -> dict[str, Any]:
        """What run.save keeps of one accelerator (its state's state_dict)."""
        return self.states[name].state_dict()

    def load_accelerator_state(self, name: str, saved: dict[str, Any]) -> None:
        """Restore one accelerator's saved state (ValueError, nothing changed, when it does not fit)."""
        try:
            self.states[name].load_state_dict(saved)
        except (RuntimeError, KeyError, TypeError) as error:  # torch's load_state_dict says a mismatch so
            raise ValueError(f"{name}'s saved state does not fit: {type(error).__name__}: {error}") from error
        self.watch.held = None  # the gradients are the checkpoint's now (grad_accumulation's), not the loop's doing
        self._sync()

    def wrappers(self) -> list[torch.nn.Module]:
        """The model at each level, outermost first (compiled, DDP, ...) down to the module that trains."""
        levels = [self.model]
        if compiled(self.model) and not any(a.unwrap(self.states[a.name], self.model) is not self.model
                                            for a in self.accelerators):
            levels.append(self.model._orig_mod)  # your own torch.compile wrapper, kept outermost
        for accelerator in reversed(self.accelerators):
            inner = accelerator.unwrap(self.states[accelerator.name], levels[-1])
            if inner is not levels[-1]:
                levels.append(inner)
        return levels

    def unwrap(self) -> torch.nn.Module:
        """The module under every wrapper (DDP, compile): your model itself, unless the report names it stale
        (prune and IPEX train a copy of their own). What to save, evaluate and average."""
        return self.wrappers()[-1]

    # --- lifetime ------------------------------------------------------------------------------------------------

    def hand_over(self, successor: Run) -> None:
        """accelerate() again on the model replaced this run (its changes undone already): the successor continues
        its counters, the loader's epoch and the state of every accelerator both plans apply; this run is closed."""
        successor.steps, successor.optimizer_steps = self.steps, self.optimizer_steps
        successor.holding_gradients = self.holding_gradients
        successor.watch.backwards = self.watch.backwards  # a backward of this run that the successor steps
        kept = [f"steps={self.steps}", f"optimizer_steps={self.optimizer_steps}"]
        if successor.loader is not None and self.loader is not None:
            successor.loader.epoch = self.loader.epoch
            kept.append(f"epoch={self.loader.epoch}")
        for name in [n for n in successor.states if n in self.states]:  # both plans apply it (in plan order)
            try:
                successor.load_accelerator_state(name, self.accelerator_state_dict(name))
                kept.append(f"{name}'s state")
            except ValueError as error:
                kept.append(f"{name} started afresh ({error})")
        successor.report.continued = "the earlier run on this model, now closed: " + ", ".join(kept)
        if self.loader is not None:
            self.loader.hand_over()
        self.closed = self.taken_over = True

    def close(self) -> None:
        """Put your objects and the process back as they were before accelerate() (hooks, flags, threads, affinity,
        environment, a process group), keeping what was trained; a rebuilt loader's workers stop (an epoch of it that
        goes on raises, saying so). A run another took over (closed by it) is left as the hand-over left it: its
        loader's workers stop once no epoch is open (the new run's may read it, the loop may finish its epoch)."""
        if self.loader is not None and self.loader.rebuilt and not self.loader.handed_over:
            self.loader.stop_workers("run.loader: the run was closed during this epoch, and the worker processes of "
                                     "the loader it rebuilt are stopped; iterate your own loader, or a new run's")
        self.journal.rollback()
        self.closed = True


def _hop(method: Callable, run: Run, state: State, proceed: Callable, value: Any) -> Any:
    """One link of a hook chain: the accelerator's hook, handed what goes on to the next."""
    return method(run, state, value, proceed)
