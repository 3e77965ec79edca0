"""accelerate(): decide and check the whole plan (the launch and the device first; every problem in one PlanError,
nothing changed), then place the model and apply the accelerators in order through a journal, all rolled back
if one fails."""
from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from accel import clock
from accel.errors import AccelerateError, PlanError, Problem, Skip, StaleWarning, loops_level
from accel.hardware import Hardware, install_hint, package_version, probe
from accel.modules import compiled
from accel.plan import Plan, PlanSpec
from accel.plan.contract import Accelerator, Capability, GradientSync, State, packages
from accel.run import Run, open_run
from accel.run.context import Context, Decisions, placement
from accel.run.interrupts import clean_up
from accel.run.journal import Journal
from accel.run.report import Report, Row
from accel.run.run import _OPEN
from accel.run.thread_warnings import captured

__all__ = ["AccelerateError", "accelerate", "decide"]


def _retract(ctx: Context, name: str) -> None:
    """Forget the decisions of an accelerator that stands aside (skipped after deciding)."""
    defaults = Decisions(device=ctx.decisions.device)
    for field, by in list(ctx.decisions.by.items()):
        if by == name:
            if field in ctx.decisions.extra:
                del ctx.decisions.extra[field]
            else:
                setattr(ctx.decisions, field, getattr(defaults, field))
            del ctx.decisions.by[field], ctx.decisions.why[field]


def prepare(model, optimizer, loader, plan: PlanSpec, device: Any = "auto", journal: Journal | None = None,
            hardware: Hardware | None = None) -> tuple[Context, list[Accelerator], dict[str, str]]:
    """Parse, decide and check the whole plan; raise one PlanError with every problem. Changes nothing.

    hardware: the machine to decide for (default: this one, probed)."""
    plan, problems = Plan.parse(plan)
    if not isinstance(model, torch.nn.Module):
        problems.append(Problem("model", "is not a torch.nn.Module", value=type(model).__name__))
        raise PlanError(problems)
    model = model._orig_mod if compiled(model) else model  # your torch.compile: the plan works inside it
    hardware = hardware or probe()
    decisions = placement(device, hardware, problems)
    if decisions is None:
        raise PlanError(problems)
    ctx = Context(model=model, optimizer=optimizer, loader=loader, hardware=hardware, plan=plan, decisions=decisions,
                  journal=journal or Journal())
    accelerators = [copy.copy(a) for a in plan]  # each run keeps its own state on its own objects
    skips: dict[str, str] = {}
    checked: dict[str, list[Problem]] = {}
    given = {"optimizer": optimizer, "loader": loader}
    for accelerator in accelerators:
        checked[accelerator.name] = [
            Problem(accelerator.name, f"needs the package {name!r}, which is not installed",
                    allowed=install_hint(name), kind="missing")
            for name in packages(type(accelerator)) if package_version(name) is None]
        checked[accelerator.name] += [
            Problem(accelerator.name, f"needs the {what}: pass one to accel.accelerate(model, optimizer, loader, ...)",
                    kind="missing") for what in accelerator.requires if what in given and given[what] is None]
        if checked[accelerator.name]:
            continue  # it cannot decide without them
        ctx.deciding = accelerator.name
        try:
            accelerator.decide(ctx)
        except Skip as skip:
            skips[accelerator.name] = skip.reason
            _retract(ctx, accelerator.name)
    ctx.deciding = ""
    for accelerator in accelerators:
        if accelerator.name not in skips and not checked[accelerator.name]:
            checked[accelerator.name] += accelerator.check(ctx)
        found = checked[accelerator.name]
        if accelerator.config.optional and found and all(p.kind == "missing" for p in found):
            skips[accelerator.name] = "optional, and " + "; ".join(p.message for p in found)
            _retract(ctx, accelerator.name)
        else:
            problems += found
    problems += ctx.problems
    if problems:
        raise PlanError(problems)
    return ctx, accelerators, skips


def decide(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, loader: Any = None,
           plan: PlanSpec = None, device: Any = "auto", hardware: Hardware | None = None) -> Decisions:
    """What the plan decides here (device, rank, dtype, threads, workers...), with nothing applied.

    hardware: decide for another machine than this one (a ``Hardware``, e.g. ``dataclasses.replace(accel.probe(),
    isa=("avx2", "fma"))`` for a CPU without native bf16). Raises the PlanError accelerate() would raise.
    """
    enabled = torch.is_grad_enabled()  # as accelerate(): a check may copy the model under torch's no_grad
    try:
        ctx, _, _ = prepare(model, optimizer, loader, plan, device, hardware=hardware)
    except BaseException:
        try:  # twice if a Ctrl-C lands on the call (accel.run.interrupts)
            clean_up(torch.set_grad_enabled, enabled)
        except BaseException:
            clean_up(torch.set_grad_enabled, enabled)
            raise
        raise
    return ctx.decisions


