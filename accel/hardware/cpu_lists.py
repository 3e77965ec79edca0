"""CPU lists as Linux writes them ('0-3,8'): read from /sys, written for GOMP_CPU_AFFINITY and taskset."""
from __future__ import annotations


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


def format_cpu_list(cpus: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5', the form GOMP_CPU_AFFINITY and taskset accept."""
    parts, cpus = [], sorted(cpus)
    start = prev = None
    for cpu in cpus + [None]:
        if start is None:
            start = prev = cpu
        elif cpu is not None and cpu == prev + 1:
            prev = cpu
        else:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = prev = cpu
    return ",".join(parts)
