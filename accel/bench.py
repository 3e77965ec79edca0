"""Measure training steps: one fresh process per (model, plan), warm-up apart from steady state, medians, ratios.

    result = accel.bench.bench(models=["resnet18"], plans=[[], ["channels_last"], "auto"], steps=5)
    print(result)            # a table; result.rows are dicts; result.to_json(), .write_csv(), .plot()

A fresh process per measurement keeps threads, affinity, environment variables, allocator state and compile
caches of one plan from leaking into the next. The step measured is the seed benchmark's: next batch, forward,
cross-entropy, backward, optimizer step (Adam by default), zero_grad. See docs/measurement.md.
"""
from __future__ import annotations

import csv
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

MODELS = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2", "mobilenet_v3_large")
DEFAULT_MODELS = ("alexnet", "resnet18", "mobilenet_v2")
RESULT_PREFIX = "ACCEL_BENCH_RESULT "
CSV_FIELDS = ("model", "plan", "status", "median_ms", "min_ms", "max_ms", "stdev_ms", "spread_pct", "vs_baseline",
              "speedup", "first_step_s", "warmup_s", "setup_s", "peak_memory_mb", "gflop_per_step", "gflops",
              "peak_fraction", "steps", "warmup", "optimizer", "batch_size", "image_size", "rounds", "applied",
              "skipped", "chosen", "tune_s", "error")


def plan_label(plan: Any) -> str:
    """'eager' for the empty plan, 'auto', or the accelerator names joined by '+'."""
    if plan == "auto":
        return "auto"
    from accel.plan import Plan

    names = Plan(plan).names()
    return "+".join(names) if names else "eager"


def build_model(name: str, classes: int = 1000) -> torch.nn.Module:
    """A torchvision model by name (random weights), or 'tiny' (accel.testing.TinyCNN on 3x8x8 images)."""
    if name == "tiny":
        from accel.testing import TinyCNN

        return TinyCNN(channels=3, classes=classes)
    import torchvision

    return torchvision.models.get_model(name, weights=None, num_classes=classes)


def make_optimizer(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r} (allowed: 'adam', 'sgd')")


def training_flops(model: torch.nn.Module, batch_size: int, image_size: int) -> float:
    """FLOPs of one training step: the forward counted by FlopCounterMode on meta tensors (nothing computed), x3.

    Backward costs about twice the forward. It is not counted directly because torch's counter overcounts the
    backward of grouped (depthwise) convolutions: 62 GFLOP for mobilenet_v3_small at batch 16, not ~5.
    """
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    meta = copy.deepcopy(model).to("meta")
    x = torch.empty(batch_size, 3, image_size, image_size, device="meta")
    with FlopCounterMode(display=False) as counter:
        meta(x)
    return 3.0 * counter.get_total_flops()


def matmul_peak(device: str | torch.device = "cpu", size: int = 2048, repeats: int = 5) -> float:
    """The machine's measured fp32 matmul rate in FLOP/s (best of `repeats`): the physical limit a step can reach."""
    device = torch.device(device)
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / best


