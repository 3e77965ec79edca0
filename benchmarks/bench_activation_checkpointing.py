"""What the activation_checkpointing accelerator saves in peak memory and costs in step time.

Two plans on the same training loop (torchvision model, Adam, random data; default resnet18 and resnet50, batch 16
at 224x224, 1000 classes): the empty plan ("plain") and {"activation_checkpointing": {}} (the model's repeated
blocks recompute their activations in backward).

Peak memory: each plan in a fresh process (this script with --child), so one's peak cannot hide the other's.
On CPU the growth of the peak resident set (resource.getrusage ru_maxrss) over its value after building the
model, optimizer, data and run, across a few training steps; on CUDA torch.cuda.max_memory_allocated over
memory_allocated at the same point. Both plans' growth includes the same gradients and Adam state (created by
the first step), so the difference is the activations that checkpointing does not keep.

Step time: both plans alive in one process and measured interleaved (accel.measure.Lab: plain, checkpointed;
checkpointed, plain; ...); the ratio checkpointed/plain with its 90% interval. The first steps' losses of both
plans from the same start on the same batches are compared: the accelerator promises exactly the same training.

    python benchmarks/bench_activation_checkpointing.py                  # resnet18, resnet50 at 224 (minutes)
    python benchmarks/bench_activation_checkpointing.py --quick          # resnet18 at 128x128, batch 8, 2 rounds
    python benchmarks/bench_activation_checkpointing.py --models resnet50 --batch-size 32 --json ckpt.json
"""
from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.bench import build_model, make_optimizer
from accel.measure import Ratio, TrainStep, endless, summarize, timed_steps
from accel.measure.lab import Lab
from accel.run.report import render_table

PLANS = {"plain": {}, "checkpointed": {"activation_checkpointing": {}}}


def setup(args, name: str):
    """The model (seeded), Adam on it, and a loader over random data: the same in every process."""
    torch.manual_seed(0)
    model = build_model(name, args.classes)
    optimizer = make_optimizer("adam", model)
    count = (max(args.steps, args.warmup) + 1) * args.batch_size
    data = TensorDataset(torch.randn(count, 3, args.image_size, args.image_size),
                         torch.randint(0, args.classes, (count,)))
    return model, optimizer, DataLoader(data, batch_size=args.batch_size, drop_last=True)


def child(args) -> None:
    """One plan in this fresh process: print the growth of the peak memory over a few steps, and their losses."""
    device = torch.device(args.device)
    model, optimizer, loader = setup(args, args.models)
    run = accel.accelerate(model, optimizer, loader, plan=PLANS[args.child], device=device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device) / 2 ** 20
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    _, losses = timed_steps(run, endless(run.loader), args.steps, TrainStep())
    after = (torch.cuda.max_memory_allocated(device) / 2 ** 20 if cuda
             else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps({"plan": args.child, "before_mb": round(before, 1), "peak_growth_mb": round(after - before, 1),
                      "measure": "max_memory_allocated" if cuda else "ru_maxrss", "losses": losses,
                      "applied": run.report.applied}))


