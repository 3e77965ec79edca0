"""accel bench: the seed benchmark (torchvision CNNs, a training step with Adam), eager against plans, each on its own
copy, measured in turn round after round in one process; each ratio to eager carries its interval ("noise" when it
holds 1.0), each achieved FLOP/s the measured peak of its dtype (docs/measurement.md). "auto" is tune's choice.
"""
from __future__ import annotations

import csv
import gc
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from accel import clock
from accel.measure import Ratio, TrainStep, matmul_peaks, peak_dtype, plan_label, summarize, training_flops
from accel.measure.lab import Lab
from accel.plan import Plan
from accel.run.report import render_table
from accel.search import tune
from accel.search.settings import BUDGET_STEPS, MIN_BUDGET_S, placed
from accel.workloads import WORKLOADS, build_model, make_optimizer

MODELS = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2", "mobilenet_v3_large")
DEFAULT_MODELS = ("alexnet", "resnet18", "mobilenet_v2")
CSV_FIELDS = ("model", "plan", "chosen", "status", "median_ms", "min_ms", "max_ms", "stdev_ms", "spread_pct",
              "vs_baseline", "ratio_low", "ratio_high", "noise", "speedup", "first_step_s", "warmup_s", "setup_s",
              "tune_s", "dtype", "gflop_per_step", "gflops", "peak_gflops", "peak_fraction", "steps", "rounds",
              "optimizer", "batch_size", "image_size", "applied", "skipped", "error")
NEARLY = 0.95  # a phase whose end is estimated stops short of it until it really ends


class Progress:
    """bench's progress bar on stderr (drawn where ``shown``: the CLI), in ``total`` phases (each plan set up, auto's
    search, each round); a phase goes from ``start`` to ``end``, and step() is each training step in it (``steps`` of
    them, or a search of ``seconds``, moved by its time against its budget), so the bar never sits still while
    something trains."""

    def __init__(self, shown: bool = False):
        self.shown = shown

    def start(self, total: int) -> None:
        self.bar = tqdm(total=total, file=sys.stderr, disable=not self.shown, bar_format="{desc} |{bar}| "
                        "{percentage:3.0f}% of {total_fmt} phases [{elapsed}<{remaining}]")
        self.phase("starting", 0, 0)

    def phase(self, description: str, start: float, end: float, steps: int | None = None,
              seconds: float | None = None) -> None:
        self.description, self.start, self.end, self.steps, self.seconds = description, start, end, steps, seconds
        self.began = self.last = time.perf_counter()
        self.times: list[float] = []
        self.bar.set_description_str(description, refresh=False)
        self._move(start)

    def step(self) -> None:
        now = time.perf_counter()
        self.times.append(now - self.last)
        self.last = now
        if self.steps:
            done = len(self.times) / self.steps
        else:
            budget = self.seconds or max(MIN_BUDGET_S, BUDGET_STEPS * statistics.median(self.times))
            done = (now - self.began) / budget
            self.bar.set_description_str(f"{self.description}, step {len(self.times)}", refresh=False)
        self._move(self.start + min(NEARLY, done) * (self.end - self.start))

    def close(self) -> None:
        self._move(self.bar.total)
        self.bar.close()

    def _move(self, position: float) -> None:
        self.bar.update(max(0.0, position - self.bar.n))  # tqdm redraws at most every 0.1 s


def add_ratios(rows: list[dict[str, Any]], peaks: dict[str, float]) -> None:
    """Speed-up from each row's ratio to eager, and its fraction of the peak of the dtype it computes in."""
    for row in rows:
        if row["status"] != "ok":
            continue
        ratio = row.get("vs_baseline")
        row["speedup"] = round(1 / ratio, 3) if ratio else None
        peak = peaks.get(row.get("dtype", "fp32"))
        row["peak_gflops"] = round(peak / 1e9, 1) if peak else None
        row["peak_fraction"] = round(row["gflops"] * 1e9 / peak, 3) if peak and row.get("gflops") else None


