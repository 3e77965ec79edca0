"""What accel reads from files: how large it may unfold, and what a plan from a file accel wrote may set.

A file (a plan, a checkpoint, a cache entry) may be small on disk and huge once unfolded (YAML aliases and
pickle's shared references point at one list from many places): ``unfolding`` counts a walk's visits and stops
at a limit, before anything else walks it. A plan from a file accel wrote (a checkpoint's, the cache's) is data
whoever could write the file chose: it imports nothing (accel.run.checkpoint.resolve) and may not set an option
that makes accel run a program or load code (``CODE_OPTIONS``).
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
