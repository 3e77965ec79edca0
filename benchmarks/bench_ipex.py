"""IPEX against eager, side by side in one process (run it in the torch 2.8 + IPEX environment).

resnet18 training step (SGD, batch 16): eager, ipex fp32, amp bf16 alone, ipex + amp bf16. The plans are
measured in turn, several rounds, so drift hits all alike; prints median ms/step and the ratio to eager.

    .nox/ipex/bin/python benchmarks/bench_ipex.py [--image-size 112] [--rounds 3] [--steps 3] [--with-stack]

--with-stack adds accel's best stack without IPEX (channels_last + fused_optimizer + amp bf16): what ipex + amp must
beat to earn its place (ipex and fused_optimizer both declare the optimizer update, so they never stack).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
import torchvision
from torch.utils.data import DataLoader, TensorDataset

import accel

PLANS = {"eager": [], "ipex fp32": ["ipex"], "amp bf16": {"amp": {"dtype": "bf16"}},
         "ipex + amp bf16": {"ipex": {}, "amp": {"dtype": "bf16"}}}


def steps(run, x, y, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        with run.autocast():
            loss = torch.nn.functional.cross_entropy(run.model(x), y)
        run.backward(loss)
        run.step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--with-stack", action="store_true", help="also channels_last + fused_optimizer + amp bf16")
    args = parser.parse_args()
    plans = {**PLANS, **({"cl+fused+amp bf16": ["channels_last", "fused_optimizer", {"amp": {"dtype": "bf16"}}]}
                         if args.with_stack else {})}
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    x, y = torch.randn(16, 3, args.image_size, args.image_size), torch.randint(0, 10, (16,))
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    base = torchvision.models.resnet18(num_classes=10)
    runs = {}
    for name, plan in plans.items():
        model = copy.deepcopy(base)
        runs[name] = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), loader,
                                      plan, device="cpu")
        steps(runs[name], x, y, 2)  # warm-up
    times = {name: [] for name in runs}
    for round_ in range(args.rounds):  # the order reversed every other round, so drift weighs on all alike
        for name, run in (list(runs.items()) if round_ % 2 == 0 else list(runs.items())[::-1]):
            times[name] += steps(run, x, y, args.steps)
    eager = statistics.median(times["eager"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, resnet18, batch 16, "
          f"3x{args.image_size}x{args.image_size}, SGD; {args.rounds} alternating rounds x {args.steps} steps")
    print(f"{'plan':18} {'ms/step':>8} {'vs eager':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:18} {median * 1000:8.0f} {median / eager:9.2f}")


if __name__ == "__main__":
    main()