@dataclass
class BenchResult:
    rows: list[dict[str, Any]]
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self, path=None, **kwargs: Any) -> str:
        data = {"machine": self.machine, "settings": self.settings, "rows": self.rows}
        text = json.dumps(data, default=str, **kwargs)
        if path is not None:
            Path(path).write_text(text)
        return text

    def write_csv(self, path) -> None:
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows({k: "+".join(map(str, v)) if isinstance(v, list) else v
                              for k, v in ((k, row.get(k)) for k in CSV_FIELDS)} for row in self.rows)

    def plot(self, path) -> None:
        """A bar chart of ms per step, one group per model, labelled with the ratio to eager."""
        import matplotlib  # optional (pip install 'accel[bench]'): only --plot needs it

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ok = [r for r in self.rows if r["status"] == "ok"]
        models = list(dict.fromkeys(r["model"] for r in ok))
        plans = list(dict.fromkeys(r["plan"] for r in ok))
        fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(models) * len(plans) / 2), 4))
        width = 0.8 / max(1, len(plans))
        for i, plan in enumerate(plans):  # each model's first row of this plan
            found = [(j, next((r for r in ok if r["model"] == model and r["plan"] == plan), None))
                     for j, model in enumerate(models)]
            found = [(j + i * width, row) for j, row in found if row is not None]
            bars = ax.bar([x for x, _ in found], [row["median_ms"] for _, row in found], width, label=plan)
            ax.bar_label(bars, labels=[f"{row['vs_baseline']:.2f}" + ("~" if row.get("noise") else "")
                                       for _, row in found], fontsize=7)
        ax.set_xticks([j + width * (len(plans) - 1) / 2 for j in range(len(models))], models)
        ax.set_ylabel("ms per training step")
        ax.set_title(f"accel bench, {self.settings.get('batch_size')}x{self.settings.get('image_size')}px, "
                     f"{self.machine.get('cpu_model', '')} ({self.machine.get('threads', '')} threads)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def __str__(self) -> str:
        body = []
        for r in self.rows:
            if r["status"] != "ok":
                body.append((r["model"], r["plan"], "error", "", "", "", "", "", r.get("error", "")))
                continue
            plan = f"auto ({r['chosen']})" if r.get("chosen") is not None else r["plan"]
            ratio = "1.00" if r["plan"] == "eager" else (
                f"{r['vs_baseline']:.2f} ({r['ratio_low']:.2f}-{r['ratio_high']:.2f})" if r.get("ratio_low")
                else f"{r['vs_baseline']:.2f}")
            fraction = r.get("peak_fraction")
            body.append((r["model"], plan, f"{r['median_ms']:.1f}", f"±{r['spread_pct'] / 2:.1f}%",
                         f"{r['warmup_s']:.2f}", f"{r['gflops']:.1f}" if r.get("gflops") is not None else "",
                         f"{100 * fraction:.0f}% {r['dtype']}{'*' * (fraction > 1)}" if fraction is not None else "",
                         ratio, "noise" if r.get("noise") else ""))
        lines = render_table(("model", "plan", "ms/step", "spread", "warm-up s", "GFLOP/s", "% peak", "vs eager (90%)",
                              ""), body, right=(2, 3, 4, 5, 6))
        peaks = ", ".join(f"{k} {v}" for k, v in self.machine.get("peaks_gflops", {}).items())
        lines.append(f"vs eager: step time / eager's, from interleaved rounds (below 1 is faster; 'noise': the "
                     f"interval holds 1.0); measured matmul peaks GFLOP/s: {peaks}")
        return "\n".join(lines + [over_peak(r, self.machine.get("peaks_gflops", {})) for r in self.rows
                                  if (r.get("peak_fraction") or 0) > 1])


def over_peak(row: dict[str, Any], peaks: dict[str, float]) -> str:
    """The footnote of a row above 100% of its dtype's peak: what it reaches of a faster dtype's, or why not."""
    gflops, own = row["gflops"], row["dtype"]
    faster = [f"{100 * gflops / peak:.0f}% of {dtype}'s" for dtype, peak in peaks.items() if peak > gflops]
    why = (f"it is {faster[0]} peak: part of the plan computes in a faster dtype than its autocast ({own}), such as "
           "ipex's bf16 weights or TF32 on a GPU" if faster else "the peak's one short matmul probe read low (a busy "
           "machine), or the FLOPs counted (three forwards) overstate this model's backward")
    return f"* {row['model']} {row['plan']}: {100 * row['peak_fraction']:.0f}% of the {own} peak measured: {why}"


def bench(models=DEFAULT_MODELS, plans=("auto",), rounds: int = 3, steps: int | None = None, warmup: int = 2,
          optimizer: str = "adam", batch_size: int = 16, image_size: int = 224, classes: int = 1000,
          device: str = "cpu", progress: Progress | None = None, tune_budget_s: float | None = None,
          expected_steps: int | None = None, suite: str | None = None) -> BenchResult:
    """Measure eager and every plan (anything accelerate() takes, or "auto": tune's choice within tune_budget_s) on
    every model, interleaved in one process. steps: timed steps per plan and round (None: about 0.5 s worth).
    suite: "tiny" or "real" measures the workload zoo (accel.workloads) instead of `models`."""
    progress = progress or Progress()
    resolved, _, hardware = placed(device)  # the device accelerate() decides; one it refuses is a PlanError
    for plan in plans:
        if plan != "auto":
            Plan(plan)  # a misspelt plan fails before anything is measured (PlanError)
    peaks = matmul_peaks(resolved, hardware)
    machine = {"cpu_model": hardware.cpu_model, "physical_cores": hardware.physical_cores,
               "threads": torch.get_num_threads(), "isa": list(hardware.isa), "device": str(resolved),
               "torch": torch.__version__, "peaks_gflops": {k: round(v / 1e9, 1) for k, v in peaks.items()}}
    wanted = [[]] + [p for p in plans if plan_label(p) != "eager"]
    if suite is not None:
        models = list(WORKLOADS)
    settings = {"models": list(models), "suite": suite, "plans": [plan_label(p) for p in wanted], "rounds": rounds,
                "steps": steps, "warmup": warmup, "optimizer": optimizer, "batch_size": batch_size, "classes": classes,
                "image_size": image_size, "tune_budget_s": tune_budget_s, "expected_steps": expected_steps}
    rows: list[dict[str, Any]] = []
    phases = len(wanted) + ("auto" in wanted) + rounds  # per model: each plan set up, auto's search, each round
    progress.start(len(models) * phases)
    for index, name in enumerate(models):
        try:  # a model that cannot be built or run at this size is a row of errors, not a traceback
            built = (_workload(name, suite) if suite is not None else
                     _torchvision(name, optimizer, batch_size, image_size, classes))
        except Exception as error:
            rows += [error_row(name, plan_label(p), f"{type(error).__name__}: {error}") for p in wanted]
        else:
            rows += _bench_model(name, *built, wanted, settings, resolved, progress, index * phases)
        gc.collect()
    progress.close()
    add_ratios(rows, peaks)
    return BenchResult(rows, machine, settings)


def _torchvision(name, optimizer, batch_size, image_size, classes):
    """The seed benchmark's setting: a torchvision model, random images, cross-entropy."""
    torch.manual_seed(0)
    net = build_model(name, classes)
    data = TensorDataset(torch.randn(2 * batch_size, 3, image_size, image_size),
                         torch.randint(0, classes, (2 * batch_size,)))
    return (net, make_optimizer(optimizer, net), DataLoader(data, batch_size=batch_size, drop_last=True), TrainStep(),
            training_flops(net, torch.randn(batch_size, 3, image_size, image_size)))


def _workload(name, size):
    """A workload of the zoo with its own batches and loss (its FLOPs are not counted: 0)."""
    workload = WORKLOADS[name]
    return *workload.build(size, steps=2), TrainStep(step_fn=lambda run, batch: workload.loss(run.model, batch)), 0.0


def _bench_model(name, net, opt, loader, given, flops, wanted, settings, device, progress, at) -> list[dict[str, Any]]:
    def counted(run, batch):  # the loss of the model's own step, each step told to the progress bar
        progress.step()
        return given.loss(run, batch)
    step, resolved_plans, tuned = TrainStep(step_fn=counted), [], {}
    for plan in wanted:
        if plan == "auto":
            progress.phase(f"{name}: auto's search", at, at + 1, seconds=settings["tune_budget_s"])
            at, started = at + 1, clock.now()
            result = tune(net, opt, loader, device=device, budget_s=settings["tune_budget_s"],
                          expected_steps=settings["expected_steps"], step_fn=counted)
            tuned = {"chosen": plan_label(result.plan), "tune_s": round(clock.now() - started, 2),
                     "tuning": result.to_dict()}
            resolved_plans.append(("auto", result.plan.to_dict()))
        else:
            resolved_plans.append((plan_label(plan), plan))
    lab = Lab(net, opt, loader, device, step, check_steps=settings["warmup"])
    rounds = settings["rounds"]
    trials = []
    try:
        for label, plan in resolved_plans:
            progress.phase(f"{name}: setting up {label}", at, at + 1, steps=settings["warmup"])
            at, started = at + 1, clock.now()
            trials.append((label, lab.trial(plan), clock.now() - started))
        base = trials[0][1]
        if base.status != "ready":
            return [error_row(name, label, trial.error or base.error) for label, trial, _ in trials]
        lab.pace(base.settled_step_s, settings["steps"])
        live = [t for _, t, _ in trials if t.status == "ready"]
        progress.phase(f"{name}: {rounds} interleaved rounds", at, at + rounds,
                       steps=rounds * len(live) * (lab.settle + lab.chunk_steps))
        ratios = lab.rounds(live, base, (), min_rounds=rounds, max_rounds=rounds)
        return [_row(name, label, trial, setup_s, ratios.get(id(trial), Ratio()), flops,
                     tuned if label == "auto" else {}, settings, lab.chunk_steps) for label, trial, setup_s in trials]
    finally:
        lab.close()


def _row(model, label, trial, setup_s, ratio: Ratio, flops, tuned, settings, steps) -> dict[str, Any]:
    if trial.status != "ready":  # refused, or broke in a later round: its times are not a result
        return error_row(model, label, trial.error)
    eager, run = label == "eager", trial.run  # eager is the reference: its ratio is empty
    row = {"model": model, "plan": label, "status": "ok", **summarize(trial.times),
           "vs_baseline": 1.0 if eager else round(ratio.estimate, 3),
           "ratio_low": round(ratio.low, 3) if ratio.rounds > 1 else None,
           "ratio_high": round(ratio.high, 3) if ratio.rounds > 1 else None,
           "noise": not eager and ratio.noisy(), "times_ms": [round(t * 1000, 3) for t in trial.times],
           "first_step_s": round(trial.first_s[0], 4), "warmup_s": round(trial.warmup_s, 4),
           "setup_s": round(setup_s, 4), "dtype": peak_dtype(run.autocast_dtype),
           "gflop_per_step": round(flops / 1e9, 3), "steps": steps,
           **{k: settings[k] for k in ("rounds", "optimizer", "batch_size", "image_size")},
           "applied": run.report.applied, "skipped": run.report.skipped, **tuned}
    row["gflops"] = round(row["gflop_per_step"] / (row["median_ms"] / 1000), 2) if flops else None
    return row


def error_row(model: str, plan: str, error: str) -> dict[str, Any]:
    return {"model": model, "plan": plan, "status": "error", "error": error}
