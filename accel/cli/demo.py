"""accel demo: torchvision's resnet18 on sklearn's real digits, a plain loop against plan="auto", side by side.

The same model, data, seed and epochs both ways: the plain loop (the empty plan), then accel choosing its plan by
measuring on this model (or the plan given with --plan) and training with it. It prints the report with the
search's comparisons, the time and test accuracy of both, and writes a chart when matplotlib is installed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch.utils.data import DataLoader

import accel
from accel.cli import parse_plan_argument, positive
from accel.hardware import importable
from accel.workloads import accuracy, cifar_shaped, digits_datasets


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("demo", help="resnet18 on real digits: the plain loop against plan='auto'")
    parser.add_argument("--plan", default="auto",
                        help="'auto' (default), comma-separated accelerator names, or a .toml/.yaml plan file")
    parser.add_argument("--model", default="resnet18", help="a torchvision model name (default resnet18)")
    parser.add_argument("--epochs", type=positive, default=5)
    parser.add_argument("--batch-size", type=positive, default=64)
    parser.add_argument("--image-size", type=positive, default=64, help="digits upsampled to this size (default 64)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds plan='auto' may measure in the loop (default: at most 30%% of the plain run's time)")
    parser.add_argument("--plot", default="accel-demo.png",
                        help="chart of the comparison (default accel-demo.png, when matplotlib is installed)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def batches_per_epoch(batch_size: int, seed: int = 0) -> int:
    """Batches in one epoch of the demo's loader: the digits' training split in full batches (drop_last)."""
    return len(digits_datasets(seed)[0]) // batch_size


def next_run(tuning) -> str:
    """What a second run of the demo will do, as the cache says: only an established, complete answer is kept."""
    if tuning is None:
        return "nothing was chosen, so a second run measures again"
    if tuning.from_cache:
        return f"the plan came from the cache, key {tuning.key[:12]}"
    if tuning.key:
        return f"cached under key {tuning.key[:12]}: a second run takes the plan from the cache at its first batch"
    return "not cached (the search was cut short or too noisy to be sure), so a second run measures again"


def train(model_name: str, plan, epochs: int, batch_size: int, image_size: int, seed: int = 0) -> dict:
    """Train with the plan and return seconds (training only), ms per step, test accuracy and the report."""
    import torchvision  # 1.3 s to import: paid by `accel demo`, not by every `accel` command

    train_set, test_set = (cifar_shaped(d, image_size) for d in digits_datasets(seed))
    torch.manual_seed(seed)
    model = torchvision.models.get_model(model_name, weights=None, num_classes=10)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed))
    started = time.perf_counter()
    run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
    setup_s = time.perf_counter() - started
    started = time.perf_counter()
    run.model.train()
    for _ in range(epochs):
        for x, y in run.loader:
            with run.autocast():
                loss = torch.nn.functional.cross_entropy(run.model(x), y)
            run.backward(loss)
            run.step()
    seconds = time.perf_counter() - started
    result = {"seconds": seconds, "setup_s": setup_s, "steps": run.steps,
              "accuracy": accuracy(run.model, test_set, run.autocast), "report": run.report,
              "measured_s": getattr(run, "measured_s", None), "settled_at": getattr(run, "settled_at", None)}
    run.close()
    return result


def plot(path: str, plain: dict, accelerated: dict) -> None:
    import matplotlib  # optional (pip install 'accel[demo]'): the chart is drawn only where it is installed

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tuning = accelerated["report"].tuning
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["plain", "accelerated"]
    left.bar(names, [plain["seconds"], accelerated["seconds"]], color=["grey", "tab:green"])
    for i, result in enumerate((plain, accelerated)):
        left.text(i, result["seconds"], f"{result['seconds']:.1f} s\nacc {result['accuracy']:.3f}", ha="center",
                  va="bottom", fontsize=8)
    left.set_ylabel("training time, s")
    left.set_title(f"speed-up {plain['seconds'] / accelerated['seconds']:.2f}x")
    if tuning is not None:
        rows = [r for r in tuning.rows if r.vs_baseline is not None]
        right.barh([r.name for r in rows], [r.vs_baseline for r in rows], color="tab:blue")
        right.axvline(1.0, color="grey", linestyle="--")
        right.set_xlabel("step time vs eager (measured by plan='auto')")
        right.invert_yaxis()
    else:
        right.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> int:
    if not importable("sklearn"):
        print("accel demo trains on scikit-learn's bundled digits: pip install 'accel[demo]'", file=sys.stderr)
        return 2
    plan = parse_plan_argument(args.plan)
    per_epoch = batches_per_epoch(args.batch_size)
    expected = args.epochs * per_epoch
    if plan == "auto":  # the run's length: compile (or another costly accelerator) must pay back within it
        plan = accel.Auto(budget_s=args.budget, expected_steps=expected or None)
    else:
        accel.Plan(plan)  # a bad plan is refused before any training (main() prints the PlanError)
    import torchvision  # slow to import (see train)

    if args.model not in torchvision.models.list_models(module=torchvision.models):
        print(f"accel demo: {args.model!r} is not a torchvision model", file=sys.stderr)
        return 2
    plain = train(args.model, [], args.epochs, args.batch_size, args.image_size)
    accelerated = train(args.model, plan, args.epochs, args.batch_size, args.image_size)
    speedup = plain["seconds"] / accelerated["seconds"]
    told = getattr(plan, "expected_steps", None)  # the run's length, as the demo told plan="auto"
    tuning = accelerated["report"].tuning
    if tuning is not None and "expected_steps" in (tuning.settings or {}):
        told = tuning.settings["expected_steps"]  # as the search records it was told, once it settled
    if args.json:
        print(json.dumps({"plain": {**plain, "report": plain["report"].to_dict()},
                          "accelerated": {**accelerated, "report": accelerated["report"].to_dict()},
                          "speedup": speedup, "expected_steps": told}, default=str))
        return 0
    print(accelerated["report"])
    print()
    print(f"{args.model} on sklearn digits at {args.image_size}x{args.image_size}, batch {args.batch_size}, "
          f"{args.epochs} epochs ({plain['steps']} steps)")
    print(f"{'':12} {'train s':>8} {'ms/step':>8} {'test acc':>9}")
    for name, result in (("plain", plain), ("accelerated", accelerated)):
        print(f"{name:12} {result['seconds']:8.2f} {1000 * result['seconds'] / result['steps']:8.1f} "
              f"{result['accuracy']:9.3f}")
    if accelerated.get("measured_s") is not None:  # plan="auto" measured in the loop: its time is in the total
        how = (f"auto measured in the loop for {accelerated['measured_s']:.1f} s, settled at step "
               f"{accelerated['settled_at']} of {accelerated['steps']}, every one a training step counted above"
               if accelerated["settled_at"] is not None else "auto was still measuring when the training ended")
    else:
        how = f"choosing the plan took {accelerated['setup_s']:.1f} s before training"
    if told is not None:
        epochs = f"{args.epochs} epoch{'s' if args.epochs != 1 else ''}"
        print(f"plan='auto' was told the run's length: expected_steps={told} ({epochs} x {per_epoch} batches), so "
              "a costly accelerator (compile) is kept only if its warm-up pays back within them")
    searched = isinstance(plan, accel.Auto)  # a plan given searches nothing, so nothing is cached for a next run
    print(f"speed-up: {speedup:.2f}x at accuracy {accelerated['accuracy']:.3f} vs {plain['accuracy']:.3f}; {how}"
          + (f" ({next_run(tuning)})" if searched else ""))
    if not args.no_plot and importable("matplotlib"):
        plot(args.plot, plain, accelerated)
        print(f"chart: {args.plot}")
    return 0
