"""2 gloo ranks with plan="auto": ddp or fsdp joins the plan by whether the training state fits the memory given
per rank ("fits": 4x the state; "shards": 1.2x, so only half of it fits); both ranks train and agree. No candidate
is given, so the search in the loop settles at once on the distribution alone (tests/test_ranks.py runs one that
measures).

    torchrun --nproc-per-node 2 auto_ranks.py fits|shards OUT_DIR"""
import json
import sys

import torch

import accel
from accel.distributed.agreement import footprint
from accel.distributed.group import _gloo_states
from accel.testing import tiny_loader, tiny_model

model = tiny_model()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
need = footprint(model, optimizer).total
memory = int({"fits": 4.0, "shards": 1.2}[sys.argv[1]] * need)
run = accel.accelerate(model, optimizer, tiny_loader(shuffle=False), accel.Auto(cache=False, memory_per_rank=memory,
                                                                                candidates=[]),
                       device="cpu")
for x, y in run.loader:
    run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
    run.step()
weights = torch.cat([p.detach().full_tensor().flatten() if hasattr(p, "full_tensor") else p.detach().flatten()
                     for p in run.unwrap().parameters()])
gathered = [torch.zeros_like(weights) for _ in range(torch.distributed.get_world_size())]
torch.distributed.all_gather(gathered, weights)
rank = torch.distributed.get_rank()
said = {"rank": rank, "plan": run.plan.names(), "why": run.report.tuning.why,
        "same": all(torch.equal(gathered[0], g) for g in gathered), "steps": run.steps, "report": str(run.report)}
run.close()
said["gloo_threads"] = _gloo_states()  # the group accel started ended with close, nothing of it left to a fork
with open(f"{sys.argv[2]}/rank{rank}.json", "w") as out:  # a file each: two ranks' prints interleave
    json.dump(said, out)
