"""Sharded checkpoints: under fsdp, run.save(path) writes a folder with torch.distributed.checkpoint (DCP), each rank
its own shards, into ``path/.step-N.partial``; rank 0 then adds accel.pt (plan, counters, every rank's random and
accelerator states, each file's size and blake2b, a checksum), renames the folder ``step-N`` and points
``path/latest`` at it, so a rank that dies mid-save leaves the last whole checkpoint named. run.load checks it all
before changing anything, then reads the shards at any world size, or into one process.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import torch

import accel.run.checkpoint as single
import accel.run.checkpoint_fit as fit
from accel.batches import map_tensors
from accel.errors import CheckpointError
from accel.files import read_small, write_text
from accel.hardware.launcher import rank, world_size
from accel.optim import optimizer_moment, put_groups, set_optimizer_moment
from accel.run.dcp_reading import checked_metadata, checked_reader, weights_only_planner
from accel.run.interrupts import deferred
from accel.run.thread_warnings import thread_filter

FORMAT = 1
META = "accel.pt"
LATEST = "latest"


def _digest(file: Path) -> str:
    digest = hashlib.blake2b(digest_size=20)
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _quiet():
    """DCP warns that it assumes a single process when there is no group: that is the intent here."""
    return thread_filter("ignore", ".*assuming the intent is to (load|save) in a single process")


def states(run, path) -> tuple[dict, dict]:
    """The model's and optimizer's state, keyed by parameter name, as DTensor shards under FSDP. An optimizer without
    state (no step yet) is left as it was: get_state_dict creates one by a step with lr 0 and zero gradients, which
    moves Adam's step count (its first real step would be bias-corrected as its second), and a step that raises (a
    step() taking no closure) leaves the lr 0."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if run.optimizer is None:
        return get_model_state_dict(run.unwrap()), {}
    fresh = optimizer_moment(run.optimizer, whole=True) if not run.optimizer.state else None  # (put back after)
    run.watch.stepping = True  # get_state_dict steps an optimizer without state once (to create it): not the loop's
    try:  # with every group's lr 0 meanwhile: a Ctrl-C waits until they are back (accel.run.interrupts)
        with deferred() if fresh else contextlib.nullcontext():
            model_state, optimizer_state = get_state_dict(run.unwrap(), run.optimizer)
        if fresh:  # saved as it was (timm's Lamb counts that step in group["step"]): a load puts those groups
            put_groups(optimizer_state["param_groups"], fresh["groups"], run.optimizer.defaults)
        return model_state, optimizer_state
    except KeyError:  # get_state_dict maps every key of the optimizer's state to a parameter
        named = sorted(str(key) for key in run.optimizer.state if not isinstance(key, torch.Tensor))
        if not named:
            raise
        raise CheckpointError(f"{path}: torch's distributed checkpoint keeps an optimizer's state per parameter, and "
                              f"this optimizer keeps {named} under a name of its own") from None
    finally:
        run.watch.stepping = False
        if fresh:
            set_optimizer_moment(run.optimizer, fresh)


