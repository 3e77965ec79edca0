"""compile's warm-up, whole model against regional (each repeated block compiled once), on a cold cache; with
--warm, a cold start against a warm one (a second run of the same script, with what the first compiled on disk).

Each variant runs in a fresh process with its own empty inductor cache (TORCHINDUCTOR_CACHE_DIR), so every warm-up
is a first compile. Reported: the first step's time minus a steady step (the warm-up), and the steady step, for
eager, compile and compile with regional=True; the variants run in turn, `--repeats` times, and the table gives
the median and the min-max.

--warm: each compile variant runs twice, in two fresh processes sharing one empty accel cache folder
(ACCEL_CACHE_DIR; compile keeps inductor's artifacts in its compile/ folder, accel/accelerators/compile/cache.py): the
first compiles cold and writes the folder, the second starts warm. Every repeat starts from a new empty folder.

    python benchmarks/bench_compile_warmup.py                          # a 12-layer GPT-style model (width 256)
    python benchmarks/bench_compile_warmup.py --model resnet18 --repeats 1
    python benchmarks/bench_compile_warmup.py --warm                   # cold against warm, the GPT-style model
    python benchmarks/bench_compile_warmup.py --warm --model cnn       # a small CNN (4 residual stages, 32 ch.)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {"eager": [], "compile": [{"compile": {}}], "compile regional": [{"compile": {"regional": True}}]}


def child(model_name: str, variant: str, steps: int) -> None:
    import torch  # in the child only: the parent measures fresh processes and never imports torch itself

    import accel
    from accel.workloads import NormCNN, TinyGPT

    torch.manual_seed(0)
    if model_name == "gpt":
        model = TinyGPT(vocab=4096, width=256, layers=12, heads=4, context=128)
        batches = [torch.randint(0, 4096, (8, 129)) for _ in range(4)]

        def loss_of(run, batch):
            logits = run.model(batch[:, :-1])
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    elif model_name == "cnn":  # a small ResNet-like CNN: a stem, 4 residual stages of 32 channels, 32x32 images
        model = NormCNN(channels=32, stages=4, classes=10, in_channels=3)
        batches = [(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))) for _ in range(4)]

        def loss_of(run, batch):
            return torch.nn.functional.cross_entropy(run.model(batch[0]), batch[1])
    else:
        import torchvision

        model = getattr(torchvision.models, model_name)(weights=None, num_classes=10)
        batches = [(torch.randn(8, 3, 128, 128), torch.randint(0, 10, (8,))) for _ in range(4)]

        def loss_of(run, batch):
            return torch.nn.functional.cross_entropy(run.model(batch[0]), batch[1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = accel.accelerate(model, optimizer, None, VARIANTS[variant], device="cpu")
    times = []
    for i in range(steps):
        started = time.perf_counter()
        with run.autocast():
            loss = loss_of(run, batches[i % len(batches)])
        run.backward(loss)
        run.step()
        times.append(time.perf_counter() - started)
    steady = statistics.median(times[2:])
    compiled = run.report.row("compile").changes if "compile" in run.report.applied else {}
    print(json.dumps({"first_s": times[0], "steady_s": steady, "warmup_s": times[0] - steady,
                      "warm_start": compiled.get("warm start", "")}))


def spread(values: list[float], unit: str = "s", scale: float = 1.0, digits: int = 1) -> str:
    values = [v * scale for v in values]
    return f"{statistics.median(values):.{digits}f} {unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def child_run(model: str, variant: str, steps: int, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", model, variant, "--steps", str(steps)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cold_and_warm(args) -> None:
    """Each compile variant twice per repeat, in fresh processes sharing one new accel cache folder."""
    variants = [v for v in VARIANTS if v != "eager"]
    found: dict[str, dict[str, list[dict]]] = {v: {"cold": [], "warm": []} for v in variants}
    base = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}  # torch's defaults
    loads: list[float] = []
    for _ in range(args.repeats):
        for variant in variants:
            with tempfile.TemporaryDirectory() as cache:
                env = {**base, "ACCEL_CACHE_DIR": cache}
                for start in ("cold", "warm"):
                    result = child_run(args.model, variant, args.steps, env)
                    loads.append(os.getloadavg()[0])  # others' work on the cores slows every number down
                    if not result["warm_start"].startswith("yes" if start == "warm" else "no"):
                        raise SystemExit(f"{variant}: the {start} run's report says warm start: {result['warm_start']}")
                    found[variant][start].append(result)
    print(f"{args.model}: warm-up (first step minus a steady one) and steady step, cold start against warm start "
          f"(a second process, same accel cache folder); median (min-max) of {args.repeats} repeat(s); 1-min load "
          f"average after each run {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs (its own threads "
          "included)")
    for variant, runs in found.items():
        for start in ("cold", "warm"):
            rows = runs[start]
            print(f"  {variant:17} {start}  warm-up {spread([r['warmup_s'] for r in rows]):>20}   "
                  f"step {spread([r['steady_s'] for r in rows], 'ms', 1000):>22}")
        cold = statistics.median(r["warmup_s"] for r in runs["cold"])
        warm = statistics.median(r["warmup_s"] for r in runs["warm"])
        print(f"  {variant:17} warm start saves {cold - warm:.1f} s of {cold:.1f} s "
              f"({warm / cold:.0%} of the cold warm-up left)" if cold > 0 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt", help="gpt (default), cnn, or a torchvision model name")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warm", action="store_true",
                        help="cold start against warm start: each compile variant twice, sharing one cache folder")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "VARIANT"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.steps)
        return
    if args.warm:
        cold_and_warm(args)
        return
    found: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}
                out = subprocess.run([sys.executable, __file__, "--child", args.model, variant, "--steps",
                                      str(args.steps)], env=env, capture_output=True, text=True, check=True)
                found[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.model}: warm-up (first step minus a steady one) and steady step, {args.repeats} cold run(s) each")
    for variant, runs in found.items():
        warm = [r["warmup_s"] for r in runs]
        steady = [r["steady_s"] * 1000 for r in runs]
        print(f"  {variant:17} warm-up {statistics.median(warm):6.1f} s ({min(warm):.1f}-{max(warm):.1f})   "
              f"step {statistics.median(steady):7.1f} ms ({min(steady):.1f}-{max(steady):.1f})")


if __name__ == "__main__":
    main()
