"""Plan labels ('eager', 'auto', 'amp+compile'): one name for a plan in every report and table."""
from __future__ import annotations

from typing import Any

from accel.plan import Plan


def plan_label(plan: Any) -> str:
    """'eager' for the empty plan, 'auto', or the accelerator names in plan order joined by '+'."""
    if isinstance(plan, str) and plan == "auto":
        return "auto"
    if hasattr(plan, "resolve") and not hasattr(plan, "names"):
        return "auto"
    names = Plan(plan).names()
    return "+".join(names) if names else "eager"
