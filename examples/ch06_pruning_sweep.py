"""Chapter 6: simplifying the model. A sweep of L1-norm structured pruning over the book's CNN's convolutions,
from 10% to 80% sparsity, through the `prune` accelerator (NNI's pruner, then ModelSpeedup so the layers
really shrink). Each model trains a few warm-up steps, is pruned, then trains on; the table gives the
parameters left, the step time and the test accuracy on real digits against the unpruned baseline.

    python examples/ch06_pruning_sweep.py            # ratios 0.1..0.8, 3 epochs each
    python examples/ch06_pruning_sweep.py --quick
"""
from __future__ import annotations

import warnings

from common import book_cnn, digits, loader_for, missing, parser, print_table, train


def prune_plan(ratio: float, warmup_steps: int, dummy_input) -> list:
    return [{"prune": {"pruner": "l1", "config_list": [{"op_types": ["Conv2d"], "sparse_ratio": ratio}],
                       "warmup_steps": warmup_steps, "dummy_input": dummy_input}}]


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--ratios", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8")
    args_parser.add_argument("--epochs", type=int, default=3)
    args_parser.add_argument("--batch-size", type=int, default=64)
    args_parser.add_argument("--warmup-steps", type=int, default=10, help="training steps before pruning")
    args = args_parser.parse_args(argv)
    import accel

    if "prune" not in accel.Plan.parse(["prune"])[0].names():
        return missing("this accel has no 'prune' accelerator (accel/accelerators/prune.py)",
                       "It arrives with issue 'prune'; nothing to show until then.")
    from accel.hardware import package_version

    if package_version("nni") is None:
        return missing("NNI is not installed", "pip install 'accel[prune]' (nni==3.0) and run again.")
    ratios = [float(r) for r in args.ratios.split(",")]
    epochs, limit, warmup = args.epochs, None, args.warmup_steps
    if args.quick:
        ratios, epochs, limit, warmup = [0.5], 1, 64, 1
    train_set, test_set = digits(args.seed, limit)
    dummy = train_set.tensors[0][:1]
    rows = []
    model = book_cnn(args.seed)  # the same warm-up steps as the pruned models, then a fresh optimizer as after pruning
    train(model, loader_for(train_set, args.batch_size, args.seed), plan=[], max_steps=warmup)
    baseline = train(model, loader_for(train_set, args.batch_size, args.seed), plan=[], epochs=epochs,
                     test_set=test_set)
    params = sum(p.numel() for p in baseline["run"].model.parameters())
    rows.append({"variant": "unpruned (baseline)", "parameters": params, "kept": 1.0, **baseline})
    for ratio in ratios:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NNI's deprecation noise; accel's own warnings are in the report
            result = train(book_cnn(args.seed), loader_for(train_set, args.batch_size, args.seed),
                           plan=prune_plan(ratio, warmup, dummy), epochs=epochs, test_set=test_set)
        changes = result["report"].row("prune").changes
        rows.append({"variant": f"conv sparsity {ratio:.0%}", "parameters": changes["parameters_after"],
                     "kept": changes["parameters_after"] / changes["parameters_before"], **result})
    print(result["report"])
    print_table(f"Pruning sweep (L1, Conv2d), the book's CNN, {len(train_set)} real digits x {epochs} epochs after "
                f"{warmup} warm-up steps, batch {args.batch_size}",
                [("variant", "variant", "s"), ("parameters", "parameters", ",d"), ("kept", "kept", ".2f"),
                 ("step_ms", "ms/step", ".1f"), ("seconds", "train s", ".2f"), ("accuracy", "test acc", ".3f")],
                rows, baseline=rows[0], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
