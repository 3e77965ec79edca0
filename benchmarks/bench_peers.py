"""accel's plan="auto" against Hugging Face Accelerate's CPU settings, on the same training loop, in one process.

The loop: a workload of accel.workloads (resnet18, Hugging Face BERT and GPT-2, ...; random weights and data,
AdamW) with the loss its users write; a step is the next batch, forward, loss, backward, optimizer step and
zero_grad (accel.measure's TrainStep and timed_steps for every variant). Variants, each on its own copy of the
same initial model and optimizer, all alive at once and measured interleaved (eager, A, B, ...; ..., B, A, eager):

    eager               the plain loop, fp32
    Accelerate fp32     Accelerator(mixed_precision="no")
    Accelerate bf16     Accelerator(mixed_precision="bf16")
    Accelerate bf16+dynamo
                        Accelerator(mixed_precision="bf16", dynamo_backend="inductor")  (torch.compile)
    accel auto          plan="auto" in the workload's own loop first, on a copy, until it settles (its
                        measurement time and settled step reported: those were training steps), then the plan it
                        settled on, applied with accel.accelerate to another copy

Accelerate keeps process-wide singletons (PartialState, AcceleratorState, GradientState) and refuses a second
Accelerator with another mixed_precision. Here each Accelerator is built on freshly reset singletons, and their
contents are saved when its variant steps aside and put back when it steps again (the same switching accel's
Lab does for its own process-wide changes), so every prepared model runs with its own settings. A forward hook
on the model's first conv/linear layer records its output dtype: the bf16 variants must compute in bfloat16,
the fp32 ones in float32 (the "check" column).

Reported per workload: median ms/step, the first steps' extra time (warm-up, compile), the ratio to eager with
its 90% interval (accel.measure.Ratio over per-round ratios), and accel auto / Accelerate's best setting (the
fastest of its three here) from the same paired rounds.

    python benchmarks/bench_peers.py --models resnet18 --rounds 4 --tune-budget 240
    python benchmarks/bench_peers.py --models bert --batch 4 --rounds 3 --tune-budget 240
    python benchmarks/bench_peers.py --models gpt2 --batch 2 --rounds 3 --tune-budget 240 --expected-steps 2000
    python benchmarks/bench_peers.py --quick               # tiny resnet18 and BERT, 2 rounds: does it run

Needs `pip install accelerate` (measured with accelerate 1.15.0) and, for BERT and GPT-2, transformers.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import itertools
import json
import platform
import time
from dataclasses import dataclass
from typing import Any

import torch

import accel
from accel.measure import Ratio, TrainStep, endless, paired, plan_label, summarize, timed_steps
from accel.measure.lab import Lab, Trial
from accel.optim import rebuild_optimizer, same_params
from accel.run.report import render_table
from accel.workloads import WORKLOADS

# label -> Accelerator(**kwargs)
ACCELERATE = {
    "Accelerate fp32": {"mixed_precision": "no"},
    "Accelerate bf16": {"mixed_precision": "bf16"},
    "Accelerate bf16+dynamo": {"mixed_precision": "bf16", "dynamo_backend": "inductor"},
}


def accelerate_singletons() -> tuple:
    from accelerate.state import AcceleratorState, GradientState, PartialState

    return PartialState, AcceleratorState, GradientState


class AccelerateState:
    """One Accelerator's share of Accelerate's process-wide singletons, switched like a journal by Lab.activate:
    saved when its variant steps aside (suspend), put back when it steps again (resume)."""

    def __init__(self) -> None:
        self.suspend()

    def suspend(self) -> None:
        self.saved = [dict(cls._shared_state) for cls in accelerate_singletons()]

    def resume(self) -> None:
        for cls, saved in zip(accelerate_singletons(), self.saved):
            cls._shared_state.clear()  # in place: every instance's __dict__ is this very dict
            cls._shared_state.update(saved)

    def rollback(self) -> None:
        pass

    @staticmethod
    def reset() -> None:
        """Empty singletons, so the next Accelerator may have other settings."""
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


@dataclass
class AccelerateRun:
    """What accel.measure's TrainStep needs of a run, over an Accelerator's prepared objects: the loop an Accelerate
    user writes (its prepared model autocasts inside its forward; accelerator.backward; optimizer step, zero_grad)."""

    accelerator: Any
    model: Any
    optimizer: Any
    loader: Any
    journal: AccelerateState
    device: torch.device

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()


def watch_dtype(model: torch.nn.Module) -> dict:
    """A forward hook on the first conv/linear layer noting its output dtype (bf16 under autocast). It stays on: a
    dict store per forward, and removing it from a compiled model would only force a recompile."""
    seen: dict = {}
    layer = next(m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))
    layer.register_forward_hook(lambda module, inputs, output: seen.__setitem__("dtype", output.dtype))
    return seen


def accelerate_trial(lab: Lab, kwargs: dict) -> tuple[Trial, dict]:
    """Like Lab.trial, for an Accelerator: copies of the model and optimizer prepared with these settings, its
    first steps taken from the common start (timed apart: compile lands there)."""
    from accelerate import Accelerator

    trial = Trial({})
    lab.trials.append(trial)
    lab.activate(None)
    model, optimizer = lab.copies()
    seen = watch_dtype(model)
    try:
        AccelerateState.reset()
        accelerator = Accelerator(cpu=lab.device.type == "cpu", **kwargs)
        model, optimizer, loader = accelerator.prepare(model, optimizer, lab.loader)
        trial.run = AccelerateRun(accelerator, model, optimizer, loader, AccelerateState(), accelerator.device)
        lab.active = trial
        lab.start.restore()
        iterator = iter(loader)
        trial.first_s, trial.check_losses = timed_steps(trial.run, iterator, lab.check_steps, lab.step)
        trial.batches = itertools.chain(iterator, endless(loader))
    except Exception as error:
        trial.status, trial.error = "failed", f"{type(error).__name__}: {error}"
        lab.retire(trial)
    return trial, seen


def check_note(lab: Lab, label: str, trial: Trial, seen: dict) -> str:
    """'bfloat16 ok' when the prepared model computed as configured in its last step (and is compiled when asked),
    and its Accelerator, made current again, reports the mixed precision it was given; else what is off."""
    if trial.status != "ready":
        return trial.error
    wanted = torch.bfloat16 if "bf16" in label else torch.float32
    got = seen.get("dtype")
    note = f"{str(got).replace('torch.', '')} " + ("ok" if got == wanted else f"NOT AS CONFIGURED (wanted {wanted})")
    lab.activate(trial)
    if trial.run.accelerator.mixed_precision != ACCELERATE[label]["mixed_precision"]:
        note += f", its state says mixed_precision={trial.run.accelerator.mixed_precision!r}: NOT AS CONFIGURED"
    if "dynamo" in label:
        from accelerate.utils import is_compiled_module

        note += ", compiled" if is_compiled_module(trial.run.model) else ", NOT COMPILED"
    return note


def auto_in_loop(workload, net, opt, loader, args) -> tuple[Any, float, int, str]:
    """plan="auto" in the workload's own loop, on copies, until it settles: (plan, seconds, settled step, why)."""
    model = copy.deepcopy(net)
    optimizer = rebuild_optimizer(opt, params=same_params(opt, net, model))
    started = time.perf_counter()
    plan = accel.Auto(cache=False, budget_s=args.tune_budget, expected_steps=args.expected_steps)
    run = accel.accelerate(model, optimizer, loader, plan, device=args.device)
    try:
        while run.phase != "settled":
            for batch in run.loader:
                with run.autocast():
                    loss = workload.loss(run.model, batch)
                run.backward(loss)
                run.step()
                if run.phase == "settled":
                    break
        tuning = run.report.tuning  # its plan, whole: a rebuilt loader would join run.plan only at the next epoch
        print(tuning, flush=True)  # what it measured, what not and why (compile's turns too)
        search = run.search
        print(f"auto's first verdict at step {search.chosen_at}, settled at step {search.settled_at}", flush=True)
        return tuning.plan, time.perf_counter() - started, search.settled_at, tuning.why
    finally:
        run.close()


