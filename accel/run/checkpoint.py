"""Checkpoint files of a Run: the file format and its integrity checks. The run owns what is in them
(``Run.state_dict()`` / ``Run.load_state_dict()``).

Call run.save(path) on every rank: the random states and per-rank accelerator states are gathered from all
ranks, rank 0 writes to a temporary file in the same folder and renames it over the old one (a crash mid-save
leaves the previous checkpoint whole), and every rank returns once the file is in place. The file holds a
checksum over its tensors.

run.load(path) checks everything before changing anything: that the file is a whole accel checkpoint
(empty, truncated, corrupted or foreign files are refused, naming the file and what is wrong), that its
tensors match their checksum, that it was saved under the same plan (the plan decides the model's shapes),
and that the state fits this run (``Run.load_state_dict`` checks and restores, or puts the run back). Every
error is a CheckpointError.
"""
from __future__ import annotations

import hashlib
import reprlib
import sys
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from accel.errors import CheckpointError, PlanError
from accel.files import disk_full, space, write_atomically
from accel.hardware.launcher import barrier, rank
from accel.plan import Plan, same_options
from accel.plan.untrusted import code_problems
from accel.run.checkpoint_fit import gathered, layout_problems, rank_problems, this_rank

FORMAT = 2
CALLABLE = "__callable__"


# --- the plan, as data a checkpoint can hold -----------------------------------------------------------------

