"""Memory over a long run: what the run's own bookkeeping holds after 100,000 settled steps, flat or growing.

A run records the time of every step for its report (``run.report.step_times``); until issue 40 that was a list
that grew by one float a step for ever (33 bytes a step: 33 MB per million). Now it keeps bounded statistics
(accel.run.report.StepTimes). This script trains a real run on a model small enough that 100,000 steps take
seconds (a Linear(8, 2) on one cached batch, plan=[]: every step goes through run.backward and run.step, so the
report records each), and prints, every 10,000 steps, the Python memory allocated since the start (tracemalloc:
everything Python allocates, the report included) and the process's resident memory; then the report's own size.

    python benchmarks/bench_step_memory.py [--steps 100000] [--every 10000] [--plan ...] [--record-only]

``--record-only`` drives the report's recording path alone (``report.step_times.append``, what run.step calls), a
million steps in seconds; without it every step is a real training step (minutes: tracemalloc slows them).

Flat means: the allocated column stays within a few KiB after the first rows (allocator noise, torch's caches),
instead of climbing by about 3.3 MB every 100,000 steps as the list did.
"""
from __future__ import annotations

import argparse
import resource
import sys
import tracemalloc

import torch

import accel


def resident_mib() -> float:
    """The process's resident memory now (Linux: /proc), else its peak."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def report_bytes(report) -> int:
    """What the report's step statistics hold (the object and its numbers)."""
    times = report.step_times
    return sys.getsizeof(times) + sys.getsizeof(getattr(times, "latest", times)) + 24 * len(
        getattr(times, "latest", times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000)
    parser.add_argument("--plan", default="", help="comma-separated accelerators (default: the empty plan)")
    parser.add_argument("--record-only", action="store_true", help="time nothing: record a step time per step")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    run = accel.accelerate(model, optimizer, None, plan=[p for p in args.plan.split(",") if p], device="cpu")
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    tracemalloc.start()
    start, _ = tracemalloc.get_traced_memory()
    print(f"{'steps':>9}  {'allocated since start (KiB)':>28}  {'resident (MiB)':>14}  {'report holds (KiB)':>18}")
    for step in range(1, args.steps + 1):
        if args.record_only:
            run.report.step_times.append(1e-3)
        else:
            run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
            run.step()
        if step % args.every == 0:
            now, _ = tracemalloc.get_traced_memory()
            print(f"{step:>9}  {(now - start) / 1024:>28.1f}  {resident_mib():>14.1f}  "
                  f"{report_bytes(run.report) / 1024:>18.1f}", flush=True)
    print(f"report: {run.report.timing()}")
    run.close()


if __name__ == "__main__":
    main()
