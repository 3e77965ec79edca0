"""accel bench: accel.bench's eager against plans from the command line, with a progress bar (docs/cli.md)."""
from __future__ import annotations

import argparse
import difflib

from accel.bench import DEFAULT_MODELS, MODELS, Progress, bench
from accel.cli import parse_plan_argument, positive
from accel.errors import AccelError
from accel.hardware import importable
from accel.workloads import model_names


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench", help="measure training steps of torchvision models: eager vs plans")
    parser.add_argument("--models", nargs="+", default=None,
                        help=f"torchvision model names, or 'tiny' (3x8x8 inputs); unset: {' '.join(DEFAULT_MODELS)}")
    parser.add_argument("--plans", nargs="+", default=["auto"],
                        help="plans to compare with eager: each a comma-separated list of accelerators, a plan file, "
                             "'auto' or 'eager'")
    parser.add_argument("--rounds", type=positive, default=3,
                        help="interleaved rounds: every plan measured once per round, in turn")
    parser.add_argument("--steps", type=positive, default=None,
                        help="timed steps per plan and round; unset: about 0.5 s worth, at least 1")
    parser.add_argument("--warmup", type=positive, default=2,
                        help="each plan's first steps, timed apart (compile's warm-up lands there)")
    parser.add_argument("--tune-budget", type=float, default=None,
                        help="seconds the 'auto' search may take per model; unset: the larger of 90 s and 100 of the "
                             "model's eager steps")
    parser.add_argument("--expected-steps", type=positive, default=None,
                        help="the run length 'auto' optimises for, warm-up included; unset: the steady step alone")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                        help="the optimizer every plan steps: Adam (lr 1e-3), or SGD (lr 0.01, momentum 0.9)")
    parser.add_argument("--batch-size", type=positive, default=16, help="images per training step")
    parser.add_argument("--image-size", type=positive, default=None,
                        help="height and width of the random images; unset: 224, or 8 when every model is 'tiny'")
    parser.add_argument("--full", action="store_true",
                        help=f"all models ({' '.join(MODELS)}): tens of minutes on 2 cores")
    parser.add_argument("--suite", choices=("tiny", "real"), default=None,
                        help="measure the workload zoo instead (BERT, GPT-2, ViT, timm, a detector, an LSTM, the seed "
                             "CNNs; needs transformers and timm): tiny configs, or real sizes")
    parser.add_argument("--device", default="cpu", help="the torch device every plan trains on: cpu, cuda, cuda:1, ...")
    parser.add_argument("--json", metavar="PATH", help="write the rows, machine and settings as JSON")
    parser.add_argument("--csv", metavar="PATH", help="write the rows as CSV")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG chart (needs matplotlib)")
    return parser


def run(args) -> int:
    models = args.models or (MODELS if args.full else DEFAULT_MODELS)
    known = model_names() if args.suite is None else models
    unknown = [m for m in models if m not in known]
    if unknown:  # before minutes of measuring
        hints = [m + "".join(f" (did you mean {h!r}?)" for h in difflib.get_close_matches(m, known, n=1))
                 for m in unknown]
        raise AccelError(f"unknown model(s): {', '.join(hints)}; torchvision.models.list_models() has them, and 'tiny'")
    plans = [p if p == "auto" else [] if p in ("eager", "baseline") else parse_plan_argument(p) for p in args.plans]
    if args.plot and not importable("matplotlib"):
        raise AccelError("--plot needs matplotlib: pip install 'accel[bench]'")
    image_size = args.image_size or (8 if set(models) == {"tiny"} else 224)  # tiny's CNN takes 3x8x8 images
    result = bench(models=models, plans=plans, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                   optimizer=args.optimizer, batch_size=args.batch_size, image_size=image_size,
                   device=args.device, progress=Progress(shown=True), tune_budget_s=args.tune_budget,
                   expected_steps=args.expected_steps, suite=args.suite)
    print(result)
    if args.json:
        result.to_json(args.json, indent=2)
    if args.csv:
        result.write_csv(args.csv)
    if args.plot:
        result.plot(args.plot)
    return 1 if any(r["status"] != "ok" for r in result.rows) else 0