def _place(ctx: Context) -> None:
    """Put the model (and any optimizer state) on the run's device, recorded so a failure can undo it."""
    device = ctx.device
    if all(t.device == device for t in [*ctx.model.parameters(), *ctx.model.buffers()]):
        return
    optimizer = ctx.optimizer
    if optimizer is not None and optimizer.state:  # recorded first, so it is undone after the parameters go back
        saved = {param: dict(state) for param, state in optimizer.state.items()}
        ctx.journal.change(f"optimizer state to {device}", lambda: None,
                           lambda: (optimizer.state.clear(), optimizer.state.update(saved)), kind="setup")
    ctx.journal.move_module(ctx.model, device)
    if optimizer is not None and optimizer.state:  # load_state_dict casts the state to each parameter's device
        optimizer.load_state_dict(optimizer.state_dict())


def accelerate(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, loader: Any = None,
               plan: PlanSpec = None, device: Any = "auto",
               resolve: Callable[..., tuple[PlanSpec, Any]] | None = None) -> Run:
    """Apply a plan of accelerators to the user's model, optimizer and loader and return a Run.

    Every problem in the plan is raised together in one PlanError before anything is touched; a failure while
    applying rolls every change back and raises AccelerateError. ``resolve(model, optimizer, loader, device) ->
    (plan, result)`` chooses the plan once an earlier run on the model is undone (accel.accelerate passes
    accel.tune's for plan="auto" apart); its result is the report's ``tuning``.
    """
    # torch's autograd switch as it came: a Ctrl-C on the call of a no_grad block's __exit__ (prune's check copies
    # the model under one) skips torch's own restore, so the rollback puts it back too
    enabled = torch.is_grad_enabled()
    yours = model if compiled(model) else None  # torch.compile(model) of your own: the plan works inside it
    model = model._orig_mod if yours is not None else model
    earlier = open_run(model)
    # closing the run open on this model would drop the gradients a wrapper holds unreduced (FSDP2 between an
    # accumulation's micro-steps): refused here, before anything changes
    holders = [a.name for a, state in earlier.playing(GradientSync) if a.held_gradients(state)] if earlier else []
    if holders:
        raise PlanError([Problem(holders[0], f"accelerate() again in the middle of accumulating gradients under "
                                 f"{holders[0]}: it holds them unreduced in its own buffers, which closing the run "
                                 f"open on this model would drop", field="accelerate",
                                 allowed="call it after an optimizer step (run.step() returned False)",
                                 kind="conflict")])
    started = clock.now()
    journal = Journal()
    if earlier is not None:  # one run trains a model at a time: the earlier one's changes are undone first (before
        handed = earlier.journal.detach()  # plan="auto" measures copies of it), and put back if this plan is
        journal.change("the earlier run on this model closed", handed.undo_all,  # refused or fails
                       lambda: (handed.redo_all(), earlier.journal.attach(handed)), kind="setup")
    states: dict[str, State] = {}  # each applied accelerator's per-run state, what its hooks are handed
    replaced: dict[str, str] = {}  # "model"/"optimizer" -> the accelerator that replaced the user's
    current = ""  # what is being applied ("": the plan is still being chosen and checked)
    try:
        plan, tuning = resolve(yours if yours is not None else model, optimizer, loader, device) if resolve \
            else (plan, None)
        ctx, accelerators, skips = prepare(model, optimizer, loader, plan, device, journal)
        machine = ctx.hardware
        report = Report(device=str(ctx.device), tuning=tuning, hardware=(
            f"{machine.physical_cores} physical cores ({len(machine.cpus_allowed)} CPUs allowed), "
            f"{','.join(machine.isa) or 'no AVX2'}, OpenMP {machine.openmp}, torch {machine.versions['torch']}"))
        current = "placement"
        _place(ctx)
        for accelerator in accelerators:
            current = accelerator.name
            row = Row(accelerator.name, accelerator.stage.name.lower(), "skipped")
            report.rows.append(row)
            if accelerator.name in skips:
                row.reason = skips[accelerator.name]
                continue
            model_before, optimizer_before = ctx.model, ctx.optimizer
            with captured() as caught:  # this thread's warnings only, no filter left behind (thread_warnings)
                ctx.deciding = accelerator.name  # a decision made while applying (fsdp's blocks) is its own
                try:
                    result = accelerator.apply(ctx)
                    state = result if isinstance(result, State) else State(changes=dict(result or {}))
                    row.changes, row.status = state.changes, "applied"
                    states[accelerator.name] = state
                except Skip as skip:
                    row.reason = skip.reason
                    _retract(ctx, accelerator.name)
                finally:
                    ctx.deciding = ""
            for warning in caught:  # keep them in the report and still show them to the user, at the loop's line
                row.warnings.append(str(warning.message))
                warnings.warn(warning.message, warning.category, stacklevel=loops_level())
            state = states.get(accelerator.name)  # (a wrapper keeps the model live)
            if state is not None and accelerator.unwrap(state, ctx.model) is not model_before:
                replaced.setdefault("model", accelerator.name)
            if ctx.optimizer is not optimizer_before:
                replaced.setdefault("optimizer", accelerator.name)
        current = "the run"  # until it is returned, a Ctrl-C (or a StaleWarning made an error) rolls back too
        applied = [a for a in accelerators if a.name in states]
        report.decisions = ctx.decisions.summary()
        if yours is not None:
            ctx.model, report.decisions["your_compile"] = keep_your_compile(yours, ctx.model, applied)
        report.stale = {what: STALE[what].format(name=name) for what, name in replaced.items()}  # never silent
        for text in report.stale.values():
            warnings.warn(f"accel: {text}", StaleWarning, stacklevel=loops_level())
        run = Run(ctx, report, applied, states)
        if earlier is not None:
            earlier.hand_over(run)
        report.setup_s = clock.now() - started
        ctx.journal.commit()  # last: no check for signals lies between it and the return
    except BaseException as error:
        try:  # twice if a Ctrl-C lands on the call (accel.run.interrupts): rolling back again changes nothing
            clean_up(_roll_back, journal, earlier, model, enabled)
        except BaseException:
            clean_up(_roll_back, journal, earlier, model, enabled)
            raise
        if current and isinstance(error, Exception) and not isinstance(error, PlanError):
            raise AccelerateError(f"{current} failed while being applied: {type(error).__name__}: {error}; every "
                                  "change was rolled back (your objects and the process are as they were)") from error
        raise
    return run