def bench_model(name: str, args) -> dict[str, Any]:
    workload = WORKLOADS[name]
    net, opt, loader = workload.build(args.size, seed=0, steps=64, batch=args.batch)

    told = f", expected_steps {args.expected_steps}" if args.expected_steps else ""
    print(f"{name}: plan='auto' in its loop (budget {args.tune_budget or 'default'} s{told}) ...", flush=True)
    chosen, tune_s, settled_at, why = auto_in_loop(workload, net, opt, loader, args)
    print(f"{name}: auto settled on {plan_label(chosen)} at step {settled_at} after {tune_s:.1f} s ({why}); "
          "building the variants ...", flush=True)

    step = TrainStep(step_fn=lambda run, batch: workload.loss(run.model, batch))  # the loss its users write
    lab = Lab(net, opt, loader, torch.device(args.device), step, check_steps=args.warmup)
    arms: list[tuple[str, Trial, dict | None]] = []  # label, trial, the dtype its first layer computed in
    try:
        base = lab.trial({})
        arms.append(("eager", base, None))
        for label, kwargs in ACCELERATE.items():
            arms.append((label, *accelerate_trial(lab, kwargs)))
        auto = lab.trial(chosen.to_dict())
        arms.append((f"accel auto ({plan_label(chosen)})", auto, None))
        if base.status != "ready":
            raise RuntimeError(f"eager cannot train: {base.error}")
        lab.pace(base.settled_step_s, args.steps)
        live = [t for _, t, _ in arms if t.status == "ready"]
        print(f"{name}: {args.rounds} interleaved rounds of {len(live)} variants ...", flush=True)
        ratios = lab.rounds(live, base, (), min_rounds=args.rounds, max_rounds=args.rounds)
        rows = []
        for label, trial, seen in arms:  # checked after the rounds: each ran as configured while interleaved
            note = check_note(lab, label, trial, seen) if seen is not None else trial.error
            ratio = ratios.get(id(trial), Ratio())
            rows.append({"model": name, "variant": label, "status": trial.status, "check": note,
                         **(summarize(trial.times) if trial.times else {}),
                         "first_steps_s": [round(s, 3) for s in trial.first_s], "warmup_s": round(trial.warmup_s, 3),
                         "first_losses": [round(x, 5) for x in trial.check_losses],
                         "vs_eager": ratio.to_dict() if trial is not base else None})
        # accel auto against the fastest of Accelerate's settings, paired round by round
        accelerate_arms = [(label, t) for label, t, _ in arms if label in ACCELERATE and t.status == "ready"]
        summary: dict[str, Any] = {"model": name, "batch": loader.batch_size, "auto_measured_s": round(tune_s, 1),
                                   "auto_settled_at": settled_at, "auto_why": why, "auto_plan": plan_label(chosen)}
        if accelerate_arms and auto.status == "ready":
            best_label, best = min(accelerate_arms, key=lambda a: ratios[id(a[1])].estimate)
            ratio = paired(auto.rounds, best.rounds)  # from the rounds both ran
            summary.update(accelerate_best=best_label, auto_vs_best=ratio.to_dict(), auto_vs_best_text=str(ratio))
        return {"rows": rows, "summary": summary}
    finally:
        lab.close()
        AccelerateState.reset()


