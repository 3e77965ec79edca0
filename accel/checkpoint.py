"""Checkpoints of a Run: everything needed to continue training exactly where it stopped.

Call run.save(path) on every rank: RNG states are gathered from all ranks, rank 0 writes to a temporary file in
the same folder and renames it over the old one (a crash mid-save leaves the previous checkpoint whole), and
every rank returns once the file is in place. The file holds a checksum over its tensors.

run.load(path) checks everything before changing anything: that the file is a whole accel checkpoint
(empty, truncated, corrupted or foreign files are refused, naming the file and what is wrong), that its
tensors match their checksum, that it was saved under the same plan (the plan decides the model's shapes),
and that the model, optimizer and accelerator states fit this run. If restoring still fails, the run is put
back as it was. Every error is a CheckpointError.
"""
from __future__ import annotations

import copy
import hashlib
import importlib
import os
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from accel.distributed import barrier, rank, world_size
from accel.errors import CheckpointError
from accel.randomness import loader_generators, rng_state, set_rng_state

FORMAT = 2
CALLABLE = "__callable__"


def _gather(obj: Any) -> list[Any]:
    if world_size() == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


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
    """Back to options, importing each function; one that cannot be imported (a lambda, a local function) is an
    error naming it, since only you can pass it again."""
    def decode(value: Any, where: str) -> Any:
        if isinstance(value, dict) and set(value) == {CALLABLE}:
            module, _, qualname = value[CALLABLE].partition(":")
            try:
                found: Any = importlib.import_module(module)
                for part in qualname.split("."):
                    found = getattr(found, part)
                return found
            except (ImportError, AttributeError, ValueError):
                raise CheckpointError(f"{path}: the plan's {where} was {value[CALLABLE]}, which cannot be imported "
                                      "(a lambda or a local function); build the plan yourself with the same "
                                      "function and pass it to accelerate()") from None
        if isinstance(value, dict):
            return {k: decode(v, f"{where}.{k}" if where else k) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(decode(v, where) for v in value)
        return value

    return decode(encoded, "")


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

def _sampler(run):
    """The loader's sampler and every generator it draws from (its own, its sampler's, its batch sampler's)."""
    loader = getattr(run.loader, "loader", None)
    return getattr(loader, "sampler", None), loader_generators(loader)


def state_dict(run) -> dict[str, Any]:
    sampler, generators = _sampler(run)
    return {
        "format": FORMAT,
        "plan": encode_plan(run.plan.to_dict()),
        "model": run.unwrap().state_dict(),
        "optimizer": run.optimizer.state_dict() if run.optimizer is not None else None,
        "optimizer_class": type(run.optimizer).__name__ if run.optimizer is not None else None,
        "accelerators": {a.name: a.state_dict() for a in run.accelerators if not a.state_per_rank},
        "step": run.steps,
        "optimizer_steps": run.optimizer_steps,
        "epoch": run.loader.epoch if run.loader is not None else 0,
        "sampler": {k: getattr(sampler, k) for k in ("seed", "epoch", "num_replicas") if hasattr(sampler, k)},
        "loader_generators": [g.get_state() for g in generators],
        "world_size": world_size(),
    }


def save(run, path) -> None:
    """Write the run's state to path; a collective when distributed (every rank calls it, rank 0 writes)."""
    path = Path(path)
    rng = _gather(rng_state())
    per_rank = _gather({a.name: a.state_dict() for a in run.accelerators if a.state_per_rank})
    if rank() == 0:
        state = {**state_dict(run), "rng": rng, "accelerators_per_rank": per_rank}
        state["checksum"] = checksum(state)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                torch.save(state, file)
                file.flush()
                os.fsync(file.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes it private; a checkpoint is an ordinary file
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    barrier()


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
    if state["format"] == 1:  # accel 0.1: the GradScaler was saved at the top level
        scaler = state.pop("scaler", None)
        state["accelerators"] = {"amp": {"scaler": scaler}} if scaler is not None else {}
        state.setdefault("optimizer_steps", state["step"])
    elif state.get("checksum") != checksum(state):
        raise CheckpointError(f"{path}: its tensors do not match the checksum saved with them: the file was "
                              "corrupted after it was written; nothing was loaded")
    missing = [k for k in ("plan", "model", "optimizer", "step", "epoch", "rng") if k not in state]
    if missing:
        raise CheckpointError(f"{path}: incomplete accel checkpoint, missing {missing}")
    return state


def saved_plan(path):
    """The plan a checkpoint was saved with: accelerate(model, optimizer, loader, plan=saved_plan(path))."""
    from accel.plan import Plan

    return Plan(decode_plan(read(path)["plan"], path))


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


def load(run, path) -> dict[str, Any]:
    """Restore a checkpoint into a run created with the same plan; returns {"step", "epoch", "path"}.

    Nothing changes unless everything fits; if restoring fails half-way the run is put back as it was.
    """
    from accel.plan import same_options

    state = read(path)
    mine = encode_plan(run.plan.to_dict())
    if not same_options(state["plan"], mine):
        raise CheckpointError(f"{path} was saved with the plan {state['plan']}, but this run has {mine}; create the "
                              f"run with plan=accel.checkpoint.saved_plan({str(path)!r})")
    model = run.unwrap()
    problems = _model_problems(state["model"], model.state_dict())
    problems += _optimizer_problems(state["optimizer"], run.optimizer, state.get("optimizer_class"))
    names = [a.name for a in run.accelerators]
    per_rank = state.get("accelerators_per_rank") or [{}]
    stray = sorted((set(state.get("accelerators", {})) | set(per_rank[0])) - set(names))
    if stray:
        problems.append(f"state of accelerators this run did not apply: {stray}")
    if len(per_rank) != world_size() and any(s.get("micro") for s in per_rank):
        problems.append(f"saved by {len(per_rank)} rank(s) in the middle of accumulating gradients, which differ "
                        f"per rank; loaded by {world_size()}: resume from a checkpoint saved on an optimizer step")
    mine = per_rank[rank()] if len(per_rank) == world_size() else per_rank[0]
    if problems:
        raise CheckpointError(f"{path} does not fit this run; nothing was loaded: " + "; ".join(problems))
    backup = _snapshot(run)
    try:
        model.load_state_dict(state["model"])
        if run.optimizer is not None:
            run.optimizer.load_state_dict(state["optimizer"])
        for accelerator in run.accelerators:
            source = mine if accelerator.state_per_rank else state.get("accelerators", {})
            accelerator.load_state_dict(source.get(accelerator.name, {}))
        _restore_counters(run, state)
    except Exception as error:
        _restore(run, backup)
        raise CheckpointError(f"{path} could not be restored ({type(error).__name__}: {error}); the run was put back "
                              "as it was") from error
    return {"step": state["step"], "epoch": state["epoch"], "path": str(path)}


def _restore_counters(run, state: dict) -> None:
    run.steps, run.optimizer_steps = state["step"], state.get("optimizer_steps", state["step"])
    if run.loader is not None:
        run.loader.epoch = state["epoch"]
    sampler, generators = _sampler(run)
    if "seed" in state["sampler"] and hasattr(sampler, "seed"):
        sampler.seed = state["sampler"]["seed"]
    legacy = [state["loader_generator"]] if state.get("loader_generator") is not None else []  # format 1
    for generator, saved in zip(generators, state.get("loader_generators", legacy)):
        generator.set_state(saved)
    rngs = state["rng"]
    if len(rngs) != world_size():
        warnings.warn(f"checkpoint saved by {len(rngs)} rank(s), loaded by {world_size()}: every rank takes rank 0's "
                      "random state", stacklevel=3)
    set_rng_state(rngs[rank()] if len(rngs) == world_size() else rngs[0])


def _snapshot(run) -> dict[str, Any]:
    sampler, generators = _sampler(run)
    def on_cpu(state):  # the backup waits in host memory: no second copy of the weights on a GPU
        return tree_map_only(torch.Tensor, lambda t: t.detach().to("cpu", copy=True), state)

    return {"model": on_cpu(dict(run.unwrap().state_dict())),
            "optimizer": on_cpu(run.optimizer.state_dict()) if run.optimizer is not None else None,
            "accelerators": {a.name: copy.deepcopy(a.state_dict()) for a in run.accelerators},
            "counters": (run.steps, run.optimizer_steps, run.loader.epoch if run.loader is not None else None,
                         getattr(sampler, "seed", None)),
            "generators": [g.get_state() for g in generators], "rng": rng_state()}


def _restore(run, backup: dict[str, Any]) -> None:
    run.unwrap().load_state_dict(backup["model"])
    if run.optimizer is not None:
        run.optimizer.load_state_dict(backup["optimizer"])
    for accelerator in run.accelerators:
        accelerator.load_state_dict(backup["accelerators"][accelerator.name])
    run.steps, run.optimizer_steps, epoch, seed = backup["counters"]
    if run.loader is not None:
        run.loader.epoch = epoch
    sampler, generators = _sampler(run)
    if seed is not None:
        sampler.seed = seed
    for generator, saved in zip(generators, backup["generators"]):
        generator.set_state(saved)
    set_rng_state(backup["rng"])