def _cause(error: BaseException) -> BaseException | None:
    """What failed: an Exception, or the first rank's inside DCP's CheckpointException (a BaseException); None for
    any other BaseException (a Ctrl-C)."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(error, CheckpointException):
        first = next(iter(error.failures.values()), None)
        return first[0] if isinstance(first, tuple) and isinstance(first[0], BaseException) else error
    return error if isinstance(error, Exception) else None


def save(run, path) -> None:
    """Write the run's sharded checkpoint under path (every rank calls it). A save that fails raises a
    CheckpointError on every rank, and ``latest`` still names the last whole checkpoint."""
    import torch.distributed.checkpoint as dcp

    root = Path(path)
    if root.exists() and not root.is_dir():  # on every rank: one that raised alone would leave the others waiting
        raise CheckpointError(f"{root}: is a file; under fsdp run.save writes a folder of shards")
    if run.held_gradients():
        raise CheckpointError(f"{root}: cannot save a sharded checkpoint in the middle of accumulating gradients: "
                              "FSDP keeps the unreduced gradients inside its own buffers; save when run.step() "
                              "returned False (an optimizer step)")
    name = f"step-{run.steps:09d}"
    partial = root / f".{name}.partial"
    fresh = run.optimizer is not None and not run.optimizer.state
    model_state, optimizer_state = states(run, root)
    optimizer_state = single.plain_numbers(optimizer_state)  # run.load reads them weights only (weights_only_planner)
    # as the single-file save: refused, not written (on every rank, before any file: the same on each)
    single.refuse_unreadable(root, {"plan": {}, "optimizer": optimizer_state}, _renamed_keys(optimizer_state))
    single.on_rank_zero(lambda: _prepare(root), root)
    try:
        with _quiet():
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial))
    except BaseException as error:  # DCP's CheckpointException is a BaseException: every rank gets it
        if rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        if _cause(error) is None:  # a Ctrl-C
            raise
        raise single.write_error(root, _cause(error)) from error
    meta = single.written(run, run.state_dict(model=False), FORMAT)
    meta["fresh_optimizer"] = fresh  # its state as saved is the one get_state_dict made: run.load leaves it fresh
    mine = {f.name: (f.stat().st_size, _digest(f)) for f in partial.glob(f"__{rank()}_*")}
    meta["files"] = {k: v for part in single.gather_from_ranks(mine) for k, v in part.items()}
    single.on_rank_zero(lambda: _finish(root, partial, name, meta), root, partial)


def _renamed_keys(value: Any, at: str = "the optimizer's state") -> list[str]:
    """Each key not a str of a dict DCP flattens (through dicts, and lists of them): it keys by str(key), so a saved
    {1: x} would be read back as {'1': x}, the run's own value under 1 left as it was."""
    if isinstance(value, dict):
        return [f"{at}[{key!r}] (keyed by {type(key).__name__}: torch's distributed checkpoint reads it back as a str; "
                "key it by a str)" for key in value if not isinstance(key, str)] + [
            found for key, item in value.items() for found in _renamed_keys(item, f"{at}[{key!r}]")]
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in _renamed_keys(item, f"{at}[{index}]")]
    return []


def _prepare(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(".step-*.partial"):  # what saves that died left (a rank killed mid-save)
        shutil.rmtree(leftover, ignore_errors=True)


def _finish(root: Path, partial: Path, name: str, meta: dict) -> None:
    """Rank 0: accel.pt, the folder renamed whole, ``latest`` switched to it, the older ones removed."""
    meta["files"][".metadata"] = ((partial / ".metadata").stat().st_size, _digest(partial / ".metadata"))
    single.write_state(partial / META, meta, root)
    final, again = root / name, 1
    while final.exists():  # the same step saved again (after a restart): a new folder, so that latest always
        again += 1  # names a whole one, switched in one step
        final = root / f"{name}-{again}"
    os.replace(partial, final)
    try:
        write_text(root / LATEST, final.name + "\n")
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)  # whole, but named by nothing
        raise
    for old in root.glob("step-*"):
        if old.name != final.name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def read(path) -> tuple[Path, dict[str, Any], Any]:
    """The whole checkpoint folder path names (the root's latest, or a step folder), its accel.pt and DCP's
    metadata, checked against the manifest; a CheckpointError names what is wrong."""
    where = Path(path)
    if not where.exists():
        raise CheckpointError(f"{where}: no such checkpoint")
    if (where / LATEST).exists():
        try:
            name = read_small((where / LATEST).resolve(), 300).decode(errors="replace").strip()  # (a link the user
        except OSError as error:  # made is followed: a hub snapshot's files are links; what it names is checked)
            raise CheckpointError(f"{where / LATEST}: cannot be read as the name of a checkpoint folder "
                                  f"({error.strerror})") from error
        if not name.startswith("step-") or Path(name).name != name:
            raise CheckpointError(f"{where / LATEST}: does not name a checkpoint folder ({name[:60]!r})")
        where = where / name
    elif not ((where / META).exists() or where.name.endswith(".partial") or (where / ".metadata").exists()):
        partials = sorted(p.name for p in where.glob(".step-*.partial"))
        raise CheckpointError(f"{where}: no whole sharded checkpoint here (no '{LATEST}' file)"
                              + (f"; only {partials}, left by a save that did not finish (a rank died mid-save)"
                                 if partials else ""))
    if where.name.endswith(".partial"):
        raise CheckpointError(f"{where}: a save that did not finish (a rank died mid-save); load the last whole "
                              f"checkpoint: run.load({str(where.parent)!r})")
    if not (where / META).exists():
        raise CheckpointError(f"{where}: torn checkpoint: no {META} (the save did not finish, or this is not a "
                              "checkpoint accel wrote)")
    meta = single.read(where / META, FORMAT, ("plan", "step", "epoch", "rng", "world_size", "files"))
    files = sorted(meta["files"].items())
    missing = [name for name, _ in files if not (where / name).is_file()]
    if missing:
        raise CheckpointError(f"{where}: torn checkpoint: {missing[0]} is missing (written by "
                              f"{meta['world_size']} rank(s)); nothing was loaded")
    # each rank hashes its share of the files (every file is read once for the hash, not once per rank)
    changed = [name for name, (size, digest) in files[rank()::world_size()]
               if (where / name).stat().st_size != size or _digest(where / name) != digest]
    changed = sorted(n for part in single.gather_from_ranks(changed) for n in part)
    if changed:
        raise CheckpointError(f"{where}: {changed[0]} differs from what was saved (size or hash): corrupted or torn; "
                              "nothing was loaded")
    return where, meta, checked_metadata(where / ".metadata", meta["files"])


