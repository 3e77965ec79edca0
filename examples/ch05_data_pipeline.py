"""Chapter 5: an efficient data pipeline. The book's heavy seven-transform pipeline (Resize 255, CenterCrop 224,
RandomHorizontalFlip, RandomRotation 20, GaussianBlur 3, ToTensor, Normalize) on torchvision's FakeData
images, feeding a small CNN, so the time goes into loading. Baseline: the loader as written (no workers);
accelerated: the `loader` accelerator with worker processes and pinned memory (pinning only matters where
batches cross a bus to a GPU; on a CPU the report says it was ignored and why).

    python examples/ch05_data_pipeline.py                 # 512 images, batch 32, 2 workers
    python examples/ch05_data_pipeline.py --workers 1,2,3 # several worker counts
    python examples/ch05_data_pipeline.py --quick
"""
from __future__ import annotations

import warnings

import torch
from common import isolated, parser, print_table, train
from torch import nn
from torch.utils.data import DataLoader


def heavy_pipeline():
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(255), transforms.CenterCrop(224), transforms.RandomHorizontalFlip(),
        transforms.RandomRotation(20), transforms.GaussianBlur(3), transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])


def small_cnn(seed: int = 0) -> nn.Module:
    """Cheap on 224x224 inputs, so the pipeline, not the model, sets the pace."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(8 * 16, 10))


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--samples", type=int, default=512)
    args_parser.add_argument("--batch-size", type=int, default=32)
    args_parser.add_argument("--image-size", type=int, default=256, help="FakeData image side before Resize 255")
    args_parser.add_argument("--workers", default="2", help="comma-separated worker counts to try")
    args = args_parser.parse_args(argv)
    from torchvision.datasets import FakeData

    samples, size = (16, 64) if args.quick else (args.samples, args.image_size)
    dataset = FakeData(size=samples, image_size=(3, size, size), num_classes=10, transform=heavy_pipeline(),
                       random_offset=args.seed)
    rows = []
    for workers in [0, *(int(w) for w in args.workers.split(","))]:
        plan = [] if workers == 0 else [{"loader": {"num_workers": workers, "pin_memory": True}}]
        loader = DataLoader(dataset, batch_size=args.batch_size if not args.quick else 8, shuffle=True,
                            generator=torch.Generator().manual_seed(args.seed))
        with isolated(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the report keeps them
            result = train(small_cnn(args.seed), loader, plan=plan, epochs=1)
        rows.append({"variant": "as written (baseline)" if workers == 0 else f"loader: {workers} workers + pin",
                     "workers": workers, **result})
        if plan:
            print(result["report"])
    print_table(f"Data pipeline: 7 transforms on {samples} FakeData images {size}x{size} -> 224x224, batch "
                f"{loader.batch_size}, 1 epoch", [("variant", "variant", "s"), ("seconds", "epoch s", ".2f"),
                                                  ("samples_per_s", "samples/s", ".0f")],
                rows, baseline=rows[0], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
