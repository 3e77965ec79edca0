"""accel demo: train a small CNN on sklearn's real digits, plain and through accelerate(), side by side."""
from __future__ import annotations

import argparse
import json
import sys
import time

DEFAULT_PLAN = "threads,loader,channels_last,amp"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("demo", help="train on real digits, plain loop vs accelerated, and print the report")
    parser.add_argument("--plan", default=DEFAULT_PLAN,
                        help=f"comma-separated accelerator names or a .toml/.yaml plan file (default: {DEFAULT_PLAN})")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def parse_plan_argument(text: str):
    return text if text.endswith((".toml", ".yaml", ".yml")) else [n.strip() for n in text.split(",") if n.strip()]


def train(plan, epochs: int, batch_size: int, seed: int = 0) -> dict:
    import torch
    from torch.utils.data import DataLoader

    import accel
    from accel.testing import TinyCNN, accuracy, digits_datasets, train_steps

    train_set, test_set = digits_datasets(seed)
    torch.manual_seed(seed)
    model = TinyCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    loader = DataLoader(train_set, batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
    started = time.perf_counter()
    train_steps(run, epochs)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "accuracy": accuracy(run.model, test_set, run.autocast), "report": run.report}


def run(args) -> int:
    plan = parse_plan_argument(args.plan)
    from accel.hardware import importable

    if not importable("sklearn"):
        print("accel demo trains on scikit-learn's bundled digits: pip install 'accel[demo]'", file=sys.stderr)
        return 2
    import accel
    from accel.testing import process_state_restored

    with process_state_restored():
        plain = train([], args.epochs, args.batch_size)
    accelerated = train(plan, args.epochs, args.batch_size)
    if args.json:
        print(json.dumps({"plain": {**plain, "report": plain["report"].to_dict()},
                          "accelerated": {**accelerated, "report": accelerated["report"].to_dict()}}, default=str))
        return 0
    print(accelerated["report"])
    print()
    print(f"{'':12} {'train s':>8} {'test acc':>9}")
    for name, result in (("plain", plain), ("accelerated", accelerated)):
        print(f"{name:12} {result['seconds']:8.2f} {result['accuracy']:9.3f}")
    print(f"speed-up: {plain['seconds'] / accelerated['seconds']:.2f}x (accel {accel.__version__})")
    return 0
