"""Chapter 4: Intel Extension for PyTorch. The book's CNN on real digits, plain against the `ipex` accelerator
(ipex.optimize: prepacked weights, fused ops, its own fused optimizer step), in fp32 and in bf16 (IPEX's bf16
kernels with amp's bf16 autocast; only where the CPU computes bf16 natively).

IPEX was retired after 2.8 and needs torch 2.8.*: run this in an environment that has both, e.g.

    /work/venv-ipex/bin/python examples/ch04_ipex.py            # 3 epochs, batch 64
    /work/venv-ipex/bin/python examples/ch04_ipex.py --quick

Anywhere else it says why it cannot run and exits 0 (IPEX is never imported against the wrong torch: that
kills the process).
"""
from __future__ import annotations

import sys
import warnings

from common import book_cnn, digits, loader_for, missing, parser, print_table, train


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--epochs", type=int, default=3)
    args_parser.add_argument("--batch-size", type=int, default=64)
    args = args_parser.parse_args(argv)
    import accel
    from accel.hardware import ipex_problem

    why = ipex_problem()
    if why is not None:
        return missing(f"IPEX cannot run in this environment ({sys.prefix}): {why}",
                       "Run it with a torch 2.8 + intel-extension-for-pytorch 2.8 environment, e.g. "
                       "/work/venv-ipex/bin/python examples/ch04_ipex.py")
    variants = {"plain (baseline)": [], "ipex fp32": [{"ipex": {"dtype": "float32"}}]}
    if accel.probe().native_bf16:
        variants["ipex bf16 + amp"] = [{"amp": {"dtype": "bfloat16"}}, {"ipex": {"dtype": "bfloat16"}}]
    epochs, limit = (1, 64) if args.quick else (args.epochs, None)
    train_set, test_set = digits(args.seed, limit)
    rows = []
    for name, plan in variants.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the report keeps them
            result = train(book_cnn(args.seed), loader_for(train_set, args.batch_size, args.seed), plan=plan,
                           epochs=epochs, test_set=test_set)
        rows.append({"variant": name, **result})
        if plan:
            print(result["report"])
    print_table(f"IPEX, the book's CNN, {len(train_set)} real digits x {epochs} epochs, batch {args.batch_size}",
                [("variant", "variant", "s"), ("seconds", "train s", ".2f"), ("step_ms", "ms/step", ".1f"),
                 ("accuracy", "test acc", ".3f")], rows, baseline=rows[0], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
