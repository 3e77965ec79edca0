"""Module paths that moved in 0.3 (issue 24's layout): each old path still imports, for one release, as the new
module itself, with a DeprecationWarning naming the new path.

``MOVED`` maps an old module to its new one; a package's entry covers its submodules too
(``accel.autotune.inloop`` is ``accel.search.inloop``). The finder below answers an import of an old name with
the new module object (``sys.modules[old] is sys.modules[new]``), so monkeypatching through either path patches
the same module, and pickles that name a class by its old module still load.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "accel.core": "accel.api",
    "accel.accelerator": "accel.plan.contract",
    "accel.declarations": "accel.plan.declarations",
    "accel.options": "accel.plan.options",
    "accel.compat": "accel.plan.compat",
    "accel.plancache": "accel.plan.cache",
    "accel.context": "accel.run.context",
    "accel.journal": "accel.run.journal",
    "accel.shared_settings": "accel.run.shared_settings",
    "accel.run_state": "accel.run.state",
    "accel.device_loader": "accel.run.device_loader",
    "accel.loaders": "accel.run.loaders",
    "accel.watch": "accel.run.watch",
    "accel.report": "accel.run.report",
    "accel.checkpoint": "accel.run.checkpoint",
    "accel.checkpoint_fit": "accel.run.checkpoint_fit",
    "accel.sharded_checkpoint": "accel.run.sharded_checkpoint",
    "accel.distributed": "accel.hardware.launch",
    "accel.compile_cache": "accel.accelerators.compile.cache",
    "accel.autotune": "accel.search",
    "accel.book": "accel.workloads.book",
}
SINCE, GOES = "0.3", "0.4"


def new_name(name: str) -> str | None:
    """The new path of an old module name (a moved package's submodules included), or None."""
    if name in MOVED:
        return MOVED[name]
    package, _, rest = name.rpartition(".")
    while package:
        if package in MOVED:
            return f"{MOVED[package]}.{name[len(package) + 1:]}"
        package, _, _ = package.rpartition(".")
    return None


def _caller() -> tuple[str, int, dict]:
    """The file, line and globals of the import statement that named the old path (outside importlib and here)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__
                                 or "importlib" in frame.f_code.co_filename.replace("\\", "/").split("/")[-2:-1]):
        frame = frame.f_back
    if frame is None:
        return __file__, 0, globals()
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and loads it as the new module itself, warning once (the import is cached)."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("accel.") or new_name(name) is None:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        new = new_name(spec.name)
        filename, lineno, where = _caller()
        warnings.warn_explicit(f"{spec.name} is {new} since {SINCE}; the old path goes in {GOES}",
                               DeprecationWarning, filename, lineno, module=where.get("__name__", "?"),
                               registry=where.setdefault("__warningregistry__", {}))
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # the new module ran when it was imported


def install() -> None:
    """Put the finder first on sys.meta_path (once)."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
