"""Found from outside (attack3): what a checkpoint may set through run.load under plan="auto", and what a user's
accelerator's State may put into run.save that run.load then refuses."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from injectors import objects
from test_fault_security import crafted, saved

import accel
from accel import Accelerator, Keeps, Options, Stage, State, option
from accel.errors import CheckpointError


def auto_run(seed=1):
    model, optimizer, loader = objects(seed)
    return accel.accelerate(model, optimizer, loader, plan=accel.Auto(cache=False), device="cpu")


def test_run_load_under_auto_refuses_compile_options_from_a_checkpoint(tmp_path):
    path = crafted(saved(tmp_path), plan={"compile": {"options": {"cpp.cxx": [str(tmp_path / "not-a-compiler")]}}})
    run = auto_run()
    try:
        with pytest.raises(CheckpointError, match="compile.options"):
            run.load(path)
        assert "compile" not in run.current.plan.to_dict()
    finally:
        run.close()


def test_run_load_under_auto_names_the_file_whose_plan_is_unknown(tmp_path):
    path = crafted(saved(tmp_path), plan={"no_such_accelerator": {}})
    run = auto_run()
    try:
        with pytest.raises(CheckpointError, match="ckpt.pt"):
            run.load(path)
    finally:
        run.close()


# --- a user's accelerator, written as docs/lifecycle.md says ----------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class BestOptions(Options):
    decay: float = option(0.9, check=lambda d: None if 0 < d < 1 else "must be in (0, 1)", help="the average's decay")


@dataclass
class BestState(State):
    average: torch.nn.Module
    best: Any = None  # the best loss seen: a value the user's own code computed (numpy's, here)

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average.state_dict(), "best": self.best}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.average.load_state_dict(saved["average"])
        self.best = saved["best"]


class Best(Accelerator[BestOptions, BestState]):
    """An average of the weights and the best loss seen (a user's own accelerator, for this test)."""

    name = "attack3_best"
    stage = Stage.STEP
    keeps = Keeps("exact", note="trains exactly the plain loop's weights")
    requires = ("optimizer",)

    def apply(self, ctx) -> BestState:
        return BestState(copy.deepcopy(ctx.model).requires_grad_(False), changes={"decay": self.config.decay})


@pytest.fixture
def best():
    accel.register(Best)
    yield Best
    accel.unregister(Best.name)


def test_a_state_run_load_cannot_read_is_refused_by_run_save_naming_the_accelerator(tmp_path, best):
    model, optimizer, loader = objects()
    run = accel.accelerate(model, optimizer, loader, plan=["attack3_best"], device="cpu")
    run.state("attack3_best").best = np.float64(0.25)  # e.g. np.mean of the losses
    try:
        try:
            run.save(tmp_path / "ckpt.pt")
        except (CheckpointError, ValueError, TypeError) as error:  # refused at save, by name: the fix
            assert "attack3_best" in str(error)
            return
        model, optimizer, loader = objects(1)
        other = accel.accelerate(model, optimizer, loader, plan=["attack3_best"], device="cpu")
        try:
            other.load(tmp_path / "ckpt.pt")  # or loaded back whole
            assert other.state("attack3_best").best == 0.25
        finally:
            other.close()
    finally:
        run.close()


@dataclass(frozen=True, kw_only=True)
class LogOptions(Options):
    folder: Path = option(Path("runs"), (Path,), help="where the user's accelerator writes its logs")


class Log(Accelerator[LogOptions, State]):
    """A user's accelerator with a Path option (it decides and changes nothing: only its option matters here)."""

    name = "attack3_log"
    stage = Stage.STEP

    def apply(self, ctx) -> State:
        return State(changes={"folder": str(self.config.folder)})


def test_a_plan_with_a_path_option_loads_back_its_own_checkpoint(tmp_path):
    accel.register(Log)
    try:
        plan = [{"attack3_log": {"folder": tmp_path}}]
        model, optimizer, loader = objects()
        run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
        try:
            run.save(tmp_path / "ckpt.pt")
        except (CheckpointError, ValueError, TypeError) as error:  # refused at save, by name: also a fix
            assert "attack3_log" in str(error)
            return
        finally:
            run.close()
        model, optimizer, loader = objects(1)
        other = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
        try:
            other.load(tmp_path / "ckpt.pt")
        finally:
            other.close()
    finally:
        accel.unregister(Log.name)
