"""Train a small GPT-style model or a CNN with BatchNorm through accel under fsdp (or as the single-process reference).

Each rank writes <out>/rank<R>.pt: the full (gathered) parameters, the global mean loss per step, the step it
resumed from, its report, and whether run.close() gave the user's own parameters back with the trained values.

--reference: one process, no launcher, no plan: each step runs the halves the 2 ranks would see (their
DistributedSampler shards) one after the other, each loss halved: the same gradients as 2 ranks averaging, with
BatchNorm seeing each rank's half. --ckpt/--save-every: run.save every N steps; --resume: run.load first.
--kill-rank/--kill-step: that rank SIGKILLs itself once, mid-step (a marker file remembers it).
"""
import argparse
import json
import os
import signal
from pathlib import Path

import torch
from torch.nn.functional import cross_entropy
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import accel
from accel.distributed import all_reduce_mean, rank
from accel.workloads import NormCNN, TinyGPT, digits_datasets

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--model", choices=("gpt", "cnn"), default="gpt")
parser.add_argument("--plan", default='{"fsdp": {}}')
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=8, help="per rank")
parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step in the reference")
parser.add_argument("--clip", type=float, default=None, help="max_norm in the reference")
parser.add_argument("--reference", action="store_true")
parser.add_argument("--ranks", type=int, default=2, help="ranks the reference stands for")
parser.add_argument("--ckpt")
parser.add_argument("--save-every", type=int, default=0)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--kill-rank", type=int)
parser.add_argument("--kill-step", type=int)
parser.add_argument("--marker")
parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
args = parser.parse_args()

torch.manual_seed(0)
if args.model == "gpt":
    model = TinyGPT()
    ids = torch.randint(0, 64, (256, 17), generator=torch.Generator().manual_seed(1))
    dataset = TensorDataset(ids[:, :-1], ids[:, 1:])
else:
    model = NormCNN()
    images, labels = digits_datasets(seed=0)[0].tensors
    dataset = TensorDataset(images[:256], labels[:256])
optimizer = (torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=0.01) if args.optimizer == "adamw" else
             torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))  # built on your optimizer
originals = dict(model.named_parameters())


def loss_of(output, target):
    return (cross_entropy(output.flatten(0, -2), target.flatten()) if args.model == "gpt"
            else cross_entropy(output, target))


def reference() -> dict:
    """One process; each step the ranks' shards in turn, as micro-batches of the global batch."""
    loaders = [DataLoader(dataset, batch_size=args.batch_size, sampler=DistributedSampler(
        dataset, num_replicas=args.ranks, rank=r, shuffle=True, seed=7)) for r in range(args.ranks)]
    losses, step, epoch = [], 0, 0
    micro = [0]
    while step < args.steps:
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
        for batches in zip(*loaders):
            total = 0.0
            for x, y in batches:
                loss = loss_of(model(x), y)
                (loss / (args.ranks * args.accumulate)).backward()
                total += loss.item() / args.ranks
            micro[0] += 1
            losses.append(total)
            if micro[0] % args.accumulate == 0:
                if args.clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
            step += 1
            if step == args.steps:
                break
        epoch += 1
    return {"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses,
            "steps": step, "resumed_from": 0, "rank": 0}


def accelerated() -> dict:
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(7))
    run = accel.accelerate(model, optimizer, loader, plan=json.loads(args.plan), device="cpu")
    step = resumed_from = 0
    if args.resume and args.ckpt and Path(args.ckpt).exists():
        resumed_from = step = run.load(args.ckpt)["step"]
        scheduler.last_epoch = run.optimizer_steps  # your scheduler is yours to resume: its lr is in the optimizer
    losses, per_epoch = [], len(run.loader)
    while step < args.steps:
        epoch = step // per_epoch
        run.loader.epoch = epoch  # the sampler's order of this epoch, also after a restart
        for i, (x, y) in enumerate(run.loader):
            if epoch * per_epoch + i < step:
                continue  # done before the restart
            with run.autocast():
                loss = loss_of(run.model(x), y)
            if rank() == args.kill_rank and step == args.kill_step and not os.path.exists(args.marker):
                Path(args.marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)  # mid-step: this step never completes
            run.backward(loss)
            if not run.step():
                scheduler.step()
            step += 1
            losses.append(all_reduce_mean(loss.item()))
            if args.ckpt and args.save_every and step % args.save_every == 0:
                run.save(args.ckpt)
            if step == args.steps:
                break
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in run.unwrap().state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    whole = get_optimizer_state_dict(run.unwrap(), optimizer, options=StateDictOptions(full_state_dict=True))
    report, where = run.report.to_dict(), rank()
    lr = optimizer.param_groups[0]["lr"]
    run.close()
    mine = dict(model.named_parameters())
    closed = all(mine[n] is p for n, p in originals.items()) and all(
        torch.equal(mine[n].detach(), full[n]) for n in mine)
    return {"rank": where, "params": full, "losses": losses, "steps": step, "resumed_from": resumed_from,
            "report": report,
            "optimizer": whole["state"], "closed_ok": closed, "lr": lr, "optimizer_holds_originals": all(
                p is originals[n] for n, p in zip(originals, optimizer.param_groups[0]["params"]))}


result = reference() if args.reference else accelerated()
Path(args.out).mkdir(parents=True, exist_ok=True)
torch.save(result, Path(args.out) / f"rank{result['rank']}.pt")
print("OK", flush=True)
