"""Issue 25, case 6, on real ranks: a block frozen and left out of the optimizer, then at step --at unfrozen and
added with add_param_group over the Parameter objects taken before accelerate() (the ones fsdp replaced by their
shards). Each rank trains it under fsdp and, beside it, the plain loop on the global batch (a copy made before
accelerate(), no process group), and writes <out>/rank<R>.pt: both models' weights, the late block's weights
before training and in your own Parameters after run.close(), and what the report said.

--unfreeze model: model.blocks[1].requires_grad_(True) (reaches the shards); originals: requires_grad_(True) on
the Parameter objects you hold (which fsdp keeps in step with their shards).
"""
import argparse
import copy
from pathlib import Path

import torch
from torch.nn.functional import cross_entropy
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.distributed import rank
from accel.workloads import TinyGPT

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--unfreeze", choices=("model", "originals"), default="model")
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--at", type=int, default=2)
args = parser.parse_args()

RANKS, BATCH = 2, 8  # per rank; the plain loop takes both ranks' batches at once
torch.manual_seed(0)
ids = torch.randint(0, 64, (RANKS * BATCH * args.steps, 17), generator=torch.Generator().manual_seed(1))
dataset = TensorDataset(ids[:, :-1], ids[:, 1:])


def build(model):
    late = list(model.blocks[1].parameters())  # yours, held from before accelerate()
    model.blocks[1].requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if all(p is not q for q in late)], lr=0.1,
                                momentum=0.9)
    return late, optimizer


def unfreeze(model, late, optimizer):
    if args.unfreeze == "model":
        model.blocks[1].requires_grad_(True)
    else:
        for param in late:
            param.requires_grad_(True)
    optimizer.add_param_group({"params": late})


def loss_of(model, x, y):
    return cross_entropy(model(x).flatten(0, 1), y.flatten())


model = TinyGPT()
plain = copy.deepcopy(model)
late, optimizer = build(model)
plain_late, plain_optimizer = build(plain)
before = [p.detach().clone() for p in late]

# the plain loop on the global batch: DistributedSampler without shuffle gives rank r the samples r, r+2, ...
halves = [torch.arange(r, len(dataset), RANKS) for r in range(RANKS)]
for step in range(args.steps):
    if step == args.at:
        unfreeze(plain, plain_late, plain_optimizer)
    rows = torch.cat([half[step * BATCH:(step + 1) * BATCH] for half in halves])
    loss_of(plain, *dataset[rows]).backward()
    plain_optimizer.step()
    plain_optimizer.zero_grad(set_to_none=True)

run = accel.accelerate(model, optimizer, DataLoader(dataset, batch_size=BATCH), plan=["fsdp"], device="cpu")
for step, (x, y) in enumerate(run.loader):
    if step == args.at:
        unfreeze(model, late, optimizer)
    run.backward(loss_of(run.model, x, y))
    run.step()
trained = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
report, where = run.report.to_dict(), rank()
run.close()
result = {"rank": where, "trained": trained, "plain": {k: v.detach().clone() for k, v in plain.state_dict().items()},
          "before": before, "closed": [p.detach().clone() for p in late],
          "yours_back": [p is q for p, q in zip(late, model.blocks[1].parameters())],
          "trainable": [p.requires_grad for p in late], "report": report}
Path(args.out).mkdir(parents=True, exist_ok=True)
torch.save(result, Path(args.out) / f"rank{result['rank']}.pt")
print("OK", flush=True)