def _copy(state: Any) -> Any:
    return map_tensors(lambda tensor: tensor.detach().clone(), state)


def put(run, state: dict[str, Any]) -> None:
    """The run's model, optimizer (keyed as ``states`` gives them) and progress set from state: the checkpoint's, or
    the run's own put back."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if run.optimizer is not None:
        run.watch.stepping = True  # set_state_dict steps an optimizer without state once too: not the loop's
        try:
            set_state_dict(run.unwrap(), run.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"])
        finally:
            run.watch.stepping = False
        if state.get("fresh_optimizer"):  # saved before its first step (or the run's own, put back): no state
            run.optimizer.state.clear()
    else:
        set_model_state_dict(run.unwrap(), state["model"])
    run.restore_progress(state)


def fit_problems(run, state: dict[str, Any], metadata: Any, model: dict) -> list[str]:
    """Why the checkpoint does not fit the run: its model's names and global shapes in DCP's metadata, against the
    run's ``model`` keyed as DCP keys the saved one (a module's dict extra state by its keys), and the rest."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    shapes = {k[len("model."):]: getattr(v, "size", None) for k, v in metadata.state_dict_metadata.items()
              if k.startswith("model.")}
    return fit.fit_problems(run, state, shapes, flatten_state_dict(model)[0])


def load(run, where: Path, state: dict[str, Any], metadata: Any, model: dict, optimizer: dict) -> tuple[dict, dict]:
    """The checkpoint's state (accel.pt's, checked to fit the run) with its shards read into copies of the run's
    ``model`` and ``optimizer`` (as ``states`` gave them: the run's own stay until all is read), and a backup of the
    run's own, for ``put``."""
    import torch.distributed.checkpoint as dcp

    read_into = {"model": _copy(model), "optimizer": _copy(optimizer)}
    if run.optimizer is None:
        del read_into["optimizer"]
    try:
        with _quiet():
            dcp.load(read_into, storage_reader=checked_reader(where, metadata, state["files"]),
                     planner=weights_only_planner())
    except BaseException as error:  # DCP's CheckpointException is a BaseException
        if _cause(error) is None:
            raise
        raise CheckpointError(f"{where}: the shards could not be read ({type(error).__name__}: {error}); nothing "
                              "was loaded") from error
    backup = {**run.state_dict(model=False), "model": model, "optimizer": optimizer,
              "fresh_optimizer": run.optimizer is not None and not run.optimizer.state}
    return {**state, "optimizer": {}, **read_into}, _copy(backup)  # accelerators hand out live tensors
