"""Chapter 7: mixed precision. The book's CNN on real digits in fp32, then through the `amp` accelerator:
dtype "auto" (bf16 where the CPU computes it natively: AVX512-BF16 or AMX, else skipped with the reason)
and fp16 (emulated on CPUs without AVX512-FP16/AMX-FP16, so expect it to be slow; a grad scaler comes with it).

    python examples/ch07_mixed_precision.py            # 3 epochs, batch 64
    python examples/ch07_mixed_precision.py --quick
"""
from __future__ import annotations

import warnings

from common import book_cnn, digits, loader_for, parser, print_table, train

VARIANTS = {
    "fp32 (baseline)": [],
    "amp auto": ["amp"],
    "amp float16": [{"amp": {"dtype": "float16"}}],
}


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--epochs", type=int, default=3)
    args_parser.add_argument("--batch-size", type=int, default=64)
    args = args_parser.parse_args(argv)
    epochs, limit = (1, 64) if args.quick else (args.epochs, None)
    train_set, test_set = digits(args.seed, limit)
    rows = []
    for name, plan in VARIANTS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the report keeps them; it is printed below
            result = train(book_cnn(args.seed), loader_for(train_set, args.batch_size, args.seed), plan=plan,
                           epochs=epochs, test_set=test_set)
        amp = [r for r in result["report"].rows if r.name == "amp"]
        dtype = "float32" if not amp or amp[0].status != "applied" else amp[0].changes["dtype"]
        rows.append({"variant": name, "dtype": dtype, **result})
        if amp:
            print(result["report"])
    print_table(f"Mixed precision, the book's CNN, {len(train_set)} real digits x {epochs} epochs, "
                f"batch {args.batch_size}",
                [("variant", "variant", "s"), ("dtype", "computes in", "s"), ("seconds", "train s", ".2f"),
                 ("step_ms", "ms/step", ".1f"), ("accuracy", "test acc", ".3f")],
                rows, baseline=rows[0], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
