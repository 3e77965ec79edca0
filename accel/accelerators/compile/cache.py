"""compile's compiled artifacts kept in accel's cache folder, so that a second run of a script compiles warm."""
# torch keeps inductor's compiled graphs in $TORCHINDUCTOR_CACHE_DIR, else /tmp/torchinductor_<user> (which the system
# may clear); for the run, accel points the variable at ``compile/`` in its cache folder, through the journal (a folder
# the user chose is theirs). One folder serves every setup, torch's own keys decide what fits; a marker per setup says
# whether this one starts warm. Not ``torch.compiler.save_cache_artifacts()``: it needs calls around the compile. No
# symbolic link at or in compile/ is followed (a hostile one would point torch's kernels, accel's markers and `accel
# cache clear` elsewhere): each is said, and torch keeps its own folder. docs/accelerators/compile.md.
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from accel.files import PREFIX, SUFFIX, cache_dir, linked, read_small, size_text, space, temporary_name, write_text
from accel.hardware import device_model
from accel.modules import fingerprint
from accel.run.shared_settings import set_by_runs

ENV = "TORCHINDUCTOR_CACHE_DIR"
MARKERS = "accel-setups"
CACHE = "compile's cache"  # in the warning of a link in it
SLACK_S = 2.0  # file systems that keep modification times to the second or two (FAT: 2 s)
ROOM = 256 << 20  # the free space below which torch keeps its own folder: a model's kernels and graphs take tens of
# MiB, and g++ or triton failing to write one fails the step that compiles it


def folder(where: Any = True) -> Path:
    """Where compile's artifacts are kept: ``compile/`` in accel's cache folder."""
    return cache_dir(where) / "compile"


def graph_entries(where: Path) -> list[Path]:
    """torch's compiled-graph entries in a cache folder: one folder each in aotautograd/, and in fxgraph/ under a
    two-letter prefix."""
    return [entry for level in [where / "aotautograd", *_folders(where / "fxgraph")] for entry in _folders(level)]


def _folders(path: Path) -> list[Path]:
    try:
        return [entry for entry in path.iterdir() if entry.is_dir()]
    except OSError:
        return []


