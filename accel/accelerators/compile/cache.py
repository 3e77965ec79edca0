"""compile's compiled artifacts kept in accel's cache folder, so that a second run of a script compiles warm."""
# torch already keeps what inductor compiles on disk, and looks there before compiling again: the AOTAutograd
# cache (a training step's forward and backward graphs, ``aotautograd/``), the FX graph cache (the code inductor
# generated for each graph, ``fxgraph/``) and the C++ (or Triton) kernels that code loads. Both caches are on by
# default in torch 2.15 (``torch._functorch.config.enable_autograd_cache`` and ``torch._inductor.config.
# fx_graph_cache``, without a JustKnob outside Meta), and their folder is ``$TORCHINDUCTOR_CACHE_DIR``, which
# ``torch._inductor.runtime.cache_dir_utils.cache_dir()`` reads at every look-up and write (only max-autotune's
# local results keep the folder of their first look-up in a process), else ``/tmp/torchinductor_<user>``: a folder
# the system may clear (tmpfs, tmp cleaners), shared by every torch program of the user, apart from accel's other
# remembered answers. So for the run accel points that variable at
# ``compile/`` in its own cache folder (``accel.files.cache_dir()``), through the run's journal: closing the
# run, or a plan that fails, puts the variable back as it was. Measured here (benchmarks/bench_compile_warmup.py
# --warm; docs/accelerators/compile.md): a warm start skips AOTAutograd's tracing, inductor's code generation and
# the C++ compiler; dynamo still traces the Python code.
#
# One folder for every setup, not one per setup: the variable is process-wide, so two runs in one process (a GAN's
# generator and discriminator, each compiled on its first step) would write into whichever folder the newest run
# set; torch's own keys (the graph, the shapes, the inductor config, the CPU, torch's version) decide whether an
# entry fits, so sharing never loads a wrong one. Whether *this* setup was warm is judged by a small marker per
# setup (the model's structure, the compile settings, the device and CPU, torch's version) written when compile is
# applied: warm when an earlier run of the setup left a marker, and graph entries were written into the folder
# since that marker's first run (so a run that stopped before its first step counts for nothing, unless another
# setup compiled into the folder meanwhile). Graphs of other shapes, or of changed model code, still compile.
#
# Not ``torch.compiler.save_cache_artifacts()`` / ``load_cache_artifacts()``: those serialise what this process
# compiled, as bytes to carry to another machine, and need a call after the compile and one before the next; the
# disk caches do the same on one machine with nothing to call, even for a run that never closes. A folder chosen by
# the user (``TORCHINDUCTOR_CACHE_DIR`` set to anything but torch's default) is theirs: accel uses it as it is.
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from accel.files import cache_dir, read_small, write_text
from accel.hardware.devices import device_model
from accel.modules import fingerprint
from accel.run.shared_settings import set_by_runs

ENV = "TORCHINDUCTOR_CACHE_DIR"
GRAPHS = ("aotautograd", "fxgraph")  # torch's entries: one folder each, fxgraph/ by two-letter prefix
MARKERS = "accel-setups"
SLACK_S = 2.0  # file systems that keep modification times to the second or two (FAT: 2 s)


def folder(where: Any = True) -> Path:
    """Where compile's artifacts are kept: ``compile/`` in accel's cache folder."""
    return cache_dir(where) / "compile"


def caches_off() -> str:
    """Why torch will not keep compiled graphs (it compiles them again every run), or "" when it does. The
    AOTAutograd cache keeps its graphs in the FX graph cache, and is bypassed without it."""
    import torch._functorch.config
    import torch._inductor.config

    if torch._inductor.config.force_disable_caches:
        return "torch.compiler.config.force_disable_caches is True"
    if not torch._inductor.config.fx_graph_cache:
        return "torch._inductor.config.fx_graph_cache is False (TORCHINDUCTOR_FX_GRAPH_CACHE=0?)"
    if not torch._functorch.config.enable_autograd_cache:
        return "torch._functorch.config.enable_autograd_cache is False (TORCHINDUCTOR_AUTOGRAD_CACHE=0?)"
    return ""


def users_folder() -> str | None:
    """The folder the user chose for torch's caches, or None: unset, torch's default (torch writes that into the
    environment at its first look-up), or set by an open run."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get(ENV)
    if not chosen or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()) or set_by_runs(("environ", ENV)):
        return None
    return chosen


def graph_entries(where: Path) -> list[Path]:
    """torch's compiled-graph entries in a cache folder."""
    found = []
    for kind in GRAPHS:
        top = where / kind
        levels = [top] if kind == "aotautograd" else _folders(top)
        for level in levels:
            found.extend(_folders(level))
    return found


def _folders(path: Path) -> list[Path]:
    try:
        return [entry for entry in path.iterdir() if entry.is_dir()]
    except OSError:
        return []


