"""accel bench: the seed benchmark (torchvision CNNs, training step with Adam, batch 16 at 224x224), eager vs plans,
each measured in its own fresh process. The default finishes in about five minutes on 2 cores; --full runs the table."""
from __future__ import annotations

import argparse
import sys

from accel.cli.demo import parse_plan_argument

def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    from accel.bench import DEFAULT_MODELS, MODELS

    parser = subparsers.add_parser("bench", help="measure training steps of torchvision models: eager vs plans")
    parser.add_argument("--models", nargs="+", default=None,
                        help=f"torchvision model names, or 'tiny' (default: {' '.join(DEFAULT_MODELS)})")
    parser.add_argument("--plans", nargs="+", default=["auto"],
                        help="plans to compare with eager: each a comma-separated list of accelerators, a plan file, "
                             "or 'auto' (default: auto)")
    parser.add_argument("--steps", type=positive, default=None,
                        help="measured steps per run (default 3; 10 with --full)")
    parser.add_argument("--warmup", type=int, default=1, help="steps run before measuring, timed apart")
    parser.add_argument("--tune-budget", type=float, default=None,
                        help="seconds the 'auto' search may take per model (default 40; 120, tune's own, with --full)")
    parser.add_argument("--rounds", type=positive, default=1,
                        help="measure every plan this many times, alternating with the others; steps are pooled")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--batch-size", type=positive, default=16)
    parser.add_argument("--image-size", type=positive, default=224)
    parser.add_argument("--full", action="store_true",
                        help=f"all models ({' '.join(MODELS)}) and 10 steps: tens of minutes on 2 cores")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", metavar="PATH", help="write the rows, machine and settings as JSON")
    parser.add_argument("--csv", metavar="PATH", help="write the rows as CSV")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG chart (needs matplotlib)")
    return parser


def run(args) -> int:
    from accel.bench import DEFAULT_MODELS, MODELS, bench
    from accel.errors import PlanError

    models = args.models or (MODELS if args.full else DEFAULT_MODELS)
    steps = args.steps or (10 if args.full else 3)
    plans = [p if p == "auto" else [] if p in ("eager", "baseline") else parse_plan_argument(p) for p in args.plans]
    from accel.hardware import importable

    if args.plot and not importable("matplotlib"):  # say so before minutes of measuring, not after
        print("accel bench: --plot needs matplotlib: pip install 'accel[bench]'", file=sys.stderr)
        return 2
    try:
        result = bench(models=models, plans=plans, steps=steps, warmup=args.warmup, optimizer=args.optimizer,
                       batch_size=args.batch_size, image_size=args.image_size, device=args.device, progress=True,
                       tune_budget_s=args.tune_budget or (120.0 if args.full else 40.0), rounds=args.rounds)
    except PlanError as error:  # a misspelt plan fails before anything is measured
        print(f"accel bench: {error}", file=sys.stderr)
        return 2
    print(result)
    if args.json:
        result.to_json(args.json, indent=2)
    if args.csv:
        result.write_csv(args.csv)
    if args.plot:
        result.plot(args.plot)
    return 1 if any(r["status"] != "ok" for r in result.rows) else 0
