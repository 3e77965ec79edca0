"""What accel itself costs: a hand-written loop vs the same loop through accelerate(), side by side.

Two pairs, measured alternately in one process so drift hits both sides alike:
  1. plain loop            vs  accelerate(plan=[])                    (the wrapper's own cost)
  2. channels_last by hand vs  accelerate(plan=["channels_last"])     (the same optimization, by plan)
Reports median ms/step of each and the ratio accel/hand, with the spread of the per-round ratios. At
hundreds of ms a step, that spread (a few %) hides a cost of microseconds, so the script also measures the
wrapper directly: the same loop over a trivial model (steps of microseconds) with and without accel, which
gives accel's own cost per step; divided by the real model's step time it is the overhead. Goal: under 1%.
Last, what watching the loop costs (accel/run/watch.py: the counters, the optimizer hook, the loader's callback):
two do-nothing accelerators with the same hooks, one relying on run.backward/run.step/one batch per step (so the
run watches) and one not, alternated on the trivial model's loop.

    python benchmarks/bench_overhead.py [--model resnet18] [--image-size 112] [--rounds 5] [--steps 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchvision
from torch.utils.data import DataLoader, TensorDataset

import accel


def make(model_name: str, image_size: int, batches: int, batch_size: int = 16):
    torch.manual_seed(0)
    model = getattr(torchvision.models, model_name)(num_classes=10)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(batches * batch_size, 3, image_size, image_size),
                         torch.randint(0, 10, (batches * batch_size,)))
    return model, optimizer, DataLoader(data, batch_size=batch_size)


def hand_loop(model, optimizer, loader, channels_last: bool) -> list[float]:
    if channels_last:
        model.to(memory_format=torch.channels_last)
    times = []
    batches = iter(loader)
    while True:
        start = time.perf_counter()  # fetching the batch is timed on both sides
        try:
            x, y = next(batches)
        except StopIteration:
            return times
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)


def accel_loop(model, optimizer, loader, plan) -> list[float]:
    run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
    times = []
    batches = iter(run.loader)
    while True:
        start = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            return times
        with run.autocast():
            loss = torch.nn.functional.cross_entropy(run.model(x), y)
        run.backward(loss)
        run.step()
        times.append(time.perf_counter() - start)


def wrapper_cost_us(iterations: int = 3000, plan=("channels_last",)) -> tuple[float, float]:
    """Per-step time of the plain loop and of the accel loop on a trivial model, in microseconds."""
    data = TensorDataset(torch.randn(iterations, 1, 2, 2), torch.zeros(iterations, dtype=torch.long))

    def trivial():
        torch.manual_seed(0)
        model = torch.nn.Conv2d(1, 1, 1)
        return model, torch.optim.SGD(model.parameters(), lr=0.0)

    model, optimizer = trivial()
    loader = DataLoader(data, batch_size=1)
    start = time.perf_counter()
    for x, y in loader:
        x = x.contiguous(memory_format=torch.channels_last)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    plain = (time.perf_counter() - start) / iterations * 1e6
    model, optimizer = trivial()
    run = accel.accelerate(model, optimizer, DataLoader(data, batch_size=1), plan=list(plan), device="cpu")
    start = time.perf_counter()
    for x, y in run.loader:
        with run.autocast():
            pass
        run.step()
    return plain, (time.perf_counter() - start) / iterations * 1e6


class Unwatched(accel.Accelerator):
    """Passes the step through; relies on no call of the run, so nothing is watched."""

    name, stage = "bench_unwatched", accel.Stage.STEP

    def step(self, run, state, optimizer, proceed):
        return proceed(optimizer)


class Watched(Unwatched):
    """The same, relying on every call the run watches: the run counts them and hooks the optimizer."""

    name = "bench_watched"

    def apply(self, ctx):
        return accel.State(relies_on={"backward": "nothing", "step": "nothing", "batch": "nothing"})


def watch_cost_us(rounds: int = 7, iterations: int = 2000) -> tuple[float, float, float]:
    """Per-step cost of watching: (median, lowest, highest) over alternating rounds of the trivial loop, in us."""
    for kind in (Unwatched, Watched):
        accel.register(kind)
    data = TensorDataset(torch.randn(iterations, 1, 2, 2), torch.zeros(iterations, dtype=torch.long))
    times: dict[str, list[float]] = {"bench_unwatched": [], "bench_watched": []}
    for round_ in range(rounds):
        for name in (("bench_unwatched", "bench_watched") if round_ % 2 == 0 else ("bench_watched", "bench_unwatched")):
            torch.manual_seed(0)
            model = torch.nn.Conv2d(1, 1, 1)
            run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.0), DataLoader(data, batch_size=1),
                                   plan=[name], device="cpu")
            start = time.perf_counter()
            for x, y in run.loader:
                run.backward(model.bias.sum())
                run.step()
            times[name].append((time.perf_counter() - start) / iterations * 1e6)
            run.close()
    for kind in (Unwatched, Watched):
        accel.unregister(kind.name)
    added = [w - u for w, u in zip(times["bench_watched"], times["bench_unwatched"])]
    return statistics.median(added), min(added), max(added)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="measured steps per round (after one warm-up step)")
    args = parser.parse_args()
    costs = [wrapper_cost_us() for _ in range(3)]
    plain_us = statistics.median(c[0] for c in costs)
    accel_us = statistics.median(c[1] for c in costs)
    pairs = {"empty plan": (False, []), "channels_last": (True, ["channels_last"])}
    results = {name: {"hand": [], "accel": [], "ratios": []} for name in pairs}
    for round_ in range(args.rounds):
        for name, (by_hand, plan) in pairs.items():
            order = ("hand", "accel") if round_ % 2 == 0 else ("accel", "hand")
            for side in order:
                model, optimizer, loader = make(args.model, args.image_size, args.steps + 1)
                times = (hand_loop(model, optimizer, loader, by_hand) if side == "hand"
                         else accel_loop(model, optimizer, loader, plan))
                results[name][side] += times[1:]  # drop the warm-up step
            results[name]["ratios"].append(statistics.median(results[name]["accel"][-args.steps:])
                                           / statistics.median(results[name]["hand"][-args.steps:]))
    print(f"{args.model}, batch 16, 3x{args.image_size}x{args.image_size}, {torch.get_num_threads()} threads, "
          f"{args.rounds} alternating rounds x {args.steps} steps")
    print(f"{'pair':15} {'hand ms':>9} {'accel ms':>9} {'accel/hand':>11} {'per-round ratios':>18}")
    for name, sides in results.items():
        hand, acc = statistics.median(sides["hand"]) * 1e3, statistics.median(sides["accel"]) * 1e3
        low, high = min(sides["ratios"]), max(sides["ratios"])
        print(f"{name:15} {hand:9.1f} {acc:9.1f} {acc / hand:11.4f} {low:8.3f} - {high:.3f}")
    step_ms = statistics.median(results["channels_last"]["hand"]) * 1e3
    added = accel_us - plain_us
    print(f"wrapper, measured directly on a trivial model (channels_last plan): plain loop {plain_us:.1f} us/step, "
          f"through accel {accel_us:.1f} us/step: accel adds {added:.1f} us = {added / (step_ms * 1e3):.4%} "
          f"of this {step_ms:.0f} ms step")
    watch, low, high = watch_cost_us()
    print(f"watching the loop (accel/run/watch.py), per step on the trivial model: {watch:+.2f} us "
          f"(rounds {low:+.2f} to "
          f"{high:+.2f}) = {watch / (step_ms * 1e3):.4%} of this {step_ms:.0f} ms step")


if __name__ == "__main__":
    main()
