"""Sharded checkpoints: a run under fsdp saves with torch.distributed.checkpoint (DCP), each rank its own shards.

Layout of ``run.save(path)`` (every rank calls it; the folder must be one all ranks see)::

    path/
      latest                 names the newest whole checkpoint ("step-000000012"), replaced atomically
      step-000000012/        a DCP directory: .metadata and one __<rank>_0.distcp per rank, plus
        accel.pt             the plan, counters, every rank's random and accelerator states, and a manifest
                             (size and blake2b of every DCP file), with a checksum over its tensors

Every rank writes into ``path/.step-N.partial``; once all have written, rank 0 adds accel.pt, renames the folder to
``step-N``, points ``latest`` at it and removes the older ones. A rank that dies mid-save leaves only a
``.partial`` folder: ``latest`` still names the last whole checkpoint, which is what ``run.load(path)`` reads.

``run.load(path)`` (the root or one ``step-N`` folder) checks everything before changing anything: that the folder
is a whole checkpoint (accel.pt present and whole, every file of the manifest present with its size and hash),
that it was saved under the same plan, that its tensors fit the model (names and global shapes) and optimizer;
then DCP reads the shards this rank needs, at this or another world size (2 ranks -> 1 process, 1 -> 2), and the
state is set; if that fails half-way the run is put back. Outside a process group the whole state is read into
a single process.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from accel.batches import map_tensors
from accel.errors import CheckpointError
from accel.files import write_atomically, write_text
from accel.hardware.launcher import rank, world_size
from accel.plan import same_options
from accel.plan.contract import REGISTRY, Stage
from accel.run.checkpoint import brief, checksum, encode_plan, write_error
from accel.run.checkpoint_fit import (
    gather_from_ranks,
    gathered,
    layout_problems,
    model_problems,
    optimizer_problems,
    rank_problems,
    stray_problems,
    this_rank,
)
from accel.run.interrupts import held
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


@contextlib.contextmanager
def _quiet():
    """DCP warns that it assumes a single process when there is no group: that is the intent here (silenced in
    this thread only: accel.run.thread_warnings)."""
    with thread_filter("ignore", ".*assuming the intent is to (load|save) in a single process"):
        yield


def _states(run) -> tuple[dict, dict]:
    """The model's and optimizer's state, keyed by parameter name, as DTensor shards under FSDP."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = run.unwrap()
    if run.optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(model), {}
    run.watch.stepping = True  # get_state_dict steps an optimizer without state once (to create it): not the loop's
    try:
        return get_state_dict(model, run.optimizer)
    finally:
        run.watch.stepping = False


def save(run, path) -> Path:
    """Write the run's sharded checkpoint under path; a collective (every rank calls it). Returns its folder.

    A save that fails (a full disk, a rank's write) raises a CheckpointError on every rank, removes its
    ``.partial`` folder, and leaves ``latest`` naming the last whole checkpoint."""
    import torch.distributed.checkpoint as dcp

    root = Path(path)
    if root.exists() and not root.is_dir():  # on every rank: one that raised alone would leave the others waiting
        raise CheckpointError(f"{root}: is a file; under fsdp run.save writes a folder of shards")
    name = f"step-{run.steps:09d}"
    partial = root / f".{name}.partial"
    if run.held_gradients():
        raise CheckpointError(f"{root}: cannot save a sharded checkpoint in the middle of accumulating gradients: "
                              "FSDP keeps the unreduced gradients inside its own buffers; save when run.step() "
                              "returned False (an optimizer step)")
    _agree(_on_rank_zero(lambda: _prepare(root), root))
    model_state, optimizer_state = _states(run)
    try:
        with _quiet():
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial))
    except BaseException as error:  # DCP's CheckpointException is a BaseException: every rank gets it
        if rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        cause = error if isinstance(error, Exception) else _dcp_cause(error)
        if cause is None:  # a Ctrl-C
            raise
        raise write_error(root, cause) from error
    state = run.state_dict(model=False)
    parts = gathered(run, state)
    mine = {f.name: (f.stat().st_size, _digest(f)) for f in partial.glob(f"__{rank()}_*")}
    files = {k: v for part in gather_from_ranks(mine) for k, v in part.items()}
    meta = {**state, "format": FORMAT, "plan": encode_plan(state["plan"]), **parts, "files": files}
    _agree(_on_rank_zero(lambda: _finish(root, partial, name, meta), root, partial))
    return root / (root / LATEST).read_text().strip()  # every rank, after rank 0 switched it


