"""Rank 1 stops answering after setup; rank 0's first all-reduce must raise after ddp's timeout_s, not hang."""
import sys
import time
from pathlib import Path

import torch

import accel
from accel.distributed import rank
from accel.testing import tiny_loader, tiny_model, tiny_optimizer

model = tiny_model()
run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan={"ddp": {"timeout_s": 3}}, device="cpu")
if rank() == 1:
    time.sleep(300)  # alive but silent; torchrun ends it once rank 0 fails
x, y = next(iter(run.loader))
try:
    run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
except Exception as error:
    Path(sys.argv[1], "rank0.txt").write_text(f"{type(error).__name__}: {error}")
    raise
Path(sys.argv[1], "rank0.txt").write_text("no error")