def warm_before(where: Path, facts: dict[str, Any]) -> tuple[bool, int]:
    """Whether this setup compiled into the folder before (an earlier run left its marker, and graph entries were
    written since its first run), and how many graph entries the folder holds; records this run's marker."""
    key = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:24]
    marker = where / MARKERS / f"{key}.json"
    try:  # a pipe, a terabyte or a link: not a marker
        first = float(json.loads(read_small(marker, 1 << 16))["first_run"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError, OverflowError):  # none, or a damaged one: cold
        first = None
    entries = graph_entries(where)
    warm = first is not None and any(_stat(e).st_mtime >= first - SLACK_S for e in entries)
    # torch says for itself when it cannot write the folder; the marker is only the report's
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_text(marker, json.dumps({"setup": facts, "first_run": time.time() if first is None else first,
                                       "last_run": time.time()}, default=str, indent=1))
    return warm, len(entries)


def _stat(path: Path) -> os.stat_result:
    """The file's stat, or zeros (size 0, modified at the epoch's start) for one removed meanwhile."""
    try:
        return path.stat()
    except OSError:
        return os.stat_result((0,) * 10)


def keep_in_accel_cache(ctx, settings: dict[str, Any]) -> dict[str, str]:
    """Point torch's compile caches at accel's folder for the run (``ctx.journal``: undone when the run closes or
    its plan fails); returns the report's lines: where the cache is, and whether this setup starts warm. Where
    that folder cannot be written (a read-only cache), or holds files accel did not put there, torch's own folder
    is left in place: compile works as it does without accel."""
    import torch._functorch.config
    import torch._inductor.config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # the user's folder: neither torch's default (torch writes that into the environment at its first look-up) nor
    # an open run's
    theirs = os.environ.get(ENV)
    if theirs and os.path.abspath(theirs) != os.path.abspath(default_cache_dir()) and not set_by_runs(("environ", ENV)):
        return {"compile cache": f"{theirs} (your {ENV}; accel leaves it as it is)"}
    place = os.path.abspath(folder())  # torch writes back the absolute path: the same value stays the run's
    if unusable := _unusable(Path(place)):
        return {"compile cache": f"torch's own ({place} {unusable})"}
    ctx.journal.setenv(ENV, place)
    # torch keeps no graph with its caches off; the AOTAutograd cache keeps its graphs in the FX graph cache, and is
    # bypassed without it
    if off := next((why for why, on in (
            ("torch.compiler.config.force_disable_caches is True", torch._inductor.config.force_disable_caches),
            ("torch._inductor.config.fx_graph_cache is False (TORCHINDUCTOR_FX_GRAPH_CACHE=0?)",
             not torch._inductor.config.fx_graph_cache),
            ("torch._functorch.config.enable_autograd_cache is False (TORCHINDUCTOR_AUTOGRAD_CACHE=0?)",
             not torch._functorch.config.enable_autograd_cache)) if on), ""):
        return {"compile cache": place, "warm start": f"off ({off}): the graphs compile again every run"}
    # the marker's setup: what decides its graphs (torch's own keys, finer, decide whether an entry fits)
    warm, count = warm_before(Path(place), {"model": f"{type(ctx.model).__qualname__} {fingerprint(ctx.model)}",
                                            "compile": settings, "device": device_model(ctx.device),
                                            "cpu": ctx.hardware.cpu_model, "torch": torch.__version__})
    return {"compile cache": place,
            "warm start": (f"yes: this setup compiled here before ({count} graph entries kept); graphs of the same "
                           "shapes load instead of compiling" if warm else
                           "no: first compile of this setup here; the next run of it loads its graphs")}


def _unusable(place: Path) -> str:
    """Why torch cannot keep its graphs in accel's folder, or "": it is made (with accel's tag, so that `accel cache
    clear` knows it for accel's) and written to here, where torch would otherwise fail in the middle of a step: a
    folder that cannot be written, or on a disk too full for the kernels torch compiles (an empty file fits there)."""
    then = "torch keeps its compiled graphs in its own folder"
    if linked(place, CACHE, then):
        return "is a symbolic link: accel follows none in its cache"
    try:
        place.mkdir(parents=True, exist_ok=True)
        if any(linked(entry, CACHE, then) for entry in place.iterdir()):
            return "holds a symbolic link: accel follows none in its cache"
        # the tag's name decides, read again after the look: another process's tag written meanwhile, through a
        # temporary the look found, makes the folder accel's
        if not owns_compile_folder() and _foreign(place) and not owns_compile_folder():
            return "holds files accel did not write: it is not accel's to fill"
        if not owns_compile_folder():
            write_text(place / TAG, TAG_TEXT)
        tempfile.TemporaryFile(dir=place).close()
        free = shutil.disk_usage(place).free
    except OSError as error:
        return f"cannot be written: {error.strerror or error}"
    if free < ROOM:
        return f"is on a disk with {space(place)}, less than the {size_text(ROOM)} torch's compiled graphs may need"
    return ""


def _foreign(place: Path) -> bool:
    """Whether the untagged folder holds anything but the temporary files accel's writer makes of the tag (another
    process tagging it now: a regular file under a name of that writer's form, or one gone since the look)."""
    digest = temporary_name(place / TAG).name[len(PREFIX):].split("-")[0]  # (of the tag's name: the same in any)
    own = re.compile(rf"{re.escape(PREFIX + digest)}-[0-9a-f]{{8}}-[0-9]{{1,10}}-[0-9a-f]{{8}}{re.escape(SUFFIX)}")
    for entry in place.iterdir():
        try:
            regular = stat.S_ISREG(entry.lstat().st_mode)
        except FileNotFoundError:  # renamed over the tag since, or removed
            continue
        if not (regular and own.fullmatch(entry.name)):
            return True
    return False


def compile_usage(where: Any = True) -> tuple[int, int]:
    """(files, bytes) of compile's artifacts in the cache folder: none in a folder reached by a link (said)."""
    place = folder(where)
    if linked(place, CACHE, "its files are not accel's: neither counted nor cleared"):
        return 0, 0
    files = [p for p in place.rglob("*") if p.is_file() and not p.is_symlink()]  # (rglob follows no link)
    return len(files), sum(_stat(p).st_size for p in files)


TAG = "CACHEDIR.TAG"  # marks compile/ as accel's (and as a cache: backup tools skip it), https://bford.info/cachedir/
TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
            "# accel's folder of torch's compiled graphs: `accel cache clear` removes it\n")


def owns_compile_folder(where: Any = True) -> bool:
    """Whether compile/ is accel's: it holds accel's tag, or the markers of the setups accel compiled there (its own,
    not another folder's through a link)."""
    place = folder(where)
    if place.is_symlink():
        return False
    try:
        tagged = read_small(place / TAG, len(TAG_TEXT)).decode(errors="replace") == TAG_TEXT
    except OSError:
        tagged = False
    return tagged or ((place / MARKERS).is_dir() and not (place / MARKERS).is_symlink())


def clear_compile(where: Any = True) -> tuple[int, int]:
    """Remove compile's artifacts from the cache folder; returns the (files, bytes) removed: those gone, not those
    found (a file that could not be removed stays counted out). The next compile of any setup is cold. A folder
    accel did not make (no tag: _unusable writes one) is left as it is, and so is a folder of yours that
    TORCHINDUCTOR_CACHE_DIR names, or a link (said)."""
    if linked(folder(where), CACHE, "nothing is removed there") or not owns_compile_folder(where):
        return 0, 0
    found = compile_usage(where)
    shutil.rmtree(folder(where), ignore_errors=True)
    left = compile_usage(where)
    return found[0] - left[0], found[1] - left[1]

