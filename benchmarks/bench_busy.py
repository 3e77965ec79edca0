"""Does plan="auto" still return a plan at least as fast as eager when another process competes for a core?

Each run: a load generator (a separate Python process pinned with os.sched_setaffinity to one of this process's
CPUs, busy with single-threaded torch.mm, or pure-Python arithmetic with --load python) competes during the first
part of the search (default: half of tune's budget; it stops by itself after that, and is terminated when tune
returns or anything fails); accel.tune(...) runs on the model (default resnet18, Adam, batch 16 at 224x224,
random data; cache off). Then, with the load gone, tune's chosen plan and eager are measured interleaved in one
process (accel.measure.Lab: eager, plan; plan, eager; ...).

Reported per run: the chosen plan, its step-time ratio to eager with its 90% interval, whether it is at least as
fast as eager (not slower with 95% confidence), tune's own `established` flag and its `why`.

    python benchmarks/bench_busy.py                        # resnet18 at 224, tune budget 90 s, load 45 s, 3 runs
    python benchmarks/bench_busy.py --quick                # tiny CNN on 8x8 images, 10 s tune, 5 s load, 2 runs
    python benchmarks/bench_busy.py --runs 5 --load-s 60 --load python --json busy.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.bench import build_model, make_optimizer
from accel.measure import TrainStep, plan_label
from accel.measure.lab import Lab
from accel.run.report import render_table

# the load generator: pinned to one CPU, busy for a bounded time, then it prints its iterations and life time
LOAD = """
import os, sys, time
born = time.monotonic()
cpu, seconds, kind = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
os.sched_setaffinity(0, {cpu})
if kind == "mm":
    import torch
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
end, count = born + seconds, 0  # the window counts from its start (importing torch is busy too)
while time.monotonic() < end:
    if kind == "mm":
        torch.mm(a, a)
    else:
        sum(i * i for i in range(1000))
    count += 1
print(count, round(time.monotonic() - born, 1))
"""


class Load:
    """The competing process for a bounded time; stop() ends it (terminate, then kill) and says how long it ran."""

    def __init__(self, seconds: float, kind: str):
        self.cpu = max(os.sched_getaffinity(0))
        self.started = time.monotonic()
        self.process = subprocess.Popen([sys.executable, "-c", LOAD, str(self.cpu), str(seconds), kind],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def stop(self) -> dict:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        words = out.split() if self.process.returncode == 0 else []
        if len(words) == 2:  # it ended by itself: its iterations and life time
            return {"cpu": self.cpu, "ran_s": float(words[1]), "iterations": int(words[0]), "ended_itself": True}
        return {"cpu": self.cpu, "ran_s": round(time.monotonic() - self.started, 1), "iterations": None,
                "ended_itself": False}


def setup(args):
    torch.manual_seed(0)
    model = build_model(args.model, args.classes)
    count = 3 * args.batch_size
    data = TensorDataset(torch.randn(count, 3, args.image_size, args.image_size),
                         torch.randint(0, args.classes, (count,)))
    return model, make_optimizer("adam", model), DataLoader(data, batch_size=args.batch_size, drop_last=True)


def one_run(index: int, args) -> dict:
    torch._dynamo.reset()  # every run compiles afresh (the inductor disk cache stays warm)
    model, optimizer, loader = setup(args)
    load = Load(args.load_s, args.load)
    try:
        started = time.perf_counter()
        result = accel.tune(model, optimizer, loader, device=args.device, budget_s=args.tune_budget, cache=False)
        tune_s = time.perf_counter() - started
    finally:
        load_info = load.stop()
    row = {"run": index, "chosen": plan_label(result.plan), "plan": result.plan.to_dict(), "tune_s": round(tune_s, 1),
           "established": result.established, "why": result.why, "load": load_info, "tune": result.to_dict()}
    if not result.plan.names():
        return {**row, "ratio": None, "verdict": "same plan as eager", "at_least_as_fast": True}
    lab = Lab(model, optimizer, loader, torch.device(args.device), TrainStep())
    try:
        eager, chosen = lab.trial({}), lab.trial(result.plan.to_dict())
        if eager.status != "ready" or chosen.status != "ready":
            return {**row, "ratio": None, "verdict": f"failed: {eager.error or chosen.error}", "at_least_as_fast": None}
        lab.pace(eager.settled_step_s)
        ratio = lab.rounds([chosen], eager, (), min_rounds=args.rounds, max_rounds=args.rounds)[id(chosen)]
    finally:
        lab.close()
    verdict = "faster" if ratio.below(1.0) else "slower" if ratio.above(1.0) else "not told apart"
    return {**row, "ratio": ratio.to_dict(), "ratio_text": str(ratio), "verdict": verdict,
            "at_least_as_fast": not ratio.above(1.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", help="a torchvision name, or 'tiny' (8x8 images)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--tune-budget", type=float, default=90.0, help="tune's search budget, s")
    parser.add_argument("--load-s", type=float, default=None, help="seconds of load (default: half the budget)")
    parser.add_argument("--load", choices=("mm", "python"), default=None,
                        help="torch.mm on 1 thread (default), or pure Python (default of --quick: starts at once)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds of the quiet check")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny CNN on 8x8 images, 10 s tune, 5 s of pure-Python load, 2 runs")
    parser.add_argument("--json", metavar="PATH", help="write the runs as JSON")
    args = parser.parse_args()
    if args.quick:
        args.model, args.image_size, args.tune_budget, args.runs, args.rounds = "tiny", 8, 10.0, 2, 3
        args.load_s, args.load = args.load_s or 5.0, args.load or "python"
    if args.load_s is None:
        args.load_s = args.tune_budget / 2
    args.load = args.load or "mm"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads on CPUs {sorted(os.sched_getaffinity(0))}; "
          f"{args.model}, batch {args.batch_size} at {args.image_size}px, Adam; tune budget {args.tune_budget:g} s, "
          f"{args.load} load on one CPU for its first {args.load_s:g} s")
    runs = []
    for index in range(1, args.runs + 1):
        print(f"run {index}: tuning under load ...", flush=True)
        runs.append(one_run(index, args))
    body = [(r["run"], r["chosen"], r["tune_s"], f"{r['load']['ran_s']} s on cpu {r['load']['cpu']}",
             r.get("ratio_text", "1.00"), r["verdict"], "yes" if r["at_least_as_fast"] else "NO",
             r["established"], r["why"]) for r in runs]
    print("\n".join(render_table(("run", "chosen", "tune s", "load", "vs eager (90%)", "quiet check",
                                  "as fast", "established", "why"), body, right=(2,))))
    print("vs eager: chosen plan's step time / eager's after the load stopped, interleaved rounds, 90% interval; "
          "'as fast': not slower with 95% confidence")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"torch": torch.__version__, "settings": vars(args), "runs": runs}, handle, indent=1)


if __name__ == "__main__":
    main()
