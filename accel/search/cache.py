"""Remembered plan choices: plan="auto" on the same setup returns at once, saying when it was measured.

One key (``setup_key``) for every search (in your loop, apart, each rank of a launched job): whatever decides the
answer, so any change measures again. Entries are JSON files in ``cache_dir()`` (accel.files), written whole by any
number of processes; beside them, as ``warmup-<key>.json``, the warm-up a costly candidate (compile) last took on a
setup (in the folder itself: a subfolder could be swapped for a link between a check and its use).
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from accel.batches import map_tensors
from accel.errors import loops_level
from accel.files import PREFIX, SUFFIX, cache_dir, left_over, linked, read_small, write_text
from accel.hardware import device_model
from accel.hardware.launcher import node_cores
from accel.modules import fingerprint
from accel.plan.contract import REGISTRY
from accel.plan.plan import Plan
from accel.plan.untrusted import code_problems
from accel.version import __version__


def function_key(fn: Any) -> str:
    """Where a function comes from and a digest of its code: two different lambdas are two keys."""
    if isinstance(fn, functools.partial):
        return f"partial({function_key(fn.func)}, {len(fn.args)} args, {sorted(fn.keywords)})"
    code = getattr(fn, "__code__", None)
    digest = hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:12] if code else ""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)} {digest}".strip()


KEY_SETTINGS = ("tolerance", "margin", "expected_steps", "accelerators", "candidates")  # what it looks for, not how


def setup_key(model, optimizer, loader, batch, device, hardware, step, settings: dict) -> dict[str, Any]:
    """The facts that decide a search's answer here, readable (``accel cache list``): the device by type and model
    (not its index), the CPU by the node's physical cores (not a rank's share), the loader by workers and pinning."""
    flags = {k: v for k, v in sorted(optimizer.defaults.items()) if isinstance(v, (bool, str)) or v is None}
    functions = {name: function_key(fn) for name, fn in
                 (("step_fn", step.step_fn), ("loss_fn", step.loss_fn), ("split", step.split)) if fn is not None}
    batch = map_tensors(lambda t: f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}", batch)
    return {
        "model": f"{type(model).__qualname__} {fingerprint(model)}",
        "batch": batch if isinstance(batch, str) else repr(batch),
        "optimizer": f"{type(optimizer).__name__} {flags} {len(optimizer.param_groups)} group(s)",
        "device": device_model(torch.device(device)),
        "cpu": f"{hardware.cpu_model} [{','.join(hardware.isa)}] {node_cores(hardware.physical_cores)} cores",
        "versions": f"torch {torch.__version__}, accel {__version__}",
        "accelerators": sorted(REGISTRY),
        "data": f"{type(loader).__name__} workers={getattr(loader, 'num_workers', 0)} "
                  f"pin_memory={getattr(loader, 'pin_memory', False)}",
        "settings": {k: settings.get(k) for k in KEY_SETTINGS},
        "functions": functions,
    }


def key_of(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


ENTRY = re.compile(r"[0-9a-f]{24}\.json")  # the names store() gives entries: nothing else in the folder is accel's
WARMUP = "warmup-"  # the name's start of a warm-up's entry (not a plan: not listed)
ENTRY_LIMIT = 1 << 20  # an entry is a few KiB: a larger file under its name is not one


def _bounded(digits: str) -> int:
    """A JSON integer within float's range: JSON sets no bound, and a number of a few hundred digits in an entry
    would raise OverflowError wherever it is read as seconds."""
    if len(digits.lstrip("-")) > 308:
        raise ValueError(f"an integer of {len(digits)} digits")
    return int(digits)


def _entry(path: Path) -> dict[str, Any] | None:
    """An entry as store() writes it, or None: a file damaged, of another shape, a link (refused by the read itself,
    said), or crafted (a plan that would run code: accel.plan.untrusted) is not one."""
    try:
        # (read_small: a named pipe or a terabyte in a shared folder)
        entry = json.loads(read_small(path, ENTRY_LIMIT), parse_int=_bounded)
    except (OSError, ValueError, UnicodeError, RecursionError):  # (a link is refused by the open: said)
        linked(path, "the plan cache", "it is not read as an entry (a search measures again; storing its answer "
                                       "replaces the link)")
        return None
    result = entry.get("result") if isinstance(entry, dict) else None
    plan = result.get("plan") if isinstance(result, dict) else None
    if not isinstance(plan, dict) or not isinstance(entry.get("key"), dict) or code_problems(plan) or \
            Plan.parse(plan)[1] or any(REGISTRY[name].keeps.weights == "changed" for name in plan):
        return None  # (a plan that changes what is trained is never a search's answer: a file's word cannot make it)
    return entry


def lookup(parts: dict[str, Any], where: Any = True, kind: str = "") -> dict[str, Any] | None:
    """The remembered result (TuneResult.to_dict()) for these facts, or None (then the search measures again)."""
    entry = _entry(cache_dir(where) / f"{kind}{key_of(parts)}.json")
    return entry["result"] if entry is not None and entry["key"] == json.loads(json.dumps(parts, default=str)) else None


def store(parts: dict[str, Any], result: dict[str, Any], where: Any = True, what: str = "the choice", kind: str = ""
          ) -> str:
    """Remember a choice (TuneResult.to_dict()); its key, or "" when not kept: a plan that would not come back as it
    was (tensors, functions), or a cache that cannot be written (said)."""
    key, folder = key_of(parts), cache_dir(where)
    try:
        json.dumps(result["plan"])
    except (TypeError, ValueError):
        return ""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_text(folder / f"{kind}{key}.json",
                   json.dumps({"key": parts, "result": {**result, "key": key}}, default=str, indent=1))
    except OSError as error:
        warnings.warn(f"accel: the plan cache {folder} cannot be written ({error}); {what} is not remembered",
                      stacklevel=loops_level())
        return ""
    return key


WARMUP_FACTS = ("model", "batch", "device", "cpu", "versions")  # what a warm-up (compile's) depends on


def _warmup(facts: dict[str, Any], candidate: dict[str, dict]) -> dict[str, Any]:
    return {**{k: facts.get(k) for k in WARMUP_FACTS}, "candidate": candidate}


def known_warmup(facts: dict[str, Any] | None, candidate: dict[str, dict], where: Any = True) -> float | None:
    """Seconds a costly candidate's warm-up took when last measured on this setup (a search's key facts), or None
    (never, or no cache)."""
    entry = lookup(_warmup(facts, candidate), where, WARMUP) if facts and where else None
    seconds = (entry or {}).get("seconds")
    return float(seconds) if type(seconds) in (int, float) and 0 <= seconds < float("inf") else None


def remember_warmup(facts: dict[str, Any] | None, candidate: dict[str, dict], seconds: float, where: Any = True
                    ) -> None:
    """Keep a measured warm-up (the candidate's first steps beyond as many steady steps), where there is a cache."""
    if facts and where:
        store(_warmup(facts, candidate), {"plan": candidate, "seconds": round(max(seconds, 0.0), 3),
                                          "measured_at": datetime.datetime.now().isoformat(timespec="seconds")},
              where, "the warm-up", WARMUP)


def entries(where: Any = True) -> list[dict[str, Any]]:
    """Every remembered choice: key, plan, when, why and the facts; a file of accel's name that is not an entry is
    listed as unreadable."""
    found = []
    for path in sorted(p for p in cache_dir(where).glob("*.json") if ENTRY.fullmatch(p.name)):
        entry = _entry(path) or {"key": {}, "result": {"plan": None, "why": "unreadable entry"}}
        result = entry["result"]
        found.append({"key": path.stem, "plan": result["plan"], "measured_at": str(result.get("measured_at", "")),
                      "facts": entry["key"], "why": str(result.get("why", ""))})
    return found


def clear(where: Any = True, key: str | None = None) -> int:
    """Forget every remembered choice (or those of a key prefix) and how many: only what accel wrote goes. Clearing
    all forgets the warm-ups too (counted); compile's artifacts are `accel cache clear`'s to remove (clear_compile)."""
    folder, removed = cache_dir(where), 0
    for path in folder.glob("*.json"):
        name = path.name.removeprefix(WARMUP) if key is None else path.name  # a key names a plan's entry only
        removed += bool(ENTRY.fullmatch(name)) and name.startswith(key or "") and _unlink(path)
    for path in folder.glob(f"{PREFIX}*{SUFFIX}") if key is None else ():  # accel's, but not a live writer's
        if left_over(path):
            _unlink(path)
    return removed


def _unlink(path: Path) -> bool:
    """Remove a file of accel's name; a folder under that name is someone else's, and stays."""
    with contextlib.suppress(IsADirectoryError):
        path.unlink(missing_ok=True)
        return True
    return False
