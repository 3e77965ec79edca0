"""2 gloo ranks: plan="auto" in the user's own loop under a launcher (accel/distributed/agreement.py).

Each rank trains the same model with the same loop; auto measures two candidates against the plain loop with ddp
in every arm. Each rank writes OUT_DIR/rankN.json: the plan of every step, the plan it settled on and when, the plan
in place at the end, whether the process group was ever made twice, and its final weights' checksum. With ASGD,
the memory given is where its state as estimated before the first step does not fit whole in a rank's share and
its state as it is after the steps does (one tensor a parameter, not Adam's two): fsdp at the start, ddp later.

    torchrun --nproc-per-node 2 inloop_ranks.py OUT_DIR [ASGD]"""
import json
import sys

import torch
import torch.distributed as dist

import accel
from accel.distributed.agreement import FIT, footprint
from accel.search import inloop
from accel.testing import tiny_loader, tiny_model, tiny_optimizer

inloop.CHUNK_S = 0.02  # short chunks: the search settles in seconds
inits = []
init = dist.init_process_group
dist.init_process_group = lambda *a, **k: (inits.append(1), init(*a, **k))[1]

model = tiny_model()
optimizer = tiny_optimizer(model) if sys.argv[2:] != ["ASGD"] else torch.optim.ASGD(model.parameters(), lr=0.01)
memory = None
if sys.argv[2:] == ["ASGD"]:  # between its state estimated (as Adam's: 2 a parameter) and as it is (1), over FIT
    need = footprint(model, optimizer)
    memory = int((need.total + need.parameters + 2 * need.gradients) / 2 / FIT)
loader = tiny_loader(samples=256, batch_size=8, shuffle=False)
run = accel.accelerate(model, optimizer, loader, plan=accel.Auto(
    cache=False, budget_s=6, candidates=[["channels_last"], ["fused_optimizer"]], memory_per_rank=memory))
world = dist.group.WORLD if dist.is_initialized() else None
plans, settled_at = [], None
for epoch in range(40):
    for x, y in run.loader:
        run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
        run.step()
        plans.append(run.plan.names())
        if settled_at is None and run.report.tuning is not None:
            settled_at = run.steps
    if settled_at is not None and run.steps >= settled_at + 20:
        break
rank = dist.get_rank()
weights = torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten()  # fsdp's: whole
                     for p in model.parameters()])
gathered = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weights)
tuning = run.report.tuning
out = {"plans": plans, "settled_at": settled_at, "steps": run.steps, "same_world": dist.group.WORLD is world,
       "group_inits": len(inits), "chosen": tuning.plan.names() if tuning else None,
       "why": tuning.why if tuning else None, "rows": [[r.name, r.status] for r in tuning.rows] if tuning else None,
       "weights_identical": all(torch.equal(g, gathered[0]) for g in gathered),
       "weights_sum": float(weights.double().sum()), "in_place": run.plan.names()}
run.close()
out["initialized_after_close"] = dist.is_initialized()
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump(out, f)