def encode_plan(plan_dict: dict[str, dict]) -> dict[str, dict]:
    """The plan's options with functions written as their import path (tensors stay tensors)."""
    def encode(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: encode(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(encode(v) for v in value)
        if callable(value) and not isinstance(value, (torch.Tensor, type)):
            return {CALLABLE: f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"}
        return value

    return encode(plan_dict)


def decode_plan(encoded: dict[str, dict], path: Any = "") -> dict[str, dict]:
    """Back to options, each function found where it was saved from. A checkpoint is data anyone may have
    written, so nothing it names is imported (importing runs a module's code): a function is found only in a
    module this process has already imported, outside the standard library and accel, as the plain function
    defined there under that name (``resolve``). One that cannot be found is an error naming it: only you can pass
    it again."""
    def decode(value: Any, where: str) -> Any:
        if isinstance(value, dict) and set(value) == {CALLABLE}:
            reference = value[CALLABLE]
            found = resolve(reference) if isinstance(reference, str) else None
            if found is None:
                module = reference.partition(":")[0] if isinstance(reference, str) else ""
                why = (f"its module {module!r} is not imported, and accel imports nothing a checkpoint names: import "
                       "it yourself first, or" if module and module not in sys.modules and "<" not in reference
                       else "which cannot be imported (a lambda or a local function, or not a function of yours):")
                named = reference if isinstance(reference, str) and len(reference) < 300 else brief(reference)
                raise CheckpointError(f"{path}: the plan's {where} was {named}, {why} build the plan "
                                      "yourself with the same function and pass it to accelerate()")
            return found
        if isinstance(value, dict):
            return {k: decode(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(decode(v, where) for v in value)
        return value

    return decode(encoded, "")


def resolve(reference: str) -> Callable | None:
    """The function ``module:qualname`` names, or None: looked up without importing anything and without running
    any code (a module's own ``__getattr__`` may import: only its ``__dict__`` is read), in a module already
    imported, neither the standard library's nor accel's; it must be a plain Python function whose own module and
    qualified name are these (not another object reached through them)."""
    module_name, _, qualname = reference.partition(":")
    module, top = sys.modules.get(module_name), module_name.partition(".")[0]
    if module is None or top in sys.stdlib_module_names or top == "accel" or not qualname:  # never a plan's option:
        return None  # the standard library's and accel's own functions (launchers, files, processes) stay out of reach
    found: Any = module
    for part in qualname.split("."):
        found = vars(found).get(part) if isinstance(found, (types.ModuleType, type)) else None
        if isinstance(found, staticmethod):
            found = found.__func__
    if (isinstance(found, types.FunctionType) and found.__module__ == module_name
            and found.__qualname__ == qualname):
        return found
    return None


def brief(value: Any) -> str:
    """A short repr of a value read from a file, however large or deep (a hostile file may hold anything)."""
    return _BRIEF.repr(value)


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxdict, _BRIEF.maxlist = 3, 60, 60, 8, 8


# --- integrity -----------------------------------------------------------------------------------------------

def _tensors(obj: Any, path: str = ""):
    """(path, tensor) of every tensor in a nested state, in a fixed order."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            yield from _tensors(obj[key], f"{path}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{path}/{i}")


def checksum(state: dict[str, Any]) -> str:
    """blake2b over every tensor's path, dtype, shape and bytes (the checksum entry itself left out)."""
    digest = hashlib.blake2b(digest_size=20)
    for path, tensor in _tensors({k: v for k, v in state.items() if k != "checksum"}):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{path}|{data.dtype}|{tuple(data.shape)}|".encode())
        if data.numel():
            digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# --- save ----------------------------------------------------------------------------------------------------

def save(run, path) -> None:
    """Write the run's state to path; a collective when distributed (every rank calls it, rank 0 writes)."""
    path = Path(path)
    state = run.state_dict()
    parts = gathered(run, state)
    if rank() == 0:
        state.update(format=FORMAT, plan=encode_plan(state["plan"]), **parts)
        state["checksum"] = checksum(state)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, lambda file: torch.save(state, file))
        except (OSError, RuntimeError) as error:  # torch's writer reports a full disk as a RuntimeError
            raise write_error(path, error) from error
    barrier()


def write_error(path: Path, error: BaseException) -> CheckpointError:
    """A save that could not write: the file, why (a full disk named as one), the room on its disk."""
    why = "the disk is full" if disk_full(error) else f"{type(error).__name__}: {first_line(error)}"
    return CheckpointError(f"{path}: could not be written ({why}; {space(path.parent)} on the disk holding "
                           f"{path.parent}); the previous checkpoint there, if any, is kept as it was")


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


# --- read and check ------------------------------------------------------------------------------------------

def read(path) -> dict[str, Any]:
    """The checkpoint's contents, checked whole: a CheckpointError names the file and what is wrong."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty (a save that never wrote, or a truncated copy)")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; its end is missing when truncated
        raise CheckpointError(f"{path}: not a whole torch checkpoint (truncated or corrupted, or another kind of "
                              "file: torch.save writes a zip archive)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (zipfile.BadZipFile, EOFError, RuntimeError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a whole torch checkpoint (truncated or corrupted): "
                              f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error
    except Exception as error:  # e.g. an UnpicklingError: objects weights_only refuses
        raise CheckpointError(f"{path}: not an accel checkpoint (it holds objects beyond tensors and plain data: "
                              f"{type(error).__name__})") from error
    if not isinstance(state, dict) or state.get("format") not in (1, FORMAT):
        found = f"format {state.get('format')!r}" if isinstance(state, dict) and "format" in state else (
            f"a {type(state).__name__} without accel's format marker")
        raise CheckpointError(f"{path}: not an accel checkpoint ({found}; run.save writes format {FORMAT})")
    missing = [k for k in ("plan", "model", "optimizer", "step", "epoch", "rng") if k not in state]
    if missing:
        raise CheckpointError(f"{path}: incomplete accel checkpoint (format {state['format']}), missing {missing}; "
                              "nothing was loaded")
    wrong = layout_problems(state)
    if wrong:
        raise CheckpointError(f"{path}: not a checkpoint run.save wrote ({wrong[0]}); nothing was loaded")
    if state["format"] == 1:  # accel 0.1: the GradScaler was saved at the top level
        scaler = state.pop("scaler", None)
        state["accelerators"] = {"amp": {"scaler": scaler}} if scaler is not None else {}
        state.setdefault("optimizer_steps", state["step"])
    elif state.get("checksum") != checksum(state):
        raise CheckpointError(f"{path}: its tensors do not match the checksum saved with them: the file was "
                              "corrupted after it was written; nothing was loaded")
    return state


def saved_plan(path):
    """The plan a checkpoint was saved with: accelerate(model, optimizer, loader, plan=saved_plan(path)).

    The file is data: the plan it holds is built only from what a plan file could say, with functions found as
    ``decode_plan`` finds them, and refused (a CheckpointError) where an option would run a program or import
    (accel.plan.untrusted)."""
    options = decode_plan(read(path)["plan"], path)
    refused = code_problems(options)
    if refused:
        raise CheckpointError(f"{path}: the plan saved there sets {refused[0]}; accel takes that only from your own "
                              "code: build the plan yourself and pass it to accelerate()")
    try:
        return Plan(options)
    except PlanError as error:
        raise CheckpointError(f"{path}: the plan saved there is not one accel can build: {error}") from None


def load(run, path) -> dict[str, Any]:
    """Restore a checkpoint into a run created with the same plan; returns {"step", "epoch", "path"}.

    Nothing changes unless everything fits; if restoring fails half-way the run is put back as it was.
    """
    state = read(path)
    mine = encode_plan(run.plan.to_dict())
    if not same_options(state["plan"], mine):
        raise CheckpointError(f"{path} was saved with the plan {brief(state['plan'])}, but this run has {brief(mine)}; "
                              f"create the run with plan=accel.run.checkpoint.saved_plan({str(path)!r})")
    problems = rank_problems(state)
    legacy = [state["loader_generator"]] if state.get("loader_generator") is not None else []  # format 1
    mine = this_rank(state)  # before the fit checks: it warns when the world size changed
    state = {**state, **mine, "loader_generators": state.get("loader_generators", legacy)}
    problems += run.state_problems(state)
    if problems:
        raise CheckpointError(f"{path} does not fit this run; nothing was loaded: " + "; ".join(problems))
    try:
        run.load_state_dict(state)
    except Exception as error:
        raise CheckpointError(f"{path} could not be restored ({type(error).__name__}: {error}); the run was put back "
                              "as it was") from error
    return {"step": state["step"], "epoch": state["epoch"], "path": str(path)}
