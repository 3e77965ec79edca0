"""The README's Quickstart, measured: plan="auto" on a small CNN (two conv layers) over sklearn's digits, Adam, batch
64, 3 epochs (69 steps), the loop written as the Quickstart writes it, with nothing told to auto.

Runs the script twice in a fresh cache folder (as a user runs it twice): the first run's step of auto's first verdict
(the issue's goal: before step 40), its choice and why, and the second run's (the goal: at step 0, from the cache),
with each run's wall time. Real timings: run it on a quiet machine (and with one CPU-bound process beside it, for the
busy case: `python -c "while True: pass" &`).

    python benchmarks/bench_quickstart.py              # two runs in a fresh cache folder
    python benchmarks/bench_quickstart.py --runs 3 --json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
from torch.utils.data import DataLoader

import accel
from accel.testing import train_steps
from accel.workloads import TinyCNN, digits_datasets


def quickstart(epochs: int = 3) -> dict:
    """The Quickstart's loop, as written there, with plan="auto"."""
    train_set, test_set = digits_datasets(0, test_fraction=0.2)
    torch.manual_seed(0)
    model = TinyCNN()  # two conv layers, pooling, two linear ones
    optimizer = torch.optim.Adam(model.parameters())
    loader = DataLoader(train_set, batch_size=64, shuffle=True)
    started = time.perf_counter()
    run = accel.accelerate(model, optimizer, loader, plan="auto")
    train_steps(run, epochs)  # the README's loop: run.loader, run.autocast(), run.backward(loss), run.step()
    wall_s = time.perf_counter() - started
    search, tuning = run.search, run.report.tuning
    run.close()
    images, labels = test_set.tensors
    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    return {"steps": run.steps, "first_verdict_at": search.chosen_at, "chose": search.chosen,
            "phase_at_end": search.phase, "from_cache": bool(tuning and tuning.from_cache),
            "why": tuning.why if tuning else search.headline(), "wall_s": round(wall_s, 2),
            "accuracy": round(accuracy, 4), "report": str(run.report)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of the script in one fresh cache folder")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ["ACCEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="accel-quickstart-")  # a fresh clone's cache
    results = []
    for index in range(args.runs):
        result = quickstart(args.epochs)
        results.append(result)
        if not args.json:
            print(f"run {index + 1}: {result['steps']} steps in {result['wall_s']} s, accuracy {result['accuracy']}; "
                  f"auto's first verdict at step {result['first_verdict_at']}"
                  f"{' (from the cache)' if result['from_cache'] else ''}: {result['chose']}; {result['why']}",
                  flush=True)
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "report"} for r in results]))
    else:
        print(results[0]["report"])


if __name__ == "__main__":
    main()