def _prepare(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(".step-*.partial"):  # what saves that died left (a rank killed mid-save)
        shutil.rmtree(leftover, ignore_errors=True)


def _finish(root: Path, partial: Path, name: str, meta: dict) -> None:
    """Rank 0: accel.pt, the folder renamed whole, ``latest`` switched to it, the older ones removed."""
    meta["files"][".metadata"] = ((partial / ".metadata").stat().st_size, _digest(partial / ".metadata"))
    meta["checksum"] = checksum(meta)
    write_atomically(partial / META, lambda handle: torch.save(meta, handle))
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


def _on_rank_zero(work, root: Path, partial: Path | None = None) -> str:
    """Rank 0's part of a save; what went wrong, in words ("" when nothing did), for every rank to raise."""
    if rank() != 0:
        return ""
    try:
        work()
    except (OSError, RuntimeError) as error:  # torch's writer reports a full disk as a RuntimeError
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        return str(write_error(root, error))
    return ""


def _agree(failure: str) -> None:
    """Every rank learns whether rank 0's part failed, and raises it (a collective: none is left waiting)."""
    said = gather_from_ranks(failure)[0]
    if said:
        raise CheckpointError(said)


def _dcp_cause(error: BaseException) -> BaseException | None:
    """The first rank's own exception inside DCP's CheckpointException (the exception itself when it holds none);
    None for any other BaseException (a Ctrl-C)."""
    from torch.distributed.checkpoint.api import CheckpointException

    if not isinstance(error, CheckpointException):
        return None
    first = next(iter(error.failures.values()), None)
    return first[0] if isinstance(first, tuple) and isinstance(first[0], BaseException) else error


def is_sharded_checkpoint(path) -> bool:
    """A folder: what run.save writes under fsdp (a single-file checkpoint is a file)."""
    return Path(path).is_dir()


def folder(path) -> Path:
    """The whole checkpoint folder path names: the root's latest, or the step folder itself."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    if (path / LATEST).exists():
        name = (path / LATEST).read_text(errors="replace")[:300].strip()
        if not name.startswith("step-") or Path(name).name != name:
            raise CheckpointError(f"{path / LATEST}: does not name a checkpoint folder ({name[:60]!r})")
        return path / name
    if (path / META).exists() or path.name.endswith(".partial") or (path / ".metadata").exists():
        return path
    partials = sorted(p.name for p in path.glob(".step-*.partial"))
    raise CheckpointError(f"{path}: no whole sharded checkpoint here (no '{LATEST}' file)"
                          + (f"; only {partials}, left by a save that did not finish (a rank died mid-save)"
                             if partials else ""))


def read(path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint folder and its accel.pt, checked whole against the manifest; a CheckpointError names what."""
    where = folder(path)
    if where.name.endswith(".partial"):
        raise CheckpointError(f"{where}: a save that did not finish (a rank died mid-save); load the last whole "
                              f"checkpoint: run.load({str(where.parent)!r})")
    meta_file = where / META
    if not meta_file.exists():
        raise CheckpointError(f"{where}: torn checkpoint: no {META} (the save did not finish, or this is not a "
                              "checkpoint accel wrote)")
    try:
        meta = torch.load(meta_file, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(f"{meta_file}: not whole ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''})") from error
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "files" not in meta:
        raise CheckpointError(f"{meta_file}: not a sharded accel checkpoint")
    missing = [k for k in ("plan", "step", "epoch", "rng", "world_size") if k not in meta]
    wrong = layout_problems(meta) + [f"it names {name!r}, not a file of its folder" for name in meta["files"]
                                     if isinstance(name, str) and (Path(name).name != name or name in ("", ".", ".."))]
    if missing or wrong:
        raise CheckpointError(f"{meta_file}: not a checkpoint run.save wrote ({wrong[0] if wrong else f'no {missing}'}"
                              "); nothing was loaded")
    if meta.get("checksum") != checksum(meta):
        raise CheckpointError(f"{meta_file}: its tensors do not match the checksum saved with them; nothing was loaded")
    files = sorted(meta["files"].items())
    for name, (size, _) in files:
        file = where / name
        if not file.is_file():
            raise CheckpointError(f"{where}: torn checkpoint: {name} is missing (written by "
                                  f"{meta['world_size']} rank(s)); nothing was loaded")
    # each rank hashes its share of the files (every file is read once for the hash, not once per rank)
    changed = [name for name, (size, digest) in files[rank()::world_size()]
               if (where / name).stat().st_size != size or _digest(where / name) != digest]
    changed = sorted(n for part in gather_from_ranks(changed) for n in part)
    if changed:
        raise CheckpointError(f"{where}: {changed[0]} differs from what was saved (size or hash): corrupted or torn; "
                              "nothing was loaded")
    return where, meta


def _fit_problems(where: Path, model_state: dict, optimizer_state: dict, meta: dict, run) -> list[str]:
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(where)).read_metadata().state_dict_metadata
    shapes = {k[len("model."):]: getattr(v, "size", None) for k, v in saved.items() if k.startswith("model.")}
    problems = model_problems(shapes, model_state)
    problems += optimizer_problems(run.optimizer, meta.get("optimizer_class"), meta.get("optimizer_class") is not None)
    saved_states = set(meta.get("accelerators", {})) | {n for s in meta.get("accelerators_per_rank", []) for n in s}
    return problems + rank_problems(meta) + stray_problems(set(training_plan(dict.fromkeys(saved_states))), run)


def training_plan(plan: dict[str, dict]) -> dict[str, dict]:
    """The plan without its distribution accelerators (ddp, fsdp): what decides the model and the training."""
    return {name: options for name, options in plan.items()
            if name not in REGISTRY or REGISTRY[name].stage is not Stage.DISTRIBUTION}


def _copy(state: Any) -> Any:
    return map_tensors(lambda tensor: tensor.detach().clone(), state)


def _set(run, model_state: dict, optimizer_state: dict, progress: dict) -> None:
    """The run's model, optimizer and progress set from these: the checkpoint's, or the run's own put back."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if run.optimizer is not None:
        set_state_dict(run.unwrap(), run.optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
    else:
        set_model_state_dict(run.unwrap(), model_state)
    run.restore_progress(progress)


def load(run, path) -> dict[str, Any]:
    """Restore a sharded checkpoint into a run with the same plan, at any world size; {"step", "epoch", "path"}."""
    import torch.distributed.checkpoint as dcp

    where, meta = read(path)
    saved, mine = training_plan(meta["plan"]), training_plan(encode_plan(run.plan.to_dict()))
    if not same_options(saved, mine):
        raise CheckpointError(f"{where} was saved with the plan {brief(meta['plan'])}, but this run has "
                              f"{encode_plan(run.plan.to_dict())}; create the run with the same plan (ddp and fsdp "
                              "may differ: the shards load at any world size, or in one process)")
    current_model, current_optimizer = _states(run)
    problems = _fit_problems(where, current_model, current_optimizer, meta, run)
    if problems:
        raise CheckpointError(f"{where} does not fit this run; nothing was loaded: " + "; ".join(problems))
    model_state, optimizer_state = _copy(current_model), _copy(current_optimizer)  # read into copies: the run's
    wanted = {"model": model_state, "optimizer": optimizer_state} if run.optimizer is not None else {
        "model": model_state}
    try:
        with _quiet():
            dcp.load(wanted, checkpoint_id=str(where))  # own tensors stay as they are until everything was read
    except BaseException as error:  # DCP's CheckpointException is a BaseException
        if not isinstance(error, Exception) and _dcp_cause(error) is None:
            raise
        raise CheckpointError(f"{where}: the shards could not be read ({type(error).__name__}: {error}); nothing "
                              "was loaded") from error
    progress = {**meta, **this_rank(meta)}
    backup = (_copy(current_model), _copy(current_optimizer), run.state_dict(model=False))
    try:
        _set(run, model_state, optimizer_state, progress)
    except BaseException as error:  # a Ctrl-C too: the run as it was, never half from the checkpoint
        try:  # twice if a Ctrl-C lands on the call (accel.run.interrupts)
            held(_set, run, *backup)
        except BaseException:
            held(_set, run, *backup)
            raise
        if not isinstance(error, Exception):
            raise
        raise CheckpointError(f"{where} could not be restored ({type(error).__name__}: {error}); the run was put "
                              "back as it was") from error
    return {"step": meta["step"], "epoch": meta["epoch"], "path": str(where)}
