"""What a run saves and restores (a mixin of accel.run.Run): its whole state as a dict, the check that a saved one
fits, run.save and run.load; and the plan a checkpoint of either format was saved with (``saved_plan``)."""
from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch

import accel.run.sharded_checkpoint as sharded_checkpoint
from accel.errors import CheckpointError, PlanError, brief
from accel.plan import Plan, same_options
from accel.plan.contract import Capability
from accel.plan.untrusted import code_problems
from accel.randomness import loader_generators, rng_state, set_rng_state
from accel.run.checkpoint import FORMAT, decode_plan, encode_plan, on_rank_zero, plain_numbers, write_state, written
from accel.run.checkpoint import read as read_checkpoint
from accel.run.checkpoint_fit import fit_problems, seed_value, this_rank, training_plan
from accel.run.interrupts import autograd_kept, clean_up


class RunState:
    """run.state_dict(), run.load_state_dict(), run.save(), run.load(): see accel.run.Run for the rest."""

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
            "accelerators": {a.name: self.accelerator_state_dict(a.name) for a in self.accelerators},
            "step": self.steps,
            "optimizer_steps": self.optimizer_steps,
            "holding_gradients": self.holding_gradients,  # held by a step schedule: each rank's own, unreduced
            "epoch": self.loader.epoch if self.loader is not None else 0,
            "sampler": {k: value for k in ("seed", "epoch", "num_replicas")
                        if hasattr(sampler, k) and seed_value(value := plain_numbers(getattr(sampler, k)))},
            "loader_generators": [g.get_state() for g in generators],
            "rng": rng_state(),
        }

    def state_problems(self, state: dict[str, Any]) -> list[str]:
        """Why a state does not fit this run (model keys and shapes, the optimizer, accelerators), or nothing."""
        return fit_problems(self, state, state["model"], self.unwrap().state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict() returned. Everything is checked first: a ValueError names every part that
        does not fit, with nothing changed; a restore that fails half-way, or is interrupted (Ctrl-C), puts the run
        back as it was."""
        problems = self.state_problems(state)
        if problems:
            raise ValueError("; ".join(problems))
        self.restore_or_put_back(self._restore, state, self._backup())

    def restore_or_put_back(self, restore: Callable[[Any], None], state: Any, backup: Any) -> None:
        """restore(state); one that fails half-way, or is interrupted (a Ctrl-C), restores the backup: never a model
        half from the checkpoint, counters from before."""
        try:
            with autograd_kept():
                restore(state)
        except BaseException:
            try:  # twice if a Ctrl-C lands on the call (accel.run.interrupts)
                clean_up(restore, backup)
            except BaseException:
                clean_up(restore, backup)
                raise
            raise

    def _backup(self) -> dict[str, Any]:
        """The run's state, its tensors copied: the model's to host memory (no second copy of the weights on a GPU),
        the optimizer's as they are (its load_state_dict casts them back to each device)."""
        state = self.state_dict()
        model = {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v
                 for k, v in state["model"].items()}
        return {**state, "model": model, **copy.deepcopy({k: state[k] for k in ("optimizer", "accelerators")})}

    def _restore(self, state: dict[str, Any]) -> None:
        self.unwrap().load_state_dict(state["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.restore_progress(state)

    def restore_progress(self, state: dict[str, Any]) -> None:
        """Everything of state_dict() but the model and optimizer: accelerators, counters, sampling, randomness."""
        for accelerator in self.accelerators:
            self.load_accelerator_state(accelerator.name, state.get("accelerators", {}).get(accelerator.name, {}))
        self.steps, self.optimizer_steps = state["step"], state.get("optimizer_steps", state["step"])
        self.holding_gradients = state.get("holding_gradients", False)
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
        return any(Capability.MODEL_SHARDED in a.provides for a in self.accelerators)

    def save(self, path) -> None:
        """Checkpoint the run's state_dict(), with the plan and a checksum: to a file, or under fsdp to a folder
        of shards (accel.run.sharded_checkpoint).

        Every rank calls it. A file: rank 0 writes it atomically, with every rank's random state. A folder: every
        rank writes its shards, and the folder replaces the last one only once it is whole.
        """
        with autograd_kept():
            if self.sharded:
                sharded_checkpoint.save(self, path)
            else:
                state = written(self, self.state_dict(), FORMAT)
                on_rank_zero(lambda: write_state(Path(path), state, Path(path)), Path(path))

    def load(self, path) -> dict:
        """Restore a checkpoint written by run.save into this run; returns {"step", "epoch", "path"}. A sharded
        folder loads at any world size, and into a run without fsdp (the whole state in one process).

        Everything is checked before anything changes: a refused load leaves the run as it was.
        """
        return load_saved(self, path)


def load_saved(run, path, saved: Saved | None = None) -> dict:
    """run.load(path), of either format; ``saved``: the checkpoint as read_saved(path) read it (plan="auto" reads it
    once, for its plan, its fit and this load). Shards load into the plan they were saved with but for ddp and fsdp."""
    with autograd_kept():
        if run.sharded and not Path(path).is_dir():  # a sharded checkpoint is a folder, a single-file one a file
            raise CheckpointError(f"{path}: under fsdp, run.load reads the folder of shards that run.save wrote "
                                  "(this is a single-file checkpoint of a run without fsdp)")
        saved = saved or read_saved(path)
        where, state = saved.where if saved.sharded else path, saved.state
        mine, compared = encode_plan(run.plan.to_dict()), training_plan if saved.sharded else dict
        if not same_options(compared(state["plan"]), compared(mine)):
            raise CheckpointError(f"{where} was saved with the plan {brief(state['plan'], 300)}, but this run has "
                                  f"{brief(mine, 300)}; create the run with "
                                  f"plan=accel.run.state.saved_plan({str(where)!r})" + (
                                      " (or that plan with other ddp and fsdp options: the shards load at any world "
                                      "size, or in one process)" if saved.sharded else ""))
        part, problems = this_rank(state)
        state = {**state, **part}
        if saved.sharded:
            model, optimizer = sharded_checkpoint.states(run, where)
            problems += sharded_checkpoint.fit_problems(run, state, saved.shards, model)
        else:
            problems += run.state_problems(state)
        if problems:
            raise CheckpointError(f"{where} does not fit this run; nothing was loaded: " + "; ".join(problems))
        if saved.sharded:
            state, backup = sharded_checkpoint.load(run, where, state, saved.shards, model, optimizer)
        restore = partial(sharded_checkpoint.put, run) if saved.sharded else run._restore
        try:
            run.restore_or_put_back(restore, state, backup if saved.sharded else run._backup())
        except Exception as error:
            raise CheckpointError(f"{where} could not be restored ({type(error).__name__}: {error}); the run was put "
                                  "back as it was") from error
        return {"step": state["step"], "epoch": state["epoch"], "path": str(where)}


class Saved(NamedTuple):
    """A checkpoint of either format, read and checked whole (checksum, manifest): its file or step folder, its
    state (a sharded one's accel.pt), and a sharded one's DCP metadata (``shards``; None for a file)."""
    where: Path
    state: dict[str, Any]
    shards: Any = None

    @property
    def sharded(self) -> bool:
        return self.shards is not None


def read_saved(path) -> Saved:
    """The checkpoint at path (a file, or a sharded one's folder), read once and checked: a CheckpointError names
    what is wrong."""
    if Path(path).is_dir():
        return Saved(*sharded_checkpoint.read(path))
    return Saved(Path(path), read_checkpoint(path))


def saved_plan(path):
    """The plan a checkpoint was saved with: accelerate(model, optimizer, loader, plan=saved_plan(path)). Built
    only from what a plan file could say; an option that would run a program or import is refused. A sharded
    checkpoint's folder gives the plan its accel.pt holds."""
    return plan_of(path, read_saved(path).state["plan"])


def plan_of(path, saved: dict[str, dict]):
    """The plan a checkpoint at path holds as data (``saved``), built as saved_plan builds it."""
    options = decode_plan(saved, path)
    refused = code_problems(options)
    if refused:
        raise CheckpointError(f"{path}: the plan saved there sets {refused[0]}; accel takes that only from your own "
                              "code: build the plan yourself and pass it to accelerate()")
    try:
        return Plan(options)
    except PlanError as error:
        raise CheckpointError(f"{path}: the plan saved there is not one accel can build: {error}") from None
