"""Chapter 9: training with multiple CPUs. DDP on one machine's cores with gloo, started through `accel launch`
(torchrun underneath): one process with 2 threads against 2 processes with 1 thread each, every process
pinned to its own physical cores. The global batch is the same in both (each of N ranks takes batch/N), so
the optimisation is the same up to the order of the samples, and the speed is what differs.

    python examples/ch09_ddp_cpu.py            # 3 epochs, global batch 64
    python examples/ch09_ddp_cpu.py --quick

A rank runs this file with --worker; the `ddp` accelerator finds the launcher's environment, joins the
process group and shards the loader. Run alone (no launcher) it is skipped with the reason in the report.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from common import (
    book_cnn,
    collect,
    digits,
    emit,
    environ_with,
    free_port,
    loader_for,
    parser,
    print_table,
    train,
    worker_flag,
)


def worker(args, device: str = "cpu") -> dict | None:
    """One rank (chapters 9, 10 and 11 share it): train with the plan; rank 0 gets the result averaged over ranks."""
    import torch

    import accel
    from accel.distributed import all_reduce_mean, barrier, is_main_process, world_size
    from accel.hardware.launcher import launcher_environment

    plan = json.loads(args.plan)
    train_set, test_set = digits(args.seed, 128 if args.quick else None)
    launch = launcher_environment()
    world = launch.world_size if launch else 1
    loader = loader_for(train_set, max(1, args.batch_size // world), args.seed)
    result = train(book_cnn(args.seed), loader, plan=plan, epochs=1 if args.quick else args.epochs, test_set=test_set,
                   device=device)
    barrier()
    seconds = all_reduce_mean(result["seconds"])  # the training loop's time, averaged over the ranks
    step_ms = all_reduce_mean(result["step_ms"] or 0.0)
    if is_main_process():
        print(result["report"])
        epochs = 1 if args.quick else args.epochs
        return {"processes": world_size(), "nodes": world // launch.local_world_size if launch else 1,
                "launcher": launch.launcher if launch else "none", "device": str(result["run"].device),
                "threads": torch.get_num_threads(), "seconds": seconds, "step_ms": step_ms,
                "samples_per_s": len(train_set) * epochs / seconds, "accuracy": result["accuracy"],
                "ddp": result["report"].row("ddp").status, "openmp": accel.probe().openmp}
    return None


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--epochs", type=int, default=3)
    args_parser.add_argument("--batch-size", type=int, default=64, help="global batch (split across the ranks)")
    worker_flag(args_parser)
    args_parser.add_argument("--plan", default='["threads", "ddp"]', help="the plan every rank uses (JSON)")
    args = args_parser.parse_args(argv)
    if args.worker:
        result = worker(args)
        if result is not None:  # rank 0
            emit(result)
        return 0
    me = str(Path(__file__).resolve())
    worker_args = [me, "--worker", "--plan", args.plan, "--epochs", str(args.epochs), "--batch-size",
                   str(args.batch_size), "--seed", str(args.seed)] + (["--quick"] if args.quick else [])
    rows = []
    layouts = ((2, 1),) if args.quick else ((1, 2), (2, 1))  # --quick checks the DDP path only
    for processes, cores in layouts:
        name = f"{processes} process{'es' if processes > 1 else ''} x {cores} thread{'s' if cores > 1 else ''}"
        command = [sys.executable, "-m", "accel", "launch", "--nproc-per-node", str(processes), "--cores-per-proc",
                   str(cores), "--master-port", str(free_port()), *worker_args]
        done = subprocess.run(command, env=environ_with(), capture_output=True, text=True)
        results = collect(done.stdout)
        print(f"--- {name}: {' '.join(command[2:7])} ... ---")
        if done.returncode != 0 or not results:
            print(done.stdout[-3000:], done.stderr[-3000:])
            rows.append({"variant": name, "ddp": f"failed (exit {done.returncode})"})
            continue
        print("\n".join(line for line in done.stdout.splitlines() if not line.startswith("EXAMPLE-RESULT")))
        rows.append({"variant": name, **results[0]})
    if not any("seconds" in row for row in rows):
        print("no variant ran; see the output above")
        return 1
    print_table(f"DDP on CPU (gloo), the book's CNN on real digits x {1 if args.quick else args.epochs} epochs, "
                f"global batch {args.batch_size}",
                [("variant", "variant", "s"), ("ddp", "ddp", "s"), ("threads", "threads/rank", "d"),
                 ("seconds", "train s", ".2f"), ("step_ms", "ms/step", ".1f"), ("samples_per_s", "samples/s", ".0f"),
                 ("accuracy", "test acc", ".3f")], rows, baseline=rows[0], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
