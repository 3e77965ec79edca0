"""2 gloo ranks: what in-loop auto needs under a launcher (accel/distributed/agreement.py).

While a GroupHold holds the group: a ddp run trains and closes, and a ddp + grad_clipping run trains on the same
group (never destroyed in between); the ranks, given different local times, agree on the slowest and on rank 0's
decisions. After the release the group is gone (accel made it). Each rank writes OUT_DIR/rankN.json.

    torchrun --nproc-per-node 2 rank_agreement.py OUT_DIR"""
import json
import sys

import torch
import torch.distributed as dist

import accel
from accel.distributed.agreement import ChunkTimes, GroupHold, RankAgreement, RanksDiverged
from accel.testing import tiny_loader, tiny_model

out = {}
model = tiny_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader = tiny_loader(shuffle=False)


def train(run, steps):
    done = 0
    for x, y in run.loader:
        run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
        run.step()
        done += 1
        if done == steps:
            return


def flat_weights():
    return torch.cat([p.detach().flatten() for p in model.parameters()])


out["initialized_before"] = dist.is_initialized()
hold = GroupHold().acquire()
world, inits = dist.group.WORLD, []
original_init = dist.init_process_group
dist.init_process_group = lambda *a, **k: (inits.append(1), original_init(*a, **k))[1]  # counts re-creations

first = accel.accelerate(model, optimizer, loader, plan=["ddp"], device="cpu")
train(first, 3)
after_first = flat_weights().clone()
first.close()
out["between"] = {"initialized": dist.is_initialized(), "same_world": dist.group.WORLD is world}
second = accel.accelerate(model, optimizer, loader, plan={"ddp": {}, "grad_clipping": {"max_norm": 1.0}},
                          device="cpu")
out["second_plan"] = second.plan.names()
train(second, 3)
weights = flat_weights()
gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weights)
out["weights_identical"] = all(torch.equal(gathered[0], g) for g in gathered)
out["trained_on"] = not torch.equal(after_first, weights)
second.close()
out["after_second"] = {"initialized": dist.is_initialized(), "same_world": dist.group.WORLD is world}
out["group_inits_while_held"] = len(inits)

rank = dist.get_rank()
agreement = RankAgreement.current()
agreed = agreement.chunk(ChunkTimes(seconds=1.0 + rank, step_s=(0.1 * (rank + 1), 0.5 - 0.1 * rank),
                                    nonfinite=rank == 1))
out["agreed"] = {"seconds": agreed.seconds, "step_s": list(agreed.step_s), "nonfinite": agreed.nonfinite}
out["decision"] = agreement.decide({"next_plan": {"amp": {}}, "verdict": "faster"} if rank == 0
                                   else {"next_plan": {}, "verdict": "slower"})
out["past_deadline"] = agreement.past(deadline=5.0, now=10.0 if rank == 0 else 0.0)  # rank 0's clock decides
out["any_nonfinite"] = agreement.any_true(rank == 0)
out["slowest"] = agreement.slowest(0.25 * (rank + 1))
try:
    agreement.chunk(ChunkTimes(seconds=1.0, step_s=(0.1,) * (rank + 1)))
    out["diverged"] = "not seen"
except RanksDiverged as error:
    out["diverged"] = str(error)

hold.release()
out["after_release"] = {"initialized": dist.is_initialized()}
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as file:  # a file each: two ranks' prints interleave
    json.dump(out, file)
