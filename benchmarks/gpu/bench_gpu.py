"""accel's plan="auto" against the plain loop and Hugging Face Accelerate's best setting on a GPU, in one process.

Models (random weights and data, nothing downloaded): torchvision's resnet50 at batch 64 of 3x224x224 images (SGD
with momentum, as torchvision's reference recipe), and GPT-2 small built from transformers' GPT2Config at sequence
1024 (AdamW; batch 8; use_cache off, as for training). Each batch is already made, in host memory, and the user's
loader hands them out (DataLoader(batch_size=None)); each variant trains its own copy of the same initial model:

    eager fp32                  the plain loop: batch.to(device), forward, loss, backward, step, zero_grad
    Accelerate bf16+compile     Accelerator(mixed_precision="bf16", dynamo_backend="inductor"): its prepared model
                                autocasts and is compiled; accelerator.backward (its dataloader placement is
                                blocking, as batch.to(device))
    accel auto                  accel.accelerate(..., plan=accel.Auto(budget_s=..., expected_steps=100_000)) in the
                                same loop: the search runs in it first, then the plan it settled on keeps training
                                (told the run's length, a long training's, as its user would: compile's warm-up
                                is then weighed against the run ahead, not only the search's budget)

Order per model: each variant's first steps (compile lands there), eager's, Accelerate's, then auto's (it measures
in the loop until it settles, within a share of the model's time left), then timed rounds that alternate the
variants (eager, Accelerate, auto; auto, Accelerate, eager; ...), each a chunk of steps between two device
synchronisations. Process-wide flags (TF32, cuDNN's benchmark, the thread count) are set to each variant's own
before its rounds: accel's run changes some of them while it is open.

Reported per model and variant: the median step, images or tokens per second, MFU (the model's FLOPs per step,
counted once with torch.utils.flop_counter over an eager fp32 forward and backward, per second, over the bf16
matmul peak measured at the start: torch.mm of two 8192x8192 bf16 matrices, best of 10), the ratios per round
with their range, and issue 38's goals (met or not, by how much). Time is budgeted (--budget-s over the models,
auto's search a share of each model's); results are written after every model.

    python benchmarks/gpu/bench_gpu.py --json out.json                 # on a GPU (benchmarks/gpu/run.sh runs it)
    python benchmarks/gpu/bench_gpu.py --device cpu --tiny --json x    # tiny models, 1-2 steps: does it run
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

GOALS = {"resnet50": {"auto_vs_eager": 1.8, "auto_vs_accelerate": 1.10},
         "gpt2": {"auto_vs_accelerate": 1.10, "auto_mfu": 0.45}}  # issue 38's goals, per model
VARIANTS = ("eager fp32", "Accelerate bf16+compile", "accel auto")


# --- the machine -----------------------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bf16_peak(device: torch.device, size: int, repeats: int = 10, calls: int = 5) -> float:
    """The measured bf16 matmul rate, FLOP/s: torch.mm of two size x size matrices, `calls` per timing, best of
    `repeats`."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 * calls / best


def machine(device: torch.device) -> dict[str, Any]:
    import accel
    from accel.hardware import package_version

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "accelerate": package_version("accelerate"), "accel": accel.__version__, "device": str(device),
             "cpu": accel.probe().cpu_model, "threads": torch.get_num_threads()}
    with contextlib.suppress(ImportError):
        import transformers

        found["transformers"] = transformers.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        found.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                     memory_gib=round(props.total_memory / 2 ** 30, 1), cudnn=torch.backends.cudnn.version())
    return found


# --- the models: what a user builds ------------------------------------------------------------------------------

def resnet50(tiny: bool):
    """(build model, batches, loss, items per batch, what an item is)."""
    import torchvision

    batch, size, classes = (2, 16, 10) if tiny else (64, 224, 1000)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, 3, size, size, generator=generator),
                torch.randint(0, classes, (batch,), generator=generator)) for _ in range(2 if tiny else 6)]
    build = (lambda: torchvision.models.resnet18(num_classes=classes)) if tiny else (
        lambda: torchvision.models.resnet50(num_classes=classes))

    def loss(model, data):
        images, labels = data
        return torch.nn.functional.cross_entropy(model(images), labels)

    def optimizer(model):
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

    return build, optimizer, batches, loss, batch, "images"


def gpt2(tiny: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64) if tiny else GPT2Config()
    config.use_cache = False  # training: no KV cache handed between blocks
    batch, length = (2, 32) if tiny else (8, 1024)
    generator = torch.Generator().manual_seed(1)
    batches = [{"input_ids": ids, "labels": ids} for ids in
               (torch.randint(0, config.vocab_size, (batch, length), generator=generator) for _ in range(4))]

    def loss(model, data):
        return model(**data).loss  # what Hugging Face users write

    def optimizer(model):
        return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    return (lambda: GPT2LMHeadModel(config)), optimizer, batches, loss, batch * length, "tokens"


