"""Checkpoints of a Run: everything needed to continue training exactly where it stopped.

Call run.save(path) on every rank: RNG states are gathered from all ranks, rank 0 writes to a temporary file
in the same folder and renames it over the old one (a crash mid-save leaves the previous checkpoint whole),
and every rank returns once the file is in place. run.load(path) refuses a checkpoint saved under another
plan, since the plan decides the model's shapes (pruning) before any weight is loaded.
"""
from __future__ import annotations

import os
import random
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from accel.distributed import barrier, rank, world_size

FORMAT = 1


class CheckpointError(ValueError):
    """The checkpoint cannot be loaded into this run."""


def rng_state() -> dict[str, Any]:
    """This process's random states, as tensors and plain types (loadable with weights_only=True)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np
    except ImportError:
        return state
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss)
    for kind in ("cuda", "xpu"):
        module = getattr(torch, kind, None)
        if module is not None and module.is_available() and module.is_initialized():
            state[kind] = module.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, version_state, gauss = state["python"]
    random.setstate((kind, tuple(version_state), gauss))
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))
    for kind in ("cuda", "xpu"):
        if kind in state and getattr(torch, kind).is_available():
            getattr(torch, kind).set_rng_state_all(state[kind])


def _gather(obj: Any) -> list[Any]:
    if world_size() == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


def _sampler(run):
    loader = getattr(run.loader, "loader", None)
    return getattr(loader, "sampler", None), getattr(loader, "generator", None)


def state_dict(run) -> dict[str, Any]:
    sampler, generator = _sampler(run)
    return {
        "format": FORMAT,
        "plan": run.plan.to_dict(),
        "model": run.unwrap().state_dict(),
        "optimizer": run.optimizer.state_dict() if run.optimizer is not None else None,
        "scaler": run.scaler.state_dict() if run.scaler is not None else None,
        "step": run.steps,
        "epoch": run.loader.epoch if run.loader is not None else 0,
        "sampler": {k: getattr(sampler, k) for k in ("seed", "epoch", "num_replicas") if hasattr(sampler, k)},
        "loader_generator": generator.get_state() if generator is not None else None,
        "world_size": world_size(),
    }


def save(run, path) -> None:
    """Write the run's state to path; a collective when distributed (every rank calls it, rank 0 writes)."""
    path = Path(path)
    rng = _gather(rng_state())
    if rank() == 0:
        state = {**state_dict(run), "rng": rng}
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


def saved_plan(path):
    """The plan a checkpoint was saved with: accelerate(model, optimizer, loader, plan=saved_plan(path))."""
    from accel.plan import Plan

    return Plan(torch.load(path, map_location="cpu", weights_only=True)["plan"])


def load(run, path) -> dict[str, Any]:
    """Restore a checkpoint into a run created with the same plan; returns {"step", "epoch", "path"}."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an accel checkpoint of format {FORMAT}")
    if state["plan"] != run.plan.to_dict():
        raise CheckpointError(f"{path} was saved with the plan {state['plan']}, but this run has {run.plan.to_dict()}; "
                              f"create the run with plan=accel.checkpoint.saved_plan({str(path)!r})")
    run.unwrap().load_state_dict(state["model"])
    for name in ("optimizer", "scaler"):
        target = getattr(run, name)
        if (target is None) != (state[name] is None):
            raise CheckpointError(f"{path} has {'no ' if state[name] is None else 'a '}{name} state, this run has "
                                  f"{'none' if target is None else 'one'}")
        if target is not None:
            target.load_state_dict(state[name])
    run.steps = state["step"]
    if run.loader is not None:
        run.loader.epoch = state["epoch"]
    sampler, generator = _sampler(run)
    if "seed" in state["sampler"] and hasattr(sampler, "seed"):
        sampler.seed = state["sampler"]["seed"]
    if generator is not None and state["loader_generator"] is not None:
        generator.set_state(state["loader_generator"])
    rngs = state["rng"]
    if len(rngs) != world_size():
        warnings.warn(f"checkpoint saved by {len(rngs)} rank(s), loaded by {world_size()}: every rank takes rank 0's "
                      "random state", stacklevel=2)
    set_rng_state(rngs[rank()] if len(rngs) == world_size() else rngs[0])
    summary = {"step": state["step"], "epoch": state["epoch"], "path": str(path)}
    return summary