def print_tables(results: list[dict[str, Any]]) -> None:
    body = []
    for result in results:
        for r in result["rows"]:
            ratio = Ratio(r["vs_eager"]["samples"]) if r["vs_eager"] else None
            body.append((r["model"], r["variant"], f"{r['median_ms']:.1f}" if "median_ms" in r else "failed",
                         f"{r['warmup_s']:.2f}", str(ratio) if ratio else "1.00",
                         " ".join(f"{x:.4f}" for x in r["first_losses"]), r["check"]))
    print("\n".join(render_table(("model", "variant", "ms/step", "warm-up s", "vs eager (90%)", "first losses",
                                  "check (first layer's output dtype)"), body, right=(2, 3))))
    print("vs eager: step time / eager's, geometric mean of per-round ratios from interleaved rounds, 90% interval;"
          " below 1 is faster")
    for result in results:
        s = result["summary"]
        if "auto_vs_best" in s:
            print(f"{s['model']}: accel auto ({s['auto_plan']}) / {s['accelerate_best']} (Accelerate's fastest "
                  f"here) = {s['auto_vs_best_text']} from {s['auto_vs_best']['rounds']} paired rounds; auto measured "
                  f"{s['auto_measured_s']} s in its loop, settled at step {s['auto_settled_at']}")
        else:
            print(f"{s['model']}: accel auto vs Accelerate: not measured (a variant failed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,bert,gpt2", help="workloads of accel.workloads, by name")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--batch", type=int, help="the workloads' batch (default: each one's for the size)")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds per model")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per variant and round (default: ~0.5 s)")
    parser.add_argument("--warmup", type=int, default=3, help="first steps of every variant, timed apart")
    parser.add_argument("--tune-budget", type=float, default=None, help="auto's budget, s (default: auto's)")
    parser.add_argument("--expected-steps", type=int, default=None,
                        help="tell auto the run's length, as a user who knows it would (compile is then tried past "
                             "the budget when its warm-up is a small share of the run ahead)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="tiny resnet18 and BERT, 2 rounds: does it run")
    parser.add_argument("--json", metavar="PATH", help="write rows and summaries as JSON")
    args = parser.parse_args()
    if args.quick:
        args.models, args.size, args.rounds, args.tune_budget = "resnet18,bert", "tiny", 2, args.tune_budget or 10.0
    import accelerate

    machine = {"torch": torch.__version__, "accelerate": accelerate.__version__, "accel": accel.__version__,
               "cpu": accel.probe().cpu_model, "threads": torch.get_num_threads(), "python": platform.python_version()}
    print(", ".join(f"{k} {v}" for k, v in machine.items()) + f"; {args.size} workloads, AdamW")
    results = []
    for name in args.models.split(","):
        results.append(bench_model(name, args))
        gc.collect()
        torch._dynamo.reset()  # resnet18 and resnet50 share ResNet.forward: no compiled code carried over
    print_tables(results)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": machine, "settings": vars(args), "results": results}, handle, indent=1, default=str)


if __name__ == "__main__":
    main()