MODELS = {"resnet50": resnet50, "gpt2": gpt2}


def to_device(data: Any, device: torch.device) -> Any:
    if isinstance(data, dict):
        return {k: v.to(device) for k, v in data.items()}
    return tuple(v.to(device) for v in data)


def loader_of(batches: list) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)


def counted_flops(model: torch.nn.Module, loss: Callable, data: Any) -> float:
    """The model's FLOPs for one training step's forward and backward (torch.utils.flop_counter), eager fp32."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss(model, data).backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


# --- the variants: each a loop over its own objects ------------------------------------------------------------

class Variant:
    """One variant's loop: step() takes its next batch and trains one step; flags are the process settings it runs
    under (captured once it is set up, put back before each of its rounds)."""

    def __init__(self, name: str, step: Callable[[], None], close: Callable[[], None] = lambda: None):
        self.name, self.step, self.close = name, step, close
        self.flags: tuple | None = None
        self.first_s: list[float] = []
        self.times: list[float] = []  # seconds per step, one per round
        self.error = ""
        self.extra: dict[str, Any] = {}

    def capture(self) -> None:
        self.flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                      torch.backends.cudnn.benchmark, torch.get_num_threads())

    def apply(self) -> None:
        if self.flags is not None:
            (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
             threads) = self.flags
            torch.set_num_threads(threads)


def cycle(loader):
    while True:
        yield from loader


def eager(build, make_optimizer, batches, loss, device) -> Variant:
    model = build().to(device)
    optimizer = make_optimizer(model)
    data = cycle(loader_of(batches))

    def step():
        value = loss(model, to_device(next(data), device))
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    variant = Variant(VARIANTS[0], step)
    variant.extra["model"] = model
    return variant


def accelerate_best(build, make_optimizer, batches, loss, device, backend: str) -> Variant:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision="bf16", dynamo_backend=backend)
    model = build()
    model, optimizer = accelerator.prepare(model, make_optimizer(model))
    data = cycle(loader_of(batches))

    def step():
        value = loss(model, to_device(next(data), accelerator.device))
        accelerator.backward(value)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    variant = Variant(VARIANTS[1], step)
    variant.extra["settings"] = f"Accelerator(mixed_precision='bf16', dynamo_backend={backend!r})"
    return variant


def accel_auto(build, make_optimizer, batches, loss, device, budget_s: float, expected_steps: int | None) -> Variant:
    import accel

    model = build()
    plan = accel.Auto(budget_s=budget_s, expected_steps=expected_steps, cache=False)
    run = accel.accelerate(model, make_optimizer(model), loader_of(batches), plan=plan, device=device)
    data = cycle(run.loader)  # a new epoch of run.loader each time around: a rebuilt loader joins there

    def step():
        batch = next(data)
        with run.autocast():
            value = loss(run.model, batch)  # run.model: compile, when it wins, wraps it
        run.backward(value)
        run.step()
    variant = Variant(VARIANTS[2], step, close=run.close)
    variant.extra["run"] = run
    return variant


# --- measuring -------------------------------------------------------------------------------------------------

def timed(variant: Variant, steps: int, device: torch.device) -> float:
    """Seconds per step over `steps` steps between two synchronisations."""
    variant.apply()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        variant.step()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def warm(variant: Variant, steps: int, device: torch.device) -> None:
    for _ in range(steps):
        variant.first_s.append(timed(variant, 1, device))


def settle_auto(variant: Variant, device: torch.device, until: float) -> None:
    """Steps of the auto variant until its search settled (or the time is up), then one more, timed."""
    run = variant.extra["run"]
    started = time.perf_counter()
    while run.phase != "settled" and time.perf_counter() < until:
        variant.step()
    synchronize(device)
    variant.extra.update(search_s=round(time.perf_counter() - started, 1), settled=run.phase == "settled",
                         settled_at=run.search.settled_at, steps_in_search=run.steps)
    variant.first_s.append(timed(variant, 1, device))


def described(variant: Variant) -> dict[str, Any]:
    run = variant.extra.get("run")
    if run is None:
        return {"settings": variant.extra.get("settings", "")}
    tuning = run.report.tuning
    return {"plan": run.plan.to_dict(), "settled": variant.extra.get("settled"),
            "settled_at_step": variant.extra.get("settled_at"), "search_s": variant.extra.get("search_s"),
            "why": getattr(tuning, "why", ""), "report": str(run.report)}


def bench_model(name: str, args, device: torch.device, peak: float, until: float) -> dict[str, Any]:
    started = time.perf_counter()
    build, make_optimizer, batches, loss, items, unit = MODELS[name](args.tiny)
    out: dict[str, Any] = {"batch_items": items, "unit": unit, "variants": {}}
    torch.manual_seed(0)
    variants: list[Variant] = []

    def attempt(label: str, make: Callable[[], Variant], warm_up: Callable[[Variant], None]) -> None:
        try:
            torch.manual_seed(0)  # every copy starts from the same weights
            variant = make()
            warm_up(variant)
            variant.capture()
            variants.append(variant)
        except Exception as error:  # said, and the other variants are still measured
            out["variants"][label] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
            print(f"{name}: {label} failed: {type(error).__name__}: {error}", flush=True)
        gc.collect()

    defaults = Variant("defaults", lambda: None)
    defaults.capture()  # torch's own settings: what eager and Accelerate run under
    attempt(VARIANTS[0], lambda: eager(build, make_optimizer, batches, loss, device), lambda v: warm(v, 2, device))
    if variants:
        eager_model = variants[0].extra["model"]
        out["flops_per_step"] = counted_flops(eager_model, loss, to_device(batches[0], device))
    print(f"{name}: Accelerate compiles ...", flush=True)
    attempt(VARIANTS[1], lambda: accelerate_best(build, make_optimizer, batches, loss, device, args.backend),
            lambda v: warm(v, 3, device))
    budget = max(args.auto_min_s, args.auto_share * (until - time.perf_counter()))
    print(f"{name}: accel auto measures in its loop (budget {budget:.0f} s) ...", flush=True)
    attempt(VARIANTS[2], lambda: accel_auto(build, make_optimizer, batches, loss, device, budget,
                                            args.expected_steps or None),
            lambda v: settle_auto(v, device, until=time.perf_counter() + budget + args.grace_s))
    order = sorted(variants, key=lambda v: VARIANTS.index(v.name))
    step_s = {v.name: min(v.first_s[-1:] or [1.0]) for v in order}
    chunk = {v.name: max(args.min_steps, min(args.max_steps, int(args.round_s / max(step_s[v.name], 1e-4))))
             for v in order}
    rounds = 0
    while order and rounds < args.max_rounds:
        cost = sum(chunk[v.name] * step_s[v.name] for v in order)
        if rounds >= args.min_rounds and time.perf_counter() + cost > until:
            break
        for variant in (order if rounds % 2 == 0 else reversed(order)):
            try:
                variant.times.append(timed(variant, chunk[variant.name], device))
            except Exception as error:
                variant.error = f"{type(error).__name__}: {error}"
                order.remove(variant)
                break
        rounds += 1
    for variant in sorted(variants, key=lambda v: VARIANTS.index(v.name)):
        row = {"first_steps_s": [round(s, 3) for s in variant.first_s], "rounds": len(variant.times),
               "steps_per_round": chunk.get(variant.name), **described(variant)}
        if variant.error:
            row["error"] = variant.error
        if variant.times:
            median = statistics.median(variant.times)
            row.update(median_ms=round(median * 1e3, 2), min_ms=round(min(variant.times) * 1e3, 2),
                       max_ms=round(max(variant.times) * 1e3, 2), per_s=round(items / median, 1))
            if out.get("flops_per_step"):
                row.update(tflops=round(out["flops_per_step"] / median / 1e12, 1),
                           mfu=round(out["flops_per_step"] / median / peak, 4))
        out["variants"][variant.name] = row
    out["ratios"] = ratios(variants)
    out["goals"] = goals(name, out)
    out["seconds"] = round(time.perf_counter() - started, 1)
    for variant in variants:
        with contextlib.suppress(Exception):
            variant.close()
    return out


def ratios(variants: list[Variant]) -> dict[str, Any]:
    """auto's speed over each other variant's, from the rounds both ran (a round's steps alternate), per round."""
    by = {v.name: v for v in variants}
    auto = by.get(VARIANTS[2])
    found = {}
    for other in VARIANTS[:2]:
        if auto is None or other not in by or not auto.times or not by[other].times:
            continue
        pairs = [b / a for a, b in zip(auto.times, by[other].times)]
        found[f"auto_vs_{'eager' if other == VARIANTS[0] else 'accelerate'}"] = {
            "median": round(statistics.median(pairs), 3), "min": round(min(pairs), 3), "max": round(max(pairs), 3),
            "rounds": len(pairs)}
    return found


def goals(name: str, out: dict[str, Any]) -> dict[str, Any]:
    """Issue 38's goals for this model: each with the number measured, met or not, and by how much."""
    found = {}
    for goal, wanted in GOALS.get(name, {}).items():
        if goal == "auto_mfu":
            value = out["variants"].get(VARIANTS[2], {}).get("mfu")
        else:
            value = out["ratios"].get(goal, {}).get("median")
        found[goal] = {"wanted": wanted, "measured": value,
                       "met": None if value is None else value >= wanted,
                       "short_by": None if value is None or value >= wanted else round(wanted - value, 3)}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models, 1-2 steps per round: does it run")
    parser.add_argument("--models", default="resnet50,gpt2")
    parser.add_argument("--budget-s", type=float, default=200.0, help="the whole benchmark's time, imports aside")
    parser.add_argument("--auto-share", type=float, default=0.6, help="auto's search budget: this share of the "
                                                                      "model's time left once Accelerate compiled")
    parser.add_argument("--auto-min-s", type=float, default=10.0, help="auto's search budget at least")
    parser.add_argument("--expected-steps", type=int, default=100_000,
                        help="the training run's length auto is told (0: not told); compile's warm-up may then run "
                             "past the budget where the run ahead pays it back")
    parser.add_argument("--grace-s", type=float, default=60.0, help="past its budget, auto may finish a turn")
    parser.add_argument("--backend", default=None, help="Accelerate's dynamo backend (default: inductor; "
                                                         "eager with --tiny)")
    parser.add_argument("--round-s", type=float, default=1.0, help="a variant's steps per round take about this")
    parser.add_argument("--min-steps", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--min-rounds", type=int, default=2)
    parser.add_argument("--max-rounds", type=int, default=8)
    parser.add_argument("--peak-size", type=int, default=8192)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if args.tiny:
        args.backend = args.backend or "eager"
        args.min_steps = args.max_steps = 2
        args.min_rounds = args.max_rounds = 2
        args.peak_size, args.grace_s, args.auto_min_s, args.expected_steps = 256, 2.0, 1.0, 0
    args.backend = args.backend or "inductor"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPU machine has no network: models are built from configs
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    device = torch.device(args.device)
    result: dict[str, Any] = {"settings": vars(args), "goals": GOALS}

    def write() -> None:
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(result, handle, indent=1, default=str)

    if device.type == "cuda" and not torch.cuda.is_available():
        result["skipped"] = (f"no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda}, "
                             "torch.cuda.is_available() is False)")
        write()
        print(f"SKIPPED: {result['skipped']}")
        return 0
    started = time.perf_counter()
    until = started + args.budget_s
    result["machine"] = machine(device)
    peak = bf16_peak(device, args.peak_size)
    result["bf16_peak_tflops"] = round(peak / 1e12, 1)
    print(json.dumps(result["machine"]), f"bf16 matmul peak {peak / 1e12:.1f} TFLOP/s", flush=True)
    result["models"] = {}
    names = args.models.split(",")
    for index, name in enumerate(names):
        share = (until - time.perf_counter()) / (len(names) - index)
        print(f"{name}: {share:.0f} s", flush=True)
        try:
            result["models"][name] = bench_model(name, args, device, peak, time.perf_counter() + share)
        except KeyboardInterrupt:  # run.sh's time limit: what was measured is kept
            result["models"][name] = {"error": "interrupted at the time limit"}
            write()
            return 1
        except Exception as error:
            result["models"][name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        print(summary_lines(name, result["models"][name]), flush=True)
        write()
        gc.collect()
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["seconds"] = round(time.perf_counter() - started, 1)
    write()
    failed = [n for n, m in result["models"].items()
              if "error" in m or any("error" in v for v in m["variants"].values())]
    return 1 if failed else 0


def summary_lines(name: str, out: dict[str, Any]) -> str:
    if "error" in out:
        return f"{name}: failed: {out['error']}"
    lines = [f"{name} (batch of {out['batch_items']} {out['unit']}):"]
    for label in VARIANTS:
        row = out["variants"].get(label, {})
        if "median_ms" in row:
            lines.append(f"  {label:24} {row['median_ms']:9.2f} ms/step  {row['per_s']:10.1f} {out['unit']}/s  "
                         f"MFU {row.get('mfu', 0) * 100:5.1f}%  ({row['rounds']} rounds)")
        else:
            lines.append(f"  {label:24} {row.get('error', 'not measured')}")
    auto = out["variants"].get(VARIANTS[2], {})
    if "plan" in auto:
        lines.append(f"  auto chose {auto['plan']} (settled: {auto['settled']}, at step {auto['settled_at_step']}, "
                     f"{auto['search_s']} s)")
    for goal, verdict in out["goals"].items():
        lines.append(f"  goal {goal} >= {verdict['wanted']}: measured {verdict['measured']} -> "
                     f"{'met' if verdict['met'] else 'NOT met' if verdict['met'] is False else 'not measured'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
