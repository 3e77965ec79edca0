"""Step time of a pruned model against the unpruned one, measured alternately in one process.

The book's CNN (chapter 6) on 3x32x32 inputs, and optionally a torchvision model, pruned with L1 at the given
conv sparsity through accel's `prune` accelerator. Reports parameters, FLOPs
of a training step, median ms/step and the ratio pruned/unpruned.

    python benchmarks/bench_prune.py [--models book_cnn,resnet18] [--sparsity 0.5] [--rounds 5] [--steps 5]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

import accel
from accel.workloads import BookCNN


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "book_cnn":
        return BookCNN()
    import torchvision

    return getattr(torchvision.models, name)(num_classes=10)


def steps(model, optimizer, batch, n: int) -> float:
    """Median seconds of n training steps on one batch."""
    x, y = batch
    times = []
    for _ in range(n):
        start = time.perf_counter()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_gflop(model, batch) -> float:
    """FLOPs of one forward + backward (torch.utils.flop_counter): a load-independent companion to the times."""
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="book_cnn")
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size}, "
          f"{args.image_size}x{args.image_size}, L1 at {args.sparsity} conv sparsity")
    print("| model | parameters | pruned parameters | GFLOP/step | pruned GFLOP/step | ms/step | pruned ms/step "
          "| pruned/unpruned |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
        y = torch.randint(0, 10, (args.batch_size,))
        loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size)
        model = make_model(name)
        base = (model, torch.optim.Adam(model.parameters(), lr=1e-3))
        config = [{"op_types": ["Conv2d"], "sparse_ratio": args.sparsity}]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = accel.accelerate(copy.deepcopy(model), None, loader, {"prune": {"config_list": config}},
                                   device="cpu")
        pruned = (run.model, torch.optim.Adam(run.model.parameters(), lr=1e-3))
        times = {"unpruned": [], "pruned": []}
        for side, (m, o) in (("unpruned", base), ("pruned", pruned)):
            steps(m, o, (x, y), 2)  # warm-up
        for _ in range(args.rounds):  # alternate, so drift hits both sides alike
            for side, (m, o) in (("unpruned", base), ("pruned", pruned)):
                times[side].append(steps(m, o, (x, y), args.steps))
        a, b = (statistics.median(times[k]) * 1000 for k in ("unpruned", "pruned"))
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        flops = [step_gflop(m, (x, y)) for m in (model, run.model)]
        print(f"| {name} | {count(model):,} | {count(run.model):,} | {flops[0]:.2f} | {flops[1]:.2f} | {a:.1f} | "
              f"{b:.1f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
