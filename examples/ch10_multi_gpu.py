"""Chapter 10: training with multiple GPUs. DDP with NCCL, one process per GPU, started with torchrun: the book's
CNN on real digits on 1 GPU against all the GPUs of this machine (same global batch), with bf16/fp16 autocast
through the `amp` accelerator.

    python examples/ch10_multi_gpu.py                         # needs 2 or more CUDA GPUs
    python examples/ch10_multi_gpu.py --device cpu --gpus 2   # rehearse the same script on CPU with gloo
    python examples/ch10_multi_gpu.py --quick

On a machine with fewer than 2 GPUs it says so and exits 0. Each rank is this file with --worker
(the rank code is chapter 9's); by hand:

    torchrun --standalone --nproc-per-node 4 examples/ch10_multi_gpu.py --worker
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ch09_ddp_cpu import worker
from common import collect, emit, environ_with, free_port, missing, parser, print_table, worker_flag


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--epochs", type=int, default=3)
    args_parser.add_argument("--batch-size", type=int, default=256, help="global batch (split across the GPUs)")
    args_parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args_parser.add_argument("--gpus", type=int, default=None, help="processes for the multi-GPU row (default: all)")
    args_parser.add_argument("--plan", default=None, help='JSON plan for every rank (default ["amp", "ddp"] on cuda)')
    worker_flag(args_parser)
    args = args_parser.parse_args(argv)
    args.plan = args.plan or ('["amp", "ddp"]' if args.device == "cuda" else '["ddp"]')
    if args.worker:
        result = worker(args, device=args.device)
        if result is not None:  # rank 0
            emit(result)
        return 0
    import torch

    found = torch.cuda.device_count() if args.device == "cuda" else (args.gpus or 2)
    if found < 2:
        return missing(f"chapter 10 needs 2 or more CUDA GPUs; this machine has {found} "
                       f"(torch {torch.__version__}, cuda available: {torch.cuda.is_available()})",
                       "Run it on a multi-GPU machine, or rehearse the script on CPU: "
                       "python examples/ch10_multi_gpu.py --device cpu --gpus 2 --quick")
    gpus = min(args.gpus or found, found)
    me = str(Path(__file__).resolve())
    rows = []
    for processes in (1, gpus):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
                   "--master-port", str(free_port()), me, "--worker", "--device", args.device, "--plan", args.plan,
                   "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--seed", str(args.seed),
                   *(["--quick"] if args.quick else [])]
        done = subprocess.run(command, env=environ_with(OMP_NUM_THREADS="1"), capture_output=True, text=True)
        results = collect(done.stdout)
        name = f"{processes} {args.device} process{'es' if processes > 1 else ''}"
        print(f"--- {name} ---\n{done.stdout[-3000:]}" + (done.stderr[-3000:] if done.returncode else ""))
        rows.append({"variant": name, **(results[0] if results else {"ddp": f"failed (exit {done.returncode})"})})
    if not all("seconds" in row for row in rows):
        return 1
    print_table(f"DDP on {args.device} ({'nccl' if args.device == 'cuda' else 'gloo'}), the book's CNN on real digits, "
                f"global batch {args.batch_size}",
                [("variant", "variant", "s"), ("device", "device (rank 0)", "s"), ("ddp", "ddp", "s"),
                 ("seconds", "train s", ".2f"), ("step_ms", "ms/step", ".1f"), ("samples_per_s", "samples/s", ".0f"),
                 ("accuracy", "test acc", ".3f")], rows, baseline=rows[0], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
