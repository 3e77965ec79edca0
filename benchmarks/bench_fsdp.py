"""fsdp against ddp at 2 ranks: per-rank memory of parameters, gradients and optimizer state, and step time.

The model is GPT-2 small's shape (accel.workloads.TinyGPT with 12 layers, width 768, vocabulary
50257, 124M parameters, random weights) with AdamW; each rank trains on its own batch of random tokens.

Memory is measured on the tensors each rank holds after a step: the bytes of every distinct storage behind the
parameters, their gradients and the optimizer's state on this rank (a DTensor counts its local shard), summed;
not computed from the parameter count. DDP's gradient buckets (another copy of the gradients unless
gradient_as_bucket_view) are not counted, so ddp's side is, if anything, under-stated. (The process's peak
resident set cannot tell two plans apart in one process: it never falls.)

Step time: the script joins the process group itself, so both plans run in the same ranks, alternated
(ddp, fsdp, ddp, fsdp, ...): each round builds the plan's run on a fresh model, times --steps steps after one
warm-up step, and closes it. Reported per plan: the median step and the spread (min-max) over rounds, and the
ratio fsdp/ddp of each round.

    torchrun --nproc-per-node 2 benchmarks/bench_fsdp.py                 # GPT-2 small, 3 rounds (minutes on CPU)
    torchrun --nproc-per-node 2 benchmarks/bench_fsdp.py --quick         # a 4-layer, width-256 GPT, 2 rounds
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch
import torch.distributed as dist

import accel
from accel.workloads import TinyGPT


def held_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of the distinct storages this rank holds for parameters, gradients and optimizer state."""
    seen: set[int] = set()

    def size(tensor) -> int:
        if tensor is None or not isinstance(tensor, torch.Tensor):
            return 0
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()

    params = list(model.parameters())
    return {"parameters": sum(size(p.data if not hasattr(p, "to_local") else p) for p in params),
            "gradients": sum(size(p.grad) for p in params),
            "optimizer": sum(size(v) for state in optimizer.state.values() for v in state.values())}


def build(args):
    torch.manual_seed(0)
    model = TinyGPT(vocab=50257, width=768, layers=12, heads=12, context=1024) if not args.quick else \
        TinyGPT(vocab=50257, width=256, layers=4, heads=4, context=args.length)  # GPT-2 small's shape, or a quick one
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def one_round(plan: str, args) -> dict:
    model, optimizer = build(args)
    run = accel.accelerate(model, optimizer, None, plan=[plan], device="cpu")
    ids = torch.randint(0, 50257, (args.batch_size, args.length + 1),
                        generator=torch.Generator().manual_seed(dist.get_rank()))

    def step():
        logits = run.model(ids[:, :-1])
        run.backward(torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()))
        run.optimizer.step()  # the update without zero_grad, so the gradients are still there to be measured

    step()
    memory = held_bytes(run.unwrap(), optimizer)
    optimizer.zero_grad(set_to_none=True)
    times = []
    for _ in range(args.steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    run.close()
    step = run = model = optimizer = None  # the round's model and optimizer freed before the next round builds its own
    gc.collect()
    return {"memory": memory, "step_s": statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--json")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    dist.init_process_group("gloo")  # the script's own group: accel keeps it, so the plans alternate in it
    results: dict[str, list[dict]] = {"ddp": [], "fsdp": []}
    for _ in range(rounds):
        for plan in ("ddp", "fsdp"):
            results[plan].append(one_round(plan, args))
    if dist.get_rank() == 0:
        mib = 1024 * 1024
        summary = {}
        for plan, runs in results.items():
            memory = runs[0]["memory"]
            steps = [r["step_s"] for r in runs]
            summary[plan] = {"memory_mib": {k: round(v / mib, 1) for k, v in memory.items()},
                             "total_mib": round(sum(memory.values()) / mib, 1),
                             "step_s_median": round(statistics.median(steps), 3),
                             "step_s_spread": [round(min(steps), 3), round(max(steps), 3)]}
        ratios = [f["step_s"] / d["step_s"] for d, f in zip(results["ddp"], results["fsdp"])]
        summary["fsdp/ddp memory"] = round(summary["fsdp"]["total_mib"] / summary["ddp"]["total_mib"], 3)
        summary["fsdp/ddp step, per round"] = [round(r, 2) for r in ratios]
        summary["model"] = "gpt2-small shape (124M)" if not args.quick else "4 x 256 GPT"
        summary["world"] = dist.get_world_size()
        print(json.dumps(summary, indent=1))
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(summary, handle, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
