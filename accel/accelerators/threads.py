"""threads: compute threads = this rank's physical cores, pinned to them.

What it does: decides this rank's cores (``accel launch``'s core map, else an equal share per local rank) and as
many intra-op threads, and pins every thread of the process to them. When it helps: several ranks on one machine,
and where the default counts hyper-threads.

What it keeps: the same math (``SAME_MATH``); every change goes through the journal. Its card:
docs/accelerators/threads.md.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

from accel.errors import Problem, loops_level
from accel.hardware import format_cpu_list, loaded_openmp
from accel.hardware.launcher import rank_cores
from accel.plan.contract import SAME_MATH, Accelerator, Capability, Stage, State, register
from accel.plan.options import Options, at_least, option
from accel.run.shared_settings import set_by_runs

__all__ = ["Threads", "ThreadsOptions"]


def openmp_variables(runtime: str, threads: int) -> dict[str, str]:
    """The OpenMP variables for the loaded runtime, without the binding ones (``OMP_PROC_BIND``, ``GOMP_CPU_AFFINITY``,
    ``KMP_AFFINITY``), which bind the main thread of every child that loads OpenMP to the first CPU, all children on
    one: a child inherits the process's affinity instead, which confines its threads to its CPUs."""
    tuning = {"KMP_BLOCKTIME": "1"} if runtime == "intel" else {"OMP_SCHEDULE": "STATIC"}
    return {"OMP_NUM_THREADS": str(threads), **tuning}


@dataclass(frozen=True, kw_only=True)
class ThreadsOptions(Options):
    threads: str | int = option("auto", (str, int), choices=("auto",), check=at_least(1),
                                help="intra-op threads; auto = this rank's physical cores")
    affinity: bool = option(True, (bool,), help="pin this process's threads to its physical cores")
    export_env: bool = option(True, (bool,), help="export the OpenMP variables for child processes")


@register
class Threads(Accelerator[ThreadsOptions, State]):
    """Compute threads = physical cores (per local rank), pinned, with OpenMP variables for children."""

    name = "threads"
    stage = Stage.ENVIRONMENT
    provides = (Capability.PROCESS_THREADS,)
    keeps = SAME_MATH

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}]

    def decide(self, ctx):
        try:
            cpus, source = rank_cores(ctx.hardware.physical_cpus, ctx.decisions.launch)
        except ValueError as error:  # a core map no `accel launch` writes: a problem of the plan, said with the rest
            ctx.problems.append(Problem(self.name, str(error), field="cpus"))
            return
        auto = self.config.threads == "auto"
        threads = len(cpus) if auto else self.config.threads
        ctx.decide("cpus", cpus, f"{format_cpu_list(cpus)} ({source})")
        ctx.decide("threads", threads, "this rank's physical cores" if auto else "asked for")

    def apply(self, ctx):
        journal, launch = ctx.journal, ctx.decisions.launch
        threads, cpus = ctx.decisions.threads, ctx.decisions.cpus
        changes = {"threads": threads}
        if threads > len(ctx.hardware.cpus_allowed):
            warnings.warn(f"{threads} threads on {len(ctx.hardware.cpus_allowed)} allowed CPUs oversubscribe the cores",
                          stacklevel=loops_level())
        journal.set_threads(threads)
        _, source = rank_cores(ctx.hardware.physical_cpus, launch)  # where decide() took the cores from
        if (launch and launch.local_world_size > 1) or source == "accel launch":
            local = f"{launch.local_rank}/{launch.local_world_size}" if launch else "0/1"
            changes["rank_cores"] = f"local rank {local} -> cpus {format_cpu_list(cpus)} ({source})"
        if self.config.affinity:
            changes["affinity"] = (format_cpu_list(cpus) if journal.set_affinity(cpus)
                                   else "not set: this OS offers no CPU affinity")
        changes["openmp"] = runtime = loaded_openmp()
        if self.config.export_env:
            exported, kept = [], []
            for key, value in openmp_variables(runtime, threads).items():
                # the user's own value is kept; another open run's (one run per model) is layered over
                if key in os.environ and os.environ[key] != value and not set_by_runs(("environ", key)):
                    kept.append(f"{key}={os.environ[key]}")
                else:
                    journal.setenv(key, value)
                    exported.append(f"{key}={value}")
            changes["exported_for_children"] = " ".join(exported) or "none"
            if kept:
                changes["kept_user_values"] = " ".join(kept)
            changes["in_this_process"] = "threads and affinity only; OpenMP variables apply from the next start"
        return changes
