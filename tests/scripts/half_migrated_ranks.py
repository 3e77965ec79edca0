"""2 gloo ranks, a half-migrated loop (its own loss.backward(), optimizer.step() and zero_grad()) under a plan that
accumulates (PLAN: ddp or fsdp with grad_accumulation 2). The loop goes around the accumulation at its first step,
while the wrapper holds that backward's gradients unreduced: they must reach that step, averaged over the ranks.

Each rank also trains a plain copy of the model on the global batch (both ranks' batches, gathered), with the same
SGD with momentum. Each rank writes OUT_DIR/rankN.json: the largest difference from that copy and whether the
ranks' weights are identical.

    torchrun --nproc-per-node 2 half_migrated_ranks.py PLAN_JSON OUT_DIR"""
import copy
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.functional import cross_entropy
from torch.utils.data import DataLoader, TensorDataset

import accel

plan, out_dir = json.loads(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo")  # the script's own group: the reference's all_gather goes on after run.close()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
reference = copy.deepcopy(model)
initial = torch.cat([p.detach().flatten() for p in model.parameters()])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
plain_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
loader = DataLoader(data, batch_size=8)

run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for x, y in run.loader:
        loss = cross_entropy(run.model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        world = dist.get_world_size()
        xs, ys = [torch.zeros_like(x) for _ in range(world)], [torch.zeros_like(y) for _ in range(world)]
        dist.all_gather(xs, x)
        dist.all_gather(ys, y)
        cross_entropy(reference(torch.cat(xs)), torch.cat(ys)).backward()
        plain_optimizer.step()
        plain_optimizer.zero_grad()
idle = run.report.row("grad_accumulation").status
steps = run.steps
run.close()  # under fsdp: the trained weights gathered back into the model

weights = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weights)
plain = torch.cat([p.detach().flatten() for p in reference.parameters()])
result = {"applied": run.report.applied, "grad_accumulation": idle, "steps_seen": steps,
          "bypass_warnings": sum("bypassed" in str(w.message) for w in caught),
          "ranks_identical": all(torch.equal(gathered[0], g) for g in gathered),
          "max_difference": float((weights - plain).abs().max()), "moved": float((weights - initial).abs().max())}
(out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
dist.destroy_process_group()