def setup_key(facts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def warm_before(where: Path, facts: dict[str, Any]) -> tuple[bool, int]:
    """Whether this setup compiled into the folder before (the module's docstring says how that is judged), and
    how many graph entries the folder holds; records this run's marker."""
    marker = _marker(where, facts)
    first = _first_run(marker)
    warm, count = _judged(where, first)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_text(marker, json.dumps({"setup": facts, "first_run": time.time() if first is None else first,
                                       "last_run": time.time()}, default=str, indent=1))
    except OSError:
        pass  # torch says for itself when it cannot write the folder; the marker is only the report's
    return warm, count


def would_start_warm(model, device, cpu_model: str, settings: dict[str, Any], where: Any = True) -> bool:
    """Whether compile with these settings (as compile's apply passes them) would start warm on this setup now,
    judged as warm_before judges it, but read-only: no marker is written (a search asks before it tries compile,
    to expect a warm start's warm-up, seconds, and not a cold one's, tens of seconds). False where accel does not
    keep the folder (your own TORCHINDUCTOR_CACHE_DIR, caches off) or the backend keeps nothing (not inductor)."""
    if settings.get("backend", "inductor") != "inductor" or users_folder() or caches_off():
        return False
    place = Path(os.path.abspath(folder(where)))
    return _judged(place, _first_run(_marker(place, model_facts(model, device, cpu_model, settings))))[0]


def _marker(where: Path, facts: dict[str, Any]) -> Path:
    return where / MARKERS / f"{setup_key(facts)}.json"


def _first_run(marker: Path) -> float | None:
    try:
        return float(json.loads(read_small(marker, 1 << 16))["first_run"])  # a pipe or a terabyte: not a marker
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # no marker, or a damaged one: cold
        return None


def _judged(where: Path, first: float | None) -> tuple[bool, int]:
    """Warm when the setup has a marker and graph entries were written since its first run; the entries' count."""
    entries = graph_entries(where)
    return first is not None and any(_mtime(e) >= first - SLACK_S for e in entries), len(entries)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("-inf")


def setup_facts(ctx, settings: dict[str, Any]) -> dict[str, Any]:
    """What decides this setup's graphs, for its marker: the model's structure, the compile settings, the device
    and CPU, torch's version (torch's own keys, finer, decide whether an entry fits)."""
    return model_facts(ctx.model, ctx.device, ctx.hardware.cpu_model, settings)


def model_facts(model, device, cpu_model: str, settings: dict[str, Any]) -> dict[str, Any]:
    """setup_facts of a model not yet applied (a search asks before it tries compile)."""
    return {"model": f"{type(model).__qualname__} {fingerprint(model)}", "compile": settings,
            "device": device_model(torch.device(device)), "cpu": cpu_model, "torch": torch.__version__}


def keep_in_accel_cache(ctx, settings: dict[str, Any], where: Any = True) -> dict[str, str]:
    """Point torch's compile caches at accel's folder for the run (``ctx.journal``: undone when the run closes or
    its plan fails); returns the report's lines: where the cache is, and whether this setup starts warm. Where
    that folder cannot be written (a read-only cache), or holds files accel did not put there, torch's own folder
    is left in place: compile works as it does without accel."""
    theirs = users_folder()
    if theirs:
        return {"compile cache": f"{theirs} (your {ENV}; accel leaves it as it is)"}
    place = os.path.abspath(folder(where))  # torch writes back the absolute path: the same value stays the run's
    unusable = _unusable(Path(place), where)
    if unusable:
        return {"compile cache": f"torch's own ({place} {unusable})"}
    ctx.journal.setenv(ENV, place)
    off = caches_off()
    if off:
        return {"compile cache": place, "warm start": f"off ({off}): the graphs compile again every run"}
    warm, count = warm_before(Path(place), setup_facts(ctx, settings))
    return {"compile cache": place,
            "warm start": (f"yes: this setup compiled here before ({count} graph entries kept); graphs of the same "
                           "shapes load instead of compiling" if warm else
                           "no: first compile of this setup here; the next run of it loads its graphs")}


def _unusable(place: Path, where: Any) -> str:
    """Why torch cannot keep its graphs in accel's folder, or "": it is made (with accel's tag, so that `accel cache
    clear` knows it for accel's) and written to here, where torch would otherwise fail in the middle of a step."""
    try:
        place.mkdir(parents=True, exist_ok=True)
        if not owns_compile_folder(where):
            if any(place.iterdir()):
                return "holds files accel did not write: it is not accel's to fill"
            write_text(place / TAG, TAG_TEXT)
        with tempfile.TemporaryFile(dir=place):
            pass
    except OSError as error:
        return f"cannot be written: {error.strerror or error}"
    return ""


def compile_usage(where: Any = True) -> tuple[int, int]:
    """(files, bytes) of compile's artifacts in the cache folder."""
    files = [p for p in folder(where).rglob("*") if p.is_file() and not p.is_symlink()]
    return len(files), sum(_size(p) for p in files)


TAG = "CACHEDIR.TAG"  # marks compile/ as accel's (and as a cache: backup tools skip it), https://bford.info/cachedir/
TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
            "# accel's folder of torch's compiled graphs: `accel cache clear` removes it\n")


def owns_compile_folder(where: Any = True) -> bool:
    """Whether compile/ is accel's: it holds accel's tag, or the markers of the setups accel compiled there."""
    place = folder(where)
    try:
        return read_small(place / TAG, len(TAG_TEXT)).decode(errors="replace") == TAG_TEXT or (place / MARKERS).is_dir()
    except OSError:
        return (place / MARKERS).is_dir()


def clear_compile(where: Any = True) -> tuple[int, int]:
    """Remove compile's artifacts from the cache folder; returns the (files, bytes) removed. The next compile of
    any setup is cold. A folder accel did not make (no tag: _unusable writes one) is left
    as it is, and so is a folder of yours that TORCHINDUCTOR_CACHE_DIR names."""
    if not owns_compile_folder(where):
        return 0, 0
    found = compile_usage(where)
    shutil.rmtree(folder(where), ignore_errors=True)
    return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # removed meanwhile
        return 0