def peak_in_child(args, name: str, plan: str) -> dict:
    command = [sys.executable, __file__, "--child", plan, "--models", name, "--batch-size", str(args.batch_size),
               "--image-size", str(args.image_size), "--classes", str(args.classes), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--device", args.device]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.child_timeout)
    if done.returncode != 0:
        return {"plan": plan, "error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_model(name: str, args) -> dict:
    print(f"{name}: peak memory, one fresh process per plan ...", flush=True)
    peaks = {plan: peak_in_child(args, name, plan) for plan in PLANS}
    print(f"{name}: step time, {args.rounds} interleaved rounds ...", flush=True)
    model, optimizer, loader = setup(args, name)
    lab = Lab(model, optimizer, loader, torch.device(args.device), TrainStep(), check_steps=args.warmup)
    try:
        plain, checkpointed = lab.trial(PLANS["plain"]), lab.trial(PLANS["checkpointed"])
        if plain.status != "ready" or checkpointed.status != "ready":
            return {"model": name, "peaks": peaks, "error": plain.error or checkpointed.error}
        lab.pace(plain.settled_step_s, args.steps_per_round)
        ratio = lab.rounds([checkpointed], plain, (), min_rounds=args.rounds, max_rounds=args.rounds)[id(checkpointed)]
        what = checkpointed.run.report.row("activation_checkpointing").changes.get("modules", "")
        times = {"plain": summarize(plain.times), "checkpointed": summarize(checkpointed.times)}
        losses = {"plain": plain.check_losses, "checkpointed": checkpointed.check_losses}
    finally:
        lab.close()
    grown = [peaks[p].get("peak_growth_mb") for p in PLANS]
    saved = grown[0] - grown[1] if None not in grown else None
    child_losses = [peaks[p].get("losses") for p in PLANS]
    return {"model": name, "checkpointed": what, "peaks": peaks, "times": times, "ratio": ratio.to_dict(),
            "saved_mb": round(saved, 1) if saved is not None else None,
            "saved_pct": round(100 * saved / grown[0], 1) if saved is not None and grown[0] > 0 else None,
            "losses": losses, "same_losses": losses["plain"] == losses["checkpointed"],
            "same_losses_in_children": child_losses[0] == child_losses[1] if None not in child_losses else None}


def print_table(results: list[dict], args) -> None:
    body = []
    for r in results:
        if "error" in r:
            body.append((r["model"], "", "", "", "", "", r["error"]))
            continue
        ratio = Ratio(r["ratio"]["samples"])
        for plan in PLANS:
            peak = r["peaks"][plan]
            body.append((r["model"], plan, f"{peak['peak_growth_mb']:.0f}" if "peak_growth_mb" in peak else "failed",
                         f"{r['times'][plan]['median_ms']:.1f}", "1.00" if plan == "plain" else str(ratio),
                         " ".join(f"{x:.5f}" for x in r["losses"][plan]),
                         peak.get("error", "") or (r["checkpointed"] if plan == "checkpointed" else "")))
    measure = "max_memory_allocated" if args.device.startswith("cuda") else "ru_maxrss"
    print("\n".join(render_table(("model", "plan", "peak growth MB", "ms/step", "time vs plain (90%)",
                                  "first losses", "note"), body, right=(2, 3))))
    print(f"peak growth: {measure} after {args.steps} steps over its value after building model, optimizer and run "
          f"(fresh process per plan); time: interleaved rounds in one process, geometric mean, 90% interval")
    for r in results:
        if "error" not in r:
            print(f"{r['model']}: checkpointing saves {r['saved_mb']} MB ({r['saved_pct']}%) of the peak growth at "
                  f"{Ratio(r['ratio']['samples'])} of the step time; first losses identical: in one process "
                  f"{r['same_losses']}, in the fresh processes {r['same_losses_in_children']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,resnet50", help="torchvision model names, comma-separated")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=3, help="training steps in each memory process")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds for the step time")
    parser.add_argument("--steps-per-round", type=int, default=None, help="default: about 0.5 s of steps")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each plan: timed apart, losses compared")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child-timeout", type=float, default=900.0, help="seconds a memory process may take")
    parser.add_argument("--quick", action="store_true", help="resnet18 at 128x128, batch 8, 2 rounds: does it run")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--child", choices=tuple(PLANS), help=argparse.SUPPRESS)  # internal: one memory process
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.models, args.image_size, args.batch_size, args.rounds = "resnet18", 128, 8, 2
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}; batch "
          f"{args.batch_size} at {args.image_size}px, {args.classes} classes, Adam")
    results = []
    for name in args.models.split(","):
        results.append(bench_model(name, args))
        gc.collect()
    print_table(results, args)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"torch": torch.__version__, "settings": vars(args), "results": results}, handle, indent=1)


if __name__ == "__main__":
    main()
