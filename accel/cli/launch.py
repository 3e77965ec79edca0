"""accel launch: torchrun with the book's CPU settings: cores per rank (each rank pins itself first:
accel/distributed/rank_start.py), OpenMP threads, library preloads; variables the user set are kept, and all is printed.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from accel.distributed import rank_start
from accel.errors import AccelError
from accel.hardware import format_cpu_list, probe
from accel.hardware.launcher import CORE_MAP_VARIABLE as CORE_MAP
from accel.hardware.launcher import NODE_CPUS_VARIABLE as NODE_CPUS  # the node's cores, for the plan cache's key
from accel.hardware.launcher import cores_for_rank

ALLOCATORS = {"jemalloc": "libjemalloc.so*", "tcmalloc": "libtcmalloc*.so*"}
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"  # torch's run_cpu uses these
LIBRARY_DIRS = ("{prefix}/lib", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


class LaunchError(AccelError, ValueError):
    """A launch that cannot be done as asked (main() prints it and exits with 2)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "launch", help="start a distributed run (torchrun) with cores per rank and preloads",
        description="torchrun with each rank pinned to its own physical cores, OpenMP threads and library preloads "
                    "(docs/distributed.md). torchrun's spellings (--nproc_per_node, ...) are accepted too.")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes in the job")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this node's rank, 0..nnodes-1")
    parser.add_argument("--master-addr", "--master_addr", default=None,
                        help="rank 0's host; unset: $MASTER_ADDR, else 127.0.0.1")
    parser.add_argument("--master-port", "--master_port", type=int, default=None,
                        help="rank 0's port; unset: $MASTER_PORT, else 29500")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, help="processes on this node")
    parser.add_argument("--cores-per-proc", "--cores_per_proc", type=int, default=None,
                        help="physical cores per process; unset: this node's physical cores / processes")
    parser.add_argument("--iomp", action="store_true", help="preload Intel OpenMP (pip install intel-openmp)")
    parser.add_argument("--allocator", choices=("jemalloc", "tcmalloc", "none"), default="none",
                        help="preload this memory allocator")
    parser.add_argument("--max-restarts", "--max_restarts", type=int, default=0,
                        help="how often torchrun restarts all ranks after a failure")
    parser.add_argument("--dry-run", "--dry_run", action="store_true",
                        help="print the layout and the command, run nothing")
    parser.add_argument("script", help="the training script every rank runs")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def rank_layout(physical_cpus: tuple[int, ...], nproc: int, cores_per_proc: int | None, node_rank: int = 0):
    """[(global rank, local rank, cpus)] on this node: disjoint shares of its physical cores."""
    per = cores_per_proc or max(1, len(physical_cpus) // nproc)
    if per * nproc > len(physical_cpus):
        raise LaunchError(f"{nproc} processes x {per} cores need {per * nproc} physical cores; this node has "
                          f"{len(physical_cpus)} (allowed: --nproc-per-node x --cores-per-proc <= "
                          f"{len(physical_cpus)})")
    return [(node_rank * nproc + local, local, cores_for_rank(physical_cpus, local, nproc, per_rank=per))
            for local in range(nproc)]


def environment(layout, iomp: bool, allocator: str, environ, prefix: str = sys.prefix, node_cpus: tuple = ()):
    """(variables to set, user values kept): OpenMP threads, the core map, the node's cores (a pinned rank sees
    only its share; plan="auto"'s cache counts the node's, as a single process does), preloads."""
    wanted = {"OMP_NUM_THREADS": str(len(layout[0][2])),
              CORE_MAP: ";".join(",".join(map(str, cpus)) for _, _, cpus in layout),
              **({NODE_CPUS: format_cpu_list(node_cpus)} if node_cpus else {})}
    preload = []
    if iomp:
        library = Path(prefix) / "lib" / "libiomp5.so"
        if not library.exists():
            raise LaunchError(f"--iomp: {library} not found; install Intel OpenMP with: pip install intel-openmp")
        preload.append(str(library))
        wanted.update(KMP_BLOCKTIME="1")  # no KMP_AFFINITY: its compact binding pins every rank's children (a spawned
        # DataLoader worker) to the rank's first CPU; the rank is already pinned to its cores
    if allocator != "none":
        found = (sorted(glob.glob(os.path.join(d.format(prefix=prefix), ALLOCATORS[allocator]))) for d in LIBRARY_DIRS)
        library = next((files[0] for files in found if files), None)
        if library is None:
            raise LaunchError(f"--allocator {allocator}: no {ALLOCATORS[allocator]} in "
                              f"{', '.join(d.format(prefix=prefix) for d in LIBRARY_DIRS)}; install it (e.g. apt "
                              f"install lib{allocator}{'2' if allocator == 'jemalloc' else '-minimal4'}, or conda "
                              f"install {allocator}) or use --allocator none")
        preload.append(library)
        if allocator == "jemalloc":
            wanted["MALLOC_CONF"] = JEMALLOC_CONF
    kept = {k: environ[k] for k, v in wanted.items() if k not in (CORE_MAP, NODE_CPUS) and environ.get(k, v) != v}
    set_ = {k: v for k, v in wanted.items() if k not in kept}
    if preload:
        existing = [p for p in environ.get("LD_PRELOAD", "").split(":") if p]
        set_["LD_PRELOAD"] = ":".join(existing + [p for p in preload if p not in existing])
    return set_, kept


def check_numbers(args, environ=os.environ) -> int:
    """The launch's numbers, checked before anything starts; returns the master port."""
    for flag, value, least in (("--nnodes", args.nnodes, 1), ("--nproc-per-node", args.nproc_per_node, 1),
                               ("--cores-per-proc", args.cores_per_proc, 1), ("--max-restarts", args.max_restarts, 0)):
        if value is not None and value < least:  # --cores-per-proc unset: this node's cores / processes
            raise LaunchError(f"{flag} must be >= {least}, got {value}")
    if not 0 <= args.node_rank < args.nnodes:
        raise LaunchError(f"--node-rank must be in 0..{args.nnodes - 1} for --nnodes {args.nnodes}, "
                          f"got {args.node_rank}")
    if args.master_port is not None:
        port, source = args.master_port, "--master-port"
    else:
        text, source = environ.get("MASTER_PORT", "29500"), "MASTER_PORT"
        if not text.strip().isdigit():
            raise LaunchError(f"MASTER_PORT={text!r} is not a port number (1-65535)")
        port = int(text)
    if not 0 < port < 65536:
        raise LaunchError(f"{source} {port} is not a port number (1-65535)")
    return port


def run(args) -> int:
    master_addr = args.master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    physical = probe().physical_cpus
    master_port = check_numbers(args)
    layout = rank_layout(physical, args.nproc_per_node, args.cores_per_proc, args.node_rank)
    set_, kept = environment(layout, args.iomp, args.allocator, os.environ, node_cpus=physical)
    if not args.dry_run and not Path(args.script).is_file():
        raise LaunchError(f"the training script {args.script!r} does not exist")
    print(f"accel launch: {args.nnodes} node(s) x {args.nproc_per_node} process(es), {len(layout[0][2])} "
          f"physical core(s) each; node rank {args.node_rank}; master {master_addr}:{master_port}")
    for global_rank, local_rank, cpus in layout:
        print(f"  rank {global_rank} (local {local_rank}) -> cpus {format_cpu_list(cpus)}")
    print("environment set: " + " ".join(f"{k}={v}" for k, v in set_.items()))
    if kept:
        print("kept (already set by you): " + " ".join(f"{k}={v}" for k, v in kept.items()))
    print("each rank, before torch loads: affinity to its cpus")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.nnodes),
               "--node-rank", str(args.node_rank), "--master-addr", master_addr, "--master-port", str(master_port),
               "--nproc-per-node", str(args.nproc_per_node), "--max-restarts", str(args.max_restarts),
               str(Path(rank_start.__file__).resolve()), args.script, *args.script_args]
    print("command: " + shlex.join(command), flush=True)
    if args.dry_run:
        return 0
    return supervise(command, {**os.environ, **set_})


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def supervise(command: list[str], env: dict[str, str]) -> int:
    """Run torchrun, in a process group of its own, and pass it once every signal that asks the job to stop (Ctrl-C,
    SIGTERM, SIGHUP, SLURM's USR1/USR2); a second Ctrl-C or SIGTERM kills the job, and torchrun gets SIGTERM should
    this process die (SIGKILL). Returns torchrun's exit status (128 + the signal when a signal ended it)."""
    process = subprocess.Popen(command, env=env, preexec_fn=_own_group_ended_with_parent)
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        again = signum in (signal.SIGINT, signal.SIGTERM) and received.count(signum) > 1
        with contextlib.suppress(ProcessLookupError):
            if again:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        status = process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if status < 0:
        return 128 - status
    return 128 + received[0] if received and status else status  # stopped by the signal it was passed


def _own_group_ended_with_parent() -> None:
    """In torchrun, before it starts: its own process group, and SIGTERM when the launcher dies (Linux)."""
    os.setpgid(0, 0)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