def _roll_back(journal: Journal, earlier: Run | None, model: torch.nn.Module, enabled: bool) -> None:
    """Undo a plan that failed or was interrupted before its run was returned; the run open on the model before is
    open again, and autograd as it was (``enabled``)."""
    try:
        journal.rollback()
    except RuntimeError as undo_error:  # said, never hiding why the plan failed
        warnings.warn(f"accel: {undo_error}", stacklevel=loops_level())
    if earlier is not None:
        earlier.closed = False
        _OPEN[model] = weakref.ref(earlier)
    else:
        _OPEN.pop(model, None)
    torch.set_grad_enabled(enabled)


def keep_your_compile(yours: torch.nn.Module, model: torch.nn.Module, applied: list[Accelerator]):
    """The run's model for a model the user compiled: the plan's compile replaces their wrapper; else their own
    wrapper where the plan wrapped nothing, or their compile settings around the plan's wrappers (DDP...)."""
    if any(Capability.MODEL_COMPILE in a.provides for a in applied):
        return model, "replaced by the plan's compile (run.model); run.unwrap() is the module inside yours"
    if model is yours._orig_mod:
        return yours, "kept: run.model is your compiled model; run.unwrap() is the module inside it"
    wrapper = yours.dynamo_ctx(model)  # as your torch.compile made yours (a kind of yours may construct otherwise)
    wrapper.__class__ = type(yours)  # your own kind: its methods (a __call__ of its own) are what your training runs
    return (wrapper,
            "kept outermost: your torch.compile settings wrap the plan's wrappers (run.model); run.unwrap() is the "
            "module inside yours")


STALE = {  # what the user holds that no longer drives the training, and what to use instead
    "model": ("{name} replaced it with its own copy, which is what trains: your model.train()/eval(), hooks, EMA "
              "and state_dict() do not reach the training; use run.unwrap() (and run.model.train()/.eval()) instead"),
    "optimizer": ("{name} replaced it with its own, which is what steps: schedulers, learning-rate writes, "
                  "add_param_group and state_dict() on yours do not reach the training; use run.optimizer instead"),
}

