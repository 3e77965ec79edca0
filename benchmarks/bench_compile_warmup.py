"""compile's warm-up, whole model against regional (each repeated block compiled once), on a cold cache.

Each variant runs in a fresh process with its own empty inductor cache (TORCHINDUCTOR_CACHE_DIR), so every warm-up
is a first compile. Reported: the first step's time minus a steady step (the warm-up), and the steady step, for
eager, compile and compile with regional=True; the variants run in turn, `--repeats` times, and the table gives
the median and the min-max.

    python benchmarks/bench_compile_warmup.py                          # a 12-layer GPT-style model (width 256)
    python benchmarks/bench_compile_warmup.py --model resnet18 --repeats 1
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
    import torch

    import accel
    from accel.testing.models import TinyGPT

    torch.manual_seed(0)
    if model_name == "gpt":
        model = TinyGPT(vocab=4096, width=256, layers=12, heads=4, context=128)
        batches = [torch.randint(0, 4096, (8, 129)) for _ in range(4)]

        def loss_of(run, batch):
            logits = run.model(batch[:, :-1])
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
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
    print(json.dumps({"first_s": times[0], "steady_s": steady, "warmup_s": times[0] - steady}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "VARIANT"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.steps)
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
