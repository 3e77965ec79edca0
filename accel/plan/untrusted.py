"""What accel reads from files: how large it may unfold, and what a plan from a file accel wrote may set.

Any file (a plan file, a checkpoint, a cache entry) may hold a structure that is small on disk and huge once
unfolded: YAML aliases and pickle's shared references point at one list from many places, so each level
multiplies what a walk over it visits (a 349-byte YAML plan unfolds to billions of values). ``unfolding``
walks it once, counting every visit, and stops at a limit, before anything else walks it.

Plans read from files accel wrote: a checkpoint's plan (run.load, saved_plan) and the plans the cache remembered.

Such a file is data that whoever could write it chose (a checkpoint from elsewhere, a shared cache folder), so a
plan from it is held to more than a plan of your own code: it imports nothing (functions are found only where
they are already imported: accel.run.checkpoint.resolve), and it may not set an option that makes accel run a
program or load code when the plan is applied. Those options are listed here; everything else in a plan is
plain values that the accelerators check.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_VISITS = 1_000_000  # far above a checkpoint's own (one per tensor, group entry and random-state word)
MAX_DEPTH = 100  # run.save's states nest a handful of levels; deeper data would overflow a recursive walk


def unfolding(value: Any, visits: int = MAX_VISITS, depth: int = MAX_DEPTH) -> str:
    """Why value is too large or deep once unfolded (a walk of it would visit each shared part again), or ""."""
    stack, left = [(value, 0)], visits
    while stack:
        item, level = stack.pop()
        left -= 1
        if left < 0:
            return f"unfolds to more than {visits:,} values (aliases or shared references)"
        if level > depth:
            return f"nests deeper than {depth} levels"
        if isinstance(item, Mapping):
            stack.extend((v, level + 1) for pair in item.items() for v in pair)
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((v, level + 1) for v in item)
    return ""


CODE_OPTIONS = {
    ("compile", "options"): "compile.options (inductor's configuration, which names the C++ compiler it runs, its "
                            "flags and the code it loads)",
}


def code_problems(plan: Any) -> list[str]:
    """The options of this plan that only your own code may set (CODE_OPTIONS), in words; [] when none."""
    if not isinstance(plan, Mapping):
        return []
    return [what for (name, option), what in CODE_OPTIONS.items()
            if isinstance(plan.get(name), Mapping) and plan[name].get(option) not in (None, {})]
