"""Checkpoint files of a Run (``Run.state_dict()``): the format, its integrity checks, the plan as data.

run.save(path) is called on every rank: rank 0 writes every rank's random and per-rank states to a temporary file
and renames it over the old one, so a crash mid-save leaves the previous checkpoint whole. run.load(path) changes
nothing unless the file is a whole accel checkpoint whose tensors match their checksum, saved under the same plan,
and fits this run; every refusal is a CheckpointError naming the file and what is wrong.
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import sys
import types
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import accel.run.checkpoint_fit as fit
from accel.batches import map_tensors
from accel.errors import CheckpointError, brief
from accel.files import disk_full, size_text, space, write_atomically
from accel.hardware.launcher import rank, world_size

FORMAT = 2
CALLABLE = "__callable__"


def each_value(fn: Callable[[Any], Any], value: Any) -> Any:
    """fn applied to every value inside dicts, lists and tuples (a named tuple is one value)."""
    if isinstance(value, dict):
        return {k: each_value(fn, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(each_value(fn, v) for v in value)
    return fn(value)


def encode_plan(plan_dict: dict[str, dict]) -> dict[str, dict]:
    """The plan's options with functions written as their import path (tensors stay tensors)."""
    def encode(value: Any) -> Any:
        if callable(value) and not isinstance(value, (torch.Tensor, type)):
            return {CALLABLE: f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"}
        return value

    return each_value(encode, plan_dict)


def decode_plan(encoded: dict[str, dict], path: Any = "") -> dict[str, dict]:
    """Back to options, each function found by ``resolve``: a checkpoint is data anyone may have written, so nothing
    it names is imported. One that cannot be found is a CheckpointError naming it: only you can pass it again."""
    def decode(value: Any, where: str) -> Any:
        if isinstance(value, dict) and set(value) == {CALLABLE}:
            reference = value[CALLABLE]
            found = resolve(reference) if isinstance(reference, str) else None
            if found is None:
                module = reference.partition(":")[0] if isinstance(reference, str) else ""
                why = (f"its module {module!r} is not imported, and accel imports nothing a checkpoint names: import "
                       "it yourself first, or" if module and module not in sys.modules and "<" not in reference
                       else "which cannot be imported (a lambda or a local function, or not a function of yours):")
                named = reference if isinstance(reference, str) and len(reference) < 300 else brief(reference, 300)
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
    """The plain function ``module:qualname`` names (its own module and name: not an object reached through them),
    or None. No code runs: only the ``__dict__`` of a module already imported, neither the standard library's nor
    accel's, is read (a module's ``__getattr__`` may import)."""
    module_name, _, qualname = reference.partition(":")
    module, top = sys.modules.get(module_name), module_name.partition(".")[0]
    if module is None or top in sys.stdlib_module_names or top == "accel" or not qualname:  # never a plan's option:
        return None  # the standard library's and accel's own functions (launchers, files, processes) stay out of reach
    found: Any = module
    for part in qualname.split("."):
        found = vars(found).get(part) if isinstance(found, (types.ModuleType, type)) else None
        if isinstance(found, staticmethod):
            found = found.__func__
    same = isinstance(found, types.FunctionType) and (found.__module__, found.__qualname__) == (module_name, qualname)
    return found if same else None


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
        data = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()  # (a conjugate or negative view has
        # no bytes of its own dtype: contiguous() leaves the bit on one already contiguous)
        digest.update(f"{path}|{data.dtype}|{tuple(data.shape)}|".encode())
        if data.numel():  # (one element is contiguous at any stride, which a byte view refuses: w[:1, 0])
            flat = data.reshape(-1)
            flat = flat if flat.stride(0) == 1 else flat.clone(memory_format=torch.contiguous_format)
            digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def write_state(path: Path, state: dict[str, Any], checkpoint: Path) -> None:
    """Both formats (the file, or the sharded checkpoint's accel.pt): refuse what run.load could not read back
    rather than write it, else write it with its checksum, atomically."""
    dense = ": the checksum run.load checks reads a dense tensor's bytes"  # (the kinds that say no more)
    refuse_unreadable(checkpoint, state, [f"{place} ({kind}{'' if kind.startswith(fit.SAID) else dense})"
                                          for place, kind in fit.unreadable(state)])
    state["checksum"] = checksum(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda file: torch.save(state, file))


def written(run, state: dict[str, Any], form: int) -> dict[str, Any]:
    """What both formats write of a run's state: its format, the plan as data, the parts that differ per rank (the
    random state, the states of accelerators whose State is ``per_rank``) gathered from every rank (a collective),
    numpy's scalars as Python's."""
    ranked = {a.name for a in run.accelerators if run.states[a.name].per_rank}
    accelerators = state["accelerators"]
    state = {**state, "format": form, "plan": encode_plan(state["plan"]), "rng": gather_from_ranks(state["rng"]),
             "world_size": world_size(), "accelerators": {n: s for n, s in accelerators.items() if n not in ranked},
             "accelerators_per_rank": gather_from_ranks({n: s for n, s in accelerators.items() if n in ranked})}
    extra = {k: plain_numbers(v) for k, v in state.get("model", {}).items() if k.endswith(fit.EXTRA_STATE)}
    return {k: {**v, **extra} if k == "model" else plain_numbers(v) for k, v in state.items()}


def gather_from_ranks(obj: Any) -> list[Any]:
    """Every rank's obj, in rank order (a collective when distributed; [obj] otherwise)."""
    if world_size() == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


def plain_numbers(value: Any) -> Any:
    """``value`` with numpy's scalars as Python's (a learning rate a numpy schedule set, an option of np.float64):
    torch.load(weights_only=True) reads Python numbers, not numpy's. Tensors and the rest stay as they are."""
    numpy = sys.modules.get("numpy")  # no numpy imported: none of its scalars can be here
    return each_value(lambda v: v.item() if numpy is not None and isinstance(v, numpy.generic) else v, value)


def refuse_unreadable(checkpoint: Path, state: dict[str, Any], more: Sequence[str] = ()) -> None:
    """A CheckpointError naming what of the plan's options, the accelerators' states, the model's extra state (a
    module's get_extra_state), the optimizer's param groups and the sampler's values torch.load(weights_only=True)
    cannot read back (a pathlib.Path), and the caller's ``more`` problems: run.save refuses it, rather than write
    what run.load then refuses."""
    parts = {f"{name}'s options": options for name, options in state["plan"].items()}
    for states in [state.get("accelerators", {}), *state.get("accelerators_per_rank", [])]:
        parts.update({f"{name}'s state": value for name, value in states.items()})
    parts.update({"the model's extra state": {k: v for k, v in state.get("model", {}).items()
                                              if k.endswith(fit.EXTRA_STATE)},
                  "the optimizer's param groups": (state.get("optimizer") or {}).get("param_groups"),
                  "the sampler's values": state.get("sampler")})
    problems = []
    for what, value in parts.items():
        buffer = io.BytesIO()
        torch.save(map_tensors(lambda tensor: None, value), buffer)  # the structure: no tensor data copied
        buffer.seek(0)
        try:
            torch.load(buffer, weights_only=True)
        except Exception as error:  # noqa: BLE001 (the unpickler's refusal, whatever its type)
            found = re.search(r"GLOBAL (\S+)", str(error))
            problems.append(f"{what} ({found.group(1) if found else type(error).__name__}: save it as plain data, "
                            "str, int, float, lists, dicts or tensors)")
    problems += more
    if problems:
        raise CheckpointError(f"{checkpoint}: not written: run.load reads tensors and plain data only (torch.load with "
                              f"weights_only), and could not read back " + "; ".join(problems))


def on_rank_zero(work: Callable[[], None], path: Path, remove: Path | None = None) -> None:
    """Rank 0 does its part of a save (``remove`` is its folder to delete should it fail); every rank raises what
    went wrong there (a collective: none is left waiting)."""
    failure = ""
    if rank() == 0:
        try:
            work()
        except (CheckpointError, OSError, RuntimeError) as error:  # torch's writer: a full disk as a RuntimeError
            if remove is not None:  # a refused state too: its shards are written, and named by nothing
                shutil.rmtree(remove, ignore_errors=True)
            failure = str(error if isinstance(error, CheckpointError) else write_error(path, error))
    failure = gather_from_ranks(failure)[0]
    if failure:
        raise CheckpointError(failure)


def write_error(path: Path, error: BaseException) -> CheckpointError:
    """A save that could not write: the file, why (a full disk named as one), the room on its disk."""
    why = "the disk is full" if disk_full(error) else f"{type(error).__name__}: {first_line(error)}"
    return CheckpointError(f"{path}: could not be written ({why}; {space(path.parent)} on the disk holding "
                           f"{path.parent}); the previous checkpoint there, if any, is kept as it was")


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


def load_file(path: Path) -> Any:
    """What torch.save wrote to path, tensors and plain data only; a CheckpointError says why it cannot be read."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    try:  # opened once, and checked as opened: a pipe put in its place after a check would be waited on
        file = open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK))  # a pipe: at once
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot be opened ({type(error).__name__}: {first_line(error)})") from error
    with file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise CheckpointError(f"{path}: not a regular file, not a checkpoint file")
        if status.st_size == 0:
            raise CheckpointError(f"{path}: the file is empty (a save that never wrote, or a truncated copy)")
        if not zipfile.is_zipfile(file):  # torch.save writes a zip archive; its end is missing when truncated
            raise CheckpointError(f"{path}: not a whole torch checkpoint (truncated or corrupted, or another kind of "
                                  "file: torch.save writes a zip archive)")
        refuse_inflating(path, file, status.st_size)
        file.seek(0)
        try:
            return torch.load(file, map_location="cpu", weights_only=True)
        except (zipfile.BadZipFile, EOFError, RuntimeError, OSError, ValueError) as error:
            raise CheckpointError(f"{path}: not a whole torch checkpoint (truncated or corrupted): "
                                  f"{type(error).__name__}: {first_line(error)}") from error
        except Exception as error:  # e.g. an UnpicklingError: objects weights_only refuses
            raise CheckpointError(f"{path}: not an accel checkpoint (it holds objects beyond tensors and plain data: "
                                  f"{type(error).__name__})") from error


def refuse_inflating(path: Path, file, size: int) -> None:
    """A CheckpointError for an archive that unpacks to more than its size, before torch reads it: torch.load reads a
    compressed entry too, whole, at the size its header gives (a few MiB of deflated zeros: GiBs). torch.save stores
    its entries as they are, so none is compressed, and together they hold no more than the file."""
    file.seek(0)
    try:
        with zipfile.ZipFile(file) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as error:
        raise CheckpointError(f"{path}: not a whole torch checkpoint (truncated or corrupted): "
                              f"{type(error).__name__}: {first_line(error)}") from error
    if packed := next((entry for entry in entries if entry.compress_type != zipfile.ZIP_STORED), None):
        raise CheckpointError(f"{path}: not a checkpoint torch.save wrote (its entry {brief(packed.filename, 100)} is "
                              f"compressed, and unpacks to {size_text(packed.file_size)}; torch.save stores its "
                              "entries as they are); nothing was read")
    if (total := sum(entry.file_size for entry in entries)) > size:
        raise CheckpointError(f"{path}: not a whole torch checkpoint (its entries say they hold {size_text(total)}, "
                              f"more than the file's {size_text(size)}); nothing was read")


def read(path, form: int = FORMAT, required=("plan", "model", "optimizer", "step", "epoch", "rng")) -> dict[str, Any]:
    """The checkpoint's contents (or a sharded one's accel.pt), checked whole: a CheckpointError names the file and
    what is wrong: another format, a part ``required`` missing, a part run.save does not write, or tensors that do
    not match its checksum."""
    state = load_file(Path(path))
    if not isinstance(state, dict) or state.get("format") != form:
        found = f"format {state.get('format')!r}" if isinstance(state, dict) and "format" in state else (
            f"a {type(state).__name__} without accel's format marker")
        raise CheckpointError(f"{path}: not an accel checkpoint ({found}; run.save writes format {form})")
    missing = [k for k in required if k not in state]
    if missing:
        raise CheckpointError(f"{path}: incomplete accel checkpoint (format {form}), missing {missing}; nothing was "
                              "loaded")
    wrong = fit.layout_problems(state)
    if wrong:
        raise CheckpointError(f"{path}: not a checkpoint run.save wrote ({wrong[0]}); nothing was loaded")
    if state.get("checksum") != checksum(state):
        raise CheckpointError(f"{path}: its tensors do not match the checksum saved with them: the file was "
                              "corrupted after it was written; nothing was loaded")
    return state