def synchronize(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def train_step(run, batch, loss_fn: Callable = torch.nn.functional.cross_entropy) -> torch.Tensor:
    """One step of the README loop on an accelerated run: forward under autocast, loss, backward, step."""
    inputs, targets = batch[0], batch[1]
    with run.autocast():
        loss = loss_fn(run.model(inputs), targets)
    run.backward(loss)
    run.step()
    return loss.detach()


def summarize(times_s: list[float]) -> dict[str, float]:
    """Median, min, max, standard deviation (ms) and spread (max-min as % of the median) of step times."""
    ms = [t * 1000 for t in times_s]
    median = statistics.median(ms)
    return {"median_ms": round(median, 3), "min_ms": round(min(ms), 3), "max_ms": round(max(ms), 3),
            "stdev_ms": round(statistics.stdev(ms), 3) if len(ms) > 1 else 0.0,
            "spread_pct": round(100 * (max(ms) - min(ms)) / median, 2) if median else 0.0}


def peak_memory_mb(device: torch.device) -> float:
    """Device memory peak for accelerators; on CPU this process's peak resident set (torch itself included)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure(model: str, plan: Any = None, steps: int = 5, warmup: int = 1, optimizer: str = "adam",
            batch_size: int = 16, image_size: int = 224, classes: int = 1000, device: str = "cpu",
            seed: int = 0, tune_budget_s: float | None = None) -> dict[str, Any]:
    """Measure one plan on one model in this process (bench() calls it in a fresh one). Returns a row.

    plan="auto" is accelerate(plan="auto"), i.e. accel.tune with its defaults, unless tune_budget_s is given.
    """
    import accel
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(seed)
    net = build_model(model, classes)
    flops = training_flops(net, batch_size, image_size)
    opt = make_optimizer(optimizer, net)
    data = TensorDataset(torch.randn(batch_size, 3, image_size, image_size),
                         torch.randint(0, classes, (batch_size,)))
    loader = DataLoader(data, batch_size=batch_size)  # one batch, served again every epoch
    started = time.perf_counter()
    tuning = None
    if plan == "auto" and tune_budget_s is not None:
        tuning = accel.tune(net, opt, loader, device=device, budget_s=tune_budget_s)
    run = accel.accelerate(net, opt, loader, plan=tuning.plan if tuning else plan, device=device)
    setup_s = time.perf_counter() - started
    batches = itertools.chain.from_iterable(itertools.repeat(run.loader))
    times = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        train_step(run, next(batches))
        synchronize(run.device)
        times.append(time.perf_counter() - start)
    row = {"model": model, "plan": plan_label(plan), "status": "ok", **summarize(times[warmup:]),
           "times_ms": [round(t * 1000, 3) for t in times[warmup:]],
           "first_step_s": round(times[0], 4), "warmup_s": round(sum(times[:warmup]), 4),
           "setup_s": round(setup_s, 4), "peak_memory_mb": round(peak_memory_mb(run.device), 1),
           "gflop_per_step": round(flops / 1e9, 3), "steps": steps, "warmup": warmup, "optimizer": optimizer,
           "batch_size": batch_size, "image_size": image_size, "device": str(run.device), "rounds": 1,
           "applied": run.report.applied, "skipped": run.report.skipped}
    row["gflops"] = gflops(row)
    tuning = tuning or getattr(run.report, "tuning", None)
    if tuning is not None:  # plan="auto": what tune chose and how long choosing took (inside setup_s)
        row.update(chosen="+".join(run.plan.names()) or "eager", tune_s=round(tuning.elapsed_s, 2),
                   tuning=tuning.to_dict())
    return row


def gflops(row: dict[str, Any]) -> float:
    return round(row["gflop_per_step"] / (row["median_ms"] / 1000), 2)


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the same (model, plan) measured in several alternating rounds: all steps pooled."""
    ok = [r for r in rounds if r["status"] == "ok"]
    if len(ok) < len(rounds):
        return next(r for r in rounds if r["status"] != "ok")
    row = dict(ok[0])
    row["times_ms"] = [t for r in ok for t in r["times_ms"]]
    row.update(summarize([t / 1000 for t in row["times_ms"]]))
    for key in ("first_step_s", "warmup_s", "setup_s"):
        row[key] = round(statistics.median(r[key] for r in ok), 4)
    row["peak_memory_mb"] = max(r["peak_memory_mb"] for r in ok)
    row["gflops"], row["rounds"] = gflops(row), len(ok)
    if "chosen" in row:
        row["chosen"] = " / ".join(dict.fromkeys(r["chosen"] for r in ok))
        row["tune_s"] = round(statistics.median(r["tune_s"] for r in ok), 2)
    return row


def measure_in_fresh_process(spec: dict[str, Any], timeout_s: float = 1800) -> dict[str, Any]:
    """Run measure(**spec) in a new Python process with its own compile cache; an error becomes a row too."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="accel-bench-") as cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache  # compile from scratch: warm-up includes the whole compile
        try:
            done = subprocess.run([sys.executable, "-m", "accel.bench", json.dumps(spec)], capture_output=True,
                                  text=True, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {**error_row(spec), "error": f"timed out after {timeout_s} s"}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return {**error_row(spec), "error": tail}


def error_row(spec: dict[str, Any]) -> dict[str, Any]:
    return {"model": spec["model"], "plan": plan_label(spec.get("plan")), "status": "error",
            **{k: spec.get(k) for k in ("steps", "warmup", "optimizer", "batch_size", "image_size")}}


@dataclass
class BenchResult:
    rows: list[dict[str, Any]]
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "settings": self.settings, "rows": self.rows}

    def to_json(self, path=None, **kwargs: Any) -> str:
        text = json.dumps(self.to_dict(), default=str, **kwargs)
        if path is not None:
            with open(path, "w") as handle:
                handle.write(text)
        return text

    def write_csv(self, path) -> None:
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: "+".join(map(str, v)) if isinstance(v, list) else v
                                 for k, v in ((k, row.get(k)) for k in CSV_FIELDS)})

    def plot(self, path) -> None:
        """A PNG: ms per step for each model, one bar per plan, labelled with the ratio to the baseline."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        models = list(dict.fromkeys(r["model"] for r in self.rows))
        plans = list(dict.fromkeys(r["plan"] for r in self.rows))
        width = 0.8 / max(1, len(plans))
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(models) * max(1, len(plans)) ** 0.5), 4.5))
        for i, plan in enumerate(plans):
            for j, model in enumerate(models):
                row = next((r for r in self.rows if r["model"] == model and r["plan"] == plan), None)
                if row is None or row["status"] != "ok":
                    continue
                bar = ax.bar(j + i * width, row["median_ms"], width, color=f"C{i}", label=plan if j == 0 else None)
                ax.bar_label(bar, labels=[f"{row.get('vs_baseline', 1):.2f}"], fontsize=7)
        ax.set_xticks([j + width * (len(plans) - 1) / 2 for j in range(len(models))], models)
        ax.set_ylabel("ms per training step (median; label: time vs eager)")
        ax.set_title(f"{self.settings.get('optimizer', '')} step, batch {self.settings.get('batch_size', '')}, "
                     f"{self.machine.get('cpu_model', '')} ({self.machine.get('threads', '')} threads)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def __str__(self) -> str:
        header = ("model", "plan", "ms/step", "spread", "warm-up s", "peak MB", "GFLOP/s", "% peak", "vs eager")
        body = []
        for r in self.rows:
            if r["status"] != "ok":
                body.append((r["model"], r["plan"], "error", r.get("error", ""), "", "", "", "", ""))
                continue
            fraction = r.get("peak_fraction")
            plan = f"auto ({r['chosen']})" if "chosen" in r else r["plan"]
            body.append((r["model"], plan, f"{r['median_ms']:.1f}", f"±{r['spread_pct'] / 2:.1f}%",
                         f"{r['warmup_s']:.2f}", f"{r['peak_memory_mb']:.0f}", f"{r['gflops']:.1f}",
                         f"{100 * fraction:.0f}%" if fraction is not None else "",
                         f"{r['vs_baseline']:.2f}" if r.get("vs_baseline") is not None else ""))
        widths = [max(len(str(x[i])) for x in [header, *body]) for i in range(len(header))]
        lines = ["  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
                 for cells in [header, *body]]
        peak = self.machine.get("matmul_peak_gflops")
        lines.append(f"vs eager: step time / eager step time (below 1 is faster); measured matmul peak {peak} GFLOP/s")
        return "\n".join(lines)


def add_ratios(rows: list[dict[str, Any]], peak_flops: float | None) -> None:
    """Time ratio and speed-up against each model's eager row, and the fraction of the matmul peak."""
    baselines = {r["model"]: r["median_ms"] for r in rows if r["plan"] == "eager" and r["status"] == "ok"}
    for row in rows:
        if row["status"] != "ok":
            continue
        base = baselines.get(row["model"])
        row["vs_baseline"] = round(row["median_ms"] / base, 3) if base else None
        row["speedup"] = round(base / row["median_ms"], 3) if base else None
        row["peak_fraction"] = round(row["gflops"] * 1e9 / peak_flops, 3) if peak_flops else None


def bench(models=DEFAULT_MODELS, plans=("auto",), steps: int = 3, warmup: int = 1, optimizer: str = "adam",
          batch_size: int = 16, image_size: int = 224, classes: int = 1000, device: str = "cpu",
          progress: bool = False, timeout_s: float = 1800, tune_budget_s: float | None = None,
          rounds: int = 1) -> BenchResult:
    """Measure the eager baseline and every plan on every model, each in a fresh process; returns the rows.

    A plan is anything accelerate() accepts (a list of names, a dict, a Plan) or "auto". The eager baseline
    (the empty plan) is always measured, first for each model. tune_budget_s bounds the search of "auto"
    (None: tune's default). With rounds > 1 the plans of a model are measured in turn, round after round
    (eager, A, B, eager, A, B, ...), so a change in the machine's load hits every plan alike; steps are pooled.
    """
    from tqdm import tqdm

    from accel.hardware import probe, resolve_device
    from accel.plan import Plan

    resolved = resolve_device(device)
    plans = [[]] + [p for p in plans if plan_label(p) != "eager"]
    peak = matmul_peak(resolved)
    hardware = probe()
    machine = {"cpu_model": hardware.cpu_model, "physical_cores": hardware.physical_cores,
               "threads": torch.get_num_threads(), "isa": list(hardware.isa), "device": str(resolved),
               "torch": torch.__version__, "matmul_peak_gflops": round(peak / 1e9, 1)}
    settings = {"models": list(models), "plans": [plan_label(p) for p in plans], "steps": steps, "warmup": warmup,
                "optimizer": optimizer, "batch_size": batch_size, "image_size": image_size, "classes": classes,
                "tune_budget_s": tune_budget_s, "rounds": rounds}
    measured: dict[tuple[str, int], list[dict[str, Any]]] = {}
    jobs = [(model, round_, i, plan) for model in models for round_ in range(rounds) for i, plan in enumerate(plans)]
    with tqdm(jobs, disable=not progress, file=sys.stderr, unit="run") as bar:
        for model, round_, i, plan in bar:
            bar.set_description(f"{model} {plan_label(plan)}" + (f" round {round_ + 1}" if rounds > 1 else ""))
            spec = {"model": model, "plan": plan if plan == "auto" else Plan(plan).to_dict(), "steps": steps,
                    "warmup": warmup, "optimizer": optimizer, "batch_size": batch_size, "image_size": image_size,
                    "classes": classes, "device": str(resolved)}
            if plan == "auto" and tune_budget_s is not None:
                spec["tune_budget_s"] = tune_budget_s
            measured.setdefault((model, i), []).append(measure_in_fresh_process(spec, timeout_s))
    rows = [merge_rounds(found) for found in measured.values()]
    add_ratios(rows, peak)
    return BenchResult(rows, machine, settings)


if __name__ == "__main__":  # the fresh process: python -m accel.bench '<spec as JSON>'
    result = measure(**json.loads(sys.argv[1]))
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)
