"""Optimizer step time: for-loop vs foreach (torch's default) vs fused, on a torchvision model's parameters.

Gradients are filled once; each variant then steps alternately in one process, so drift hits all alike.
Reports median ms per optimizer.step() and the ratio foreach/fused.

    python benchmarks/bench_fused_optimizer.py [--model resnet18] [--optimizers Adam,AdamW,SGD,Adagrad]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchvision

from accel.optim import rebuild_optimizer

MAKE = {
    "Adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-3),
    "SGD": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
}


def median_step_ms(optimizer, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--optimizers", default="Adam,AdamW,SGD,Adagrad")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    model = getattr(torchvision.models, args.model)()
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    count = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.model} ({count:,} parameters)")
    print("| optimizer | for-loop ms | foreach ms | fused ms | foreach/fused |")
    print("|---|---|---|---|---|")
    for name in args.optimizers.split(","):
        base = MAKE[name](model.parameters())
        variants = {"for-loop": rebuild_optimizer(base, foreach=False),
                    "foreach": rebuild_optimizer(base, foreach=True), "fused": rebuild_optimizer(base, fused=True)}
        times = {k: [] for k in variants}
        for optimizer in variants.values():
            optimizer.step()  # creates the state
        for _ in range(args.rounds):
            for key, optimizer in variants.items():
                times[key].append(median_step_ms(optimizer, args.steps))
        ms = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {name} | {ms['for-loop']:.1f} | {ms['foreach']:.1f} | {ms['fused']:.1f} | "
              f"{ms['foreach'] / ms['fused']:.2f} |")


if __name__ == "__main__":
    main()
