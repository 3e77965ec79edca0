"""Write what this rank runs on: its CPU affinity, OpenMP variables, torch threads and the threads report row."""
import json
import os
import sys
from pathlib import Path

import torch

import accel
from accel.distributed import all_reduce_mean, rank
from accel.hardware import loaded_openmp
from accel.testing import tiny_loader, tiny_model, tiny_optimizer

affinity_at_start = sorted(os.sched_getaffinity(0))
model = tiny_model()
run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=["threads", "ddp"], device="cpu")
row = run.report.row("threads")
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
Path(sys.argv[1], f"rank{rank()}.json").write_text(json.dumps({
    "affinity_at_start": affinity_at_start, "affinity": sorted(os.sched_getaffinity(0)),
    "torch_threads": torch.get_num_threads(), "openmp": loaded_openmp(),
    "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "ACCEL_CORE_MAP", "LOCAL_RANK",
                                           "KMP_AFFINITY", "LD_PRELOAD")},
    "threads_row": row.changes, "ddp": run.report.row("ddp").status, "mean_rank": all_reduce_mean(float(rank())),
    "argv": sys.argv[1:]}))
