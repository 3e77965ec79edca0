"""Train the tiny CNN on real digits through accel; with --ckpt, checkpoint every step and resume after a restart.

Each rank writes <out>/rank<R>.pt: final parameters, the sample indices it saw per epoch, the step it resumed
from, and its report. --kill-rank/--kill-step make that rank SIGKILL itself once (a marker file remembers it).
"""
import argparse
import json
import os
import signal
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.distributed import all_reduce_mean, is_main_process, rank
from accel.workloads import TinyCNN, digits_datasets

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--plan", default="ddp")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--samples", type=int, default=512)
parser.add_argument("--global-batch-reference", action="store_true",
                    help="one process, the global batch, the same sample order as DistributedSampler gives 2 ranks")
parser.add_argument("--ckpt")
parser.add_argument("--kill-rank", type=int)
parser.add_argument("--kill-step", type=int)
parser.add_argument("--marker")
parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
args = parser.parse_args()

train, _ = digits_datasets(seed=0)
images, labels = train.tensors
dataset = TensorDataset(images[:args.samples], labels[:args.samples], torch.arange(args.samples))
torch.manual_seed(0)
model = TinyCNN()
optimizer = (torch.optim.Adam(model.parameters(), lr=0.003) if args.optimizer == "adam" else
             torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
if args.global_batch_reference:
    from torch.utils.data.distributed import DistributedSampler

    loader = DataLoader(dataset, batch_size=args.batch_size,
                        sampler=DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=7))
else:
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(7))
plan = json.loads(args.plan) if args.plan.startswith(("[", "{")) else [n for n in args.plan.split(",") if n]
run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")

step = resumed_from = 0
if args.ckpt and Path(args.ckpt).exists():
    resumed_from = step = run.load(args.ckpt)["step"]
seen: dict[int, list[int]] = {}
per_epoch = len(run.loader)
losses = []
for epoch in range(step // per_epoch, args.epochs):
    run.loader.epoch = epoch  # the sampler's order of this epoch, also after a restart
    for i, (x, y, index) in enumerate(run.loader):
        if epoch * per_epoch + i < step:
            continue  # done before the restart
        seen.setdefault(epoch, []).extend(index.tolist())
        loss = torch.nn.functional.cross_entropy(run.model(x), y)
        if rank() == args.kill_rank and step == args.kill_step and not os.path.exists(args.marker):
            Path(args.marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: this step never completes
        run.backward(loss)
        run.step()
        step += 1
        losses.append(all_reduce_mean(loss.item()))
        if args.ckpt:
            run.save(args.ckpt)

Path(args.out).mkdir(parents=True, exist_ok=True)
torch.save({"params": {k: v.detach().clone() for k, v in run.unwrap().state_dict().items()}, "seen": seen,
            "resumed_from": resumed_from, "steps": step, "losses": losses, "main": is_main_process(),
            "report": run.report.to_dict()}, Path(args.out) / f"rank{rank()}.pt")
