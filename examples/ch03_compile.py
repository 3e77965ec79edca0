"""Chapter 3: compiling the model. The book's CNN on real digits, eager against torch.compile through the
`compile` accelerator (default mode, then max-autotune-no-cudagraphs). Compilation lands on the first step,
so the table keeps the first step apart from the steady step time.

    python examples/ch03_compile.py            # 5 epochs, batch 64
    python examples/ch03_compile.py --quick    # a few steps with backend "eager" (inductor takes 20 s+ to start)
"""
from __future__ import annotations

from common import book_cnn, digits, isolated, loader_for, parser, print_table, train


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--epochs", type=int, default=5)
    args_parser.add_argument("--batch-size", type=int, default=64)
    args_parser.add_argument("--max-autotune", action="store_true",
                             help="also try mode=max-autotune-no-cudagraphs (slow to compile)")
    args_parser.add_argument("--backend", default=None, help="compile backend (default inductor; eager in --quick)")
    args = args_parser.parse_args(argv)
    epochs, limit = (1, 64) if args.quick else (args.epochs, None)
    backend = args.backend or ("eager" if args.quick else "inductor")
    train_set, test_set = digits(args.seed, limit)
    variants = {"eager (baseline)": [], f"compile ({backend})": [{"compile": {"backend": backend}}]}
    if args.max_autotune:
        variants["compile max-autotune"] = [{"compile": {"backend": backend, "mode": "max-autotune-no-cudagraphs"}}]
    rows, last = [], None
    for name, plan in variants.items():
        with isolated():
            result = train(book_cnn(args.seed), loader_for(train_set, args.batch_size, args.seed, drop_last=True),
                           plan=plan, epochs=epochs, test_set=test_set)
        rows.append({"variant": name, **result})
        last = result["report"]
    print(last)
    print_table(f"torch.compile, the book's CNN, {len(train_set)} real digits x {epochs} epochs, "
                f"batch {args.batch_size}",
                [("variant", "variant", "s"), ("seconds", "train s", ".2f"), ("first_step_s", "1st step s", ".2f"),
                 ("step_ms", "ms/step", ".2f"), ("accuracy", "test acc", ".3f")],
                rows, baseline=rows[0], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
