"""plan="auto" under a launcher takes the answer a single process measured on the same setup (one cache key).

    python launched_cache.py single CACHE_DIR            # in-loop auto in one process: measures, stores
    accel launch --nproc-per-node 2 launched_cache.py ranks CACHE_DIR OUT_DIR   # each rank: the cache's plan + ddp

The setup: a tiny model whose forward costs 20 ms on a virtual clock, and a test accelerator, brisk, that halves
it, so the single process's search settles on brisk for certain, whatever the machine's load.
"""
import json
import sys
import types

import torch
from virtual_clock import VirtualClock

import accel
import accel.clock
from accel.plan.contract import Accelerator, Stage, register
from accel.testing import tiny_loader, tiny_model

CLOCK = VirtualClock()
COST = types.SimpleNamespace(forward_s=0.02)


class Brisk(Accelerator):
    """Halves the model's forward on the virtual clock while a run has it (a journaled, layered setting)."""

    name = "brisk"
    stage = Stage.KERNELS

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}]

    def apply(self, ctx):
        ctx.journal.setattr(COST, "forward_s", 0.01)
        return {"forward_s": 0.01}


register(Brisk)
mode, cache = sys.argv[1], sys.argv[2]
model = tiny_model()
model.register_forward_pre_hook(lambda module, args: CLOCK.advance(COST.forward_s))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
plan = accel.Auto(cache=cache, candidates=[["brisk"]])


def epochs(run, limit):
    steps = 0
    while steps < limit:
        for x, y in run.loader:
            run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
            run.step()
            steps += 1
            if steps == limit or getattr(run, "phase", "settled") == "settled" and mode == "single":
                return


if mode == "single":
    with accel.clock.use(CLOCK):
        run = accel.accelerate(model, optimizer, tiny_loader(shuffle=False), plan, device="cpu")
        epochs(run, 5000)
    result = run.report.tuning
    print(json.dumps({"plan": result.plan.names() if result else None, "key": result.key if result else "",
                      "why": result.why if result else "not settled", "cpu": run.cache_key["cpu"]}))
    run.close()
else:
    import torch.distributed as dist

    run = accel.accelerate(model, optimizer, tiny_loader(shuffle=False), plan, device="cpu")
    epochs(run, 4)
    weights = torch.cat([p.detach().flatten() for p in run.unwrap().parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    rank = dist.get_rank()
    tuning = run.report.tuning
    with open(f"{sys.argv[3]}/rank{rank}.json", "w") as out:  # a file each: two ranks' prints interleave
        json.dump({"plan": run.plan.names(), "from_cache": tuning.from_cache, "key": tuning.key, "why": tuning.why,
                   "same": all(torch.equal(gathered[0], g) for g in gathered), "report": str(run.report),
                   "brisk": run.report.row("brisk").status}, out)
    run.close()
