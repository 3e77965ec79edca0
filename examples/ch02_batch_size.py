"""Chapter 2: the batch-size effect. The book's CNN trained on real digits for the same number of epochs with
growing batches: fewer, larger steps use the cores better (higher samples/s) but fewer updates per epoch can
cost accuracy unless the learning rate follows.

    python examples/ch02_batch_size.py            # batch 16, 32, 64, 128, 256; 3 epochs each
    python examples/ch02_batch_size.py --quick    # seconds; for the smoke test
"""
from __future__ import annotations

from common import book_cnn, digits, loader_for, parser, print_table, train


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--batch-sizes", default="16,32,64,128,256")
    args_parser.add_argument("--epochs", type=int, default=3)
    args = args_parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    epochs, limit = args.epochs, None
    if args.quick:
        sizes, epochs, limit = sizes[:2], 1, 64
    train_set, test_set = digits(args.seed, limit)
    rows = []
    for size in sizes:
        result = train(book_cnn(args.seed), loader_for(train_set, size, args.seed), plan=[], epochs=epochs,
                       test_set=test_set)
        rows.append({"batch": size, **result})
    print_table(f"Batch size, the book's CNN, {len(train_set)} real digits x {epochs} epochs (plain PyTorch loop)",
                [("batch", "batch size", "d"), ("steps", "steps", "d"), ("seconds", "train s", ".2f"),
                 ("step_ms", "ms/step", ".1f"), ("samples_per_s", "samples/s", ".0f"), ("accuracy", "test acc", ".3f")],
                rows, baseline=rows[0], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
