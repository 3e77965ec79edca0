"""plan="auto" in your loop against the plain loop and the best fixed stack: the total time of a run, measurement
included, and auto's peak memory during its measurement, in one process.

1. **auto**: `accelerate(..., plan=accel.Auto(cache=False, budget_s=B))` and the workload's ordinary loop until
   the search settles: the measurement phase's time (every step of it a real training step) and the step it
   settled at.
2. **Side by side**: the same model goes on training, in rounds of one chunk per plan, the order reversed every
   round: the plain loop, every fixed stack auto could have chosen (the full stack and the stack without each
   member) and auto's choice. Each plan's step is its median over the rounds.
3. **Totals for N steps**, from the parts measured above: plain = N x its step; best fixed = N x the fastest
   fixed stack's step; auto = its measurement phase + (N - settled step) x its choice's step. The spread is the
   min-max over rounds of each round's ratio. A projection from measured parts, not N steps run.

Memory (`--memory`): a GPT-style model of about 30M parameters with Adam; the process's peak RSS after 20 plain
steps, then after auto's measurement phase (a peak only rises, so the second over the first bounds auto's).

    python benchmarks/bench_inloop.py --workloads resnet18 --size real --budget 90 --rounds 4
    python benchmarks/bench_inloop.py --quick                      # tiny workloads: does it run
    python benchmarks/bench_inloop.py --memory
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch

import accel
from accel.measure import synchronize
from accel.plan.contract import Capability
from accel.search.settings import provides
from accel.workloads import WORKLOADS


def steps_of(run, workload, batches, count):
    for _ in range(count):
        try:
            batch = next(batches)
        except StopIteration:
            return False
        with run.autocast():
            loss = workload.loss(run.model, batch)
        run.backward(loss)
        run.step()
    return True


def endless(run):
    while True:
        yield from run.loader


def measure(name: str, size: str, budget: float, rounds: int, chunk: int, total: int,
            batch: int | None = None) -> dict:
    workload = WORKLOADS[name]
    model, optimizer, loader = workload.build(size, steps=64, batch=batch)
    started = time.perf_counter()
    run = accel.accelerate(model, optimizer, loader, accel.Auto(cache=False, budget_s=budget), device="cpu")
    batches = endless(run)
    while run.phase != "settled":
        steps_of(run, workload, batches, 1)
    measured_s = time.perf_counter() - started
    settled_step = run.steps
    chosen = run.plan.to_dict()
    arms = [a.plan for a in run.arms if not provides(a.plan, Capability.DATA_LOADER)
            and not provides(a.plan, Capability.SETUP_COSTLY)]  # those join at an epoch, or only on top
    plans = {accel.measure.plan_label(p): p for p in [{}, *arms]}
    print(f"{name}: auto's first verdict at step {run.search.chosen_at}, settled at step {settled_step} after "
          f"{measured_s:.1f} s on {accel.measure.plan_label(chosen)}", flush=True)
    print(run.report.tuning, flush=True)
    run.close()
    times: dict[str, list[float]] = {label: [] for label in plans}
    order = list(plans)
    for r in range(rounds):
        for label in (order if r % 2 == 0 else order[::-1]):
            current = accel.accelerate(model, optimizer, loader, plans[label], device="cpu")
            batches = endless(current)
            steps_of(current, workload, batches, 1)  # the step after a switch is not timed
            synchronize(current.device)
            begin = time.perf_counter()
            steps_of(current, workload, batches, chunk)
            synchronize(current.device)
            times[label].append((time.perf_counter() - begin) / chunk)
            current.close()
    step = {label: statistics.median(t) for label, t in times.items()}
    auto_label = accel.measure.plan_label(chosen)
    fixed = [label for label in plans if label != "eager"] or ["eager"]
    best = min(fixed, key=lambda label: step[label])
    totals = {"plain": total * step["eager"], "best fixed": total * step[best],
              "auto": measured_s + (total - settled_step) * step[auto_label]}
    per_round = {key: [] for key in ("auto/best", "auto/plain")}
    for r in range(rounds):
        auto_total = measured_s + (total - settled_step) * times[auto_label][r]
        per_round["auto/best"].append(auto_total / (total * times[best][r]))
        per_round["auto/plain"].append(auto_total / (total * times["eager"][r]))
    result = {"workload": name, "size": size, "batch": loader.batch_size, "steps": total, "budget_s": budget,
              "measurement_s": round(measured_s, 1), "chosen_step": run.search.chosen_at,
              "settled_step": settled_step, "auto_plan": auto_label, "best_fixed": best,
              "step_ms": {k: round(v * 1000, 1) for k, v in step.items()},
              "total_s": {k: round(v, 1) for k, v in totals.items()},
              "auto/best": round(totals["auto"] / totals["best fixed"], 3),
              "auto/plain": round(totals["auto"] / totals["plain"], 3),
              "spread": {k: [round(min(v), 3), round(max(v), 3)] for k, v in per_round.items()}}
    print(json.dumps(result), flush=True)
    return result


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory(budget: float) -> dict:
    from torch.utils.data import DataLoader

    from accel.workloads import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(vocab=8192, width=512, layers=8, heads=8, context=128)
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = torch.randint(0, 8192, (64 * 8, 129))
    loader = DataLoader(list(data), batch_size=8, shuffle=True)

    def loss_of(run, batch):
        logits = run.model(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    def loop(run, count):
        done = 0
        while done < count:
            for batch in run.loader:
                with run.autocast():
                    loss = loss_of(run, batch)
                run.backward(loss)
                run.step()
                done += 1
                if done == count:
                    return done
        return done

    plain = accel.accelerate(model, optimizer, loader, [], device="cpu")
    loop(plain, 20)
    plain_peak = peak_rss_mib()
    plain.close()
    run = accel.accelerate(model, optimizer, loader, accel.Auto(cache=False, budget_s=budget), device="cpu")
    while run.phase != "settled":
        loop(run, 1)
    auto_peak = peak_rss_mib()
    result = {"parameters_m": round(parameters / 1e6, 1), "plain_peak_mib": round(plain_peak),
              "auto_peak_mib": round(auto_peak), "auto/plain": round(auto_peak / plain_peak, 3),
              "auto_plan": run.plan.names()}
    print(json.dumps(result), flush=True)
    run.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["resnet18"])
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--budget", type=float, default=90.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=3, help="timed steps per plan and round")
    parser.add_argument("--steps", type=int, default=2000, help="the run's length the totals are for")
    parser.add_argument("--batch", type=int, help="the workloads' batch (default: each one's for the size)")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.size, args.budget, args.rounds, args.workloads = "tiny", 5.0, 2, ["resnet18", "bert", "lstm"]
    results = [memory(args.budget)] if args.memory else [
        measure(name, args.size, args.budget, args.rounds, args.chunk, args.steps, args.batch)
        for name in args.workloads]
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
