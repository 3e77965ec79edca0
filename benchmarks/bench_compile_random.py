"""What torch._inductor.config.fallback_random costs: dropout under inductor with its own random numbers (the default)
against eager's (fallback_random=True, what compile sets through the run's journal), on a GPT-2 with dropout.

Inductor generates its own random numbers for dropout, so a compiled model's dropout masks differ from eager's and
its losses drift from the plain loop's (2e-3 on the first loss of a GPT-2 with dropout 0.1, where compile's card
allows 1e-4). fallback_random=True makes inductor call torch's own random ops: the same masks as eager. This
measures the steady step of both, interleaved in one process (each variant compiled once, in turn, with the flag
given to torch.compile as an inductor option), and the first loss of each against eager's.

    python benchmarks/bench_compile_random.py                      # GPT-2, 4 layers of width 256, batch 8 x 128
    python benchmarks/bench_compile_random.py --layers 12 --width 768 --rounds 7
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant per round")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    import transformers

    config = transformers.GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=max(1, args.width // 64),
                                     vocab_size=8192, n_positions=args.length, use_cache=False)  # dropout 0.1
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(config).to(args.device).train()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.length), device=args.device)

    def step(model, optimizer):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    variants = {}
    for name, flag in (("eager", None), ("inductor", False), ("inductor, fallback_random", True)):
        model = copy.deepcopy(base)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if flag is not None:  # the flag as inductor options: each variant compiles its own code
            model = torch.compile(model, options={"fallback_random": flag})
        torch.manual_seed(1)
        started = time.perf_counter()
        first = step(model, optimizer)
        variants[name] = {"model": model, "optimizer": optimizer, "first": first, "times": [],
                          "first_step_s": time.perf_counter() - started}
    for _ in range(args.rounds):  # interleaved, so a busy machine weighs on every variant alike
        for variant in variants.values():
            for _ in range(args.steps):
                started = time.perf_counter()
                step(variant["model"], variant["optimizer"])
                if args.device == "cuda":
                    torch.cuda.synchronize()
                variant["times"].append(time.perf_counter() - started)
    eager = variants["eager"]
    print(f"GPT-2 {args.layers} layers, width {args.width}, batch {args.batch} x {args.length}, {args.device}, "
          f"torch {torch.__version__}; {args.rounds} rounds of {args.steps} steps")
    print(f"{'variant':28} {'first step s':>12} {'steady ms (min-max of round medians)':>38} {'vs eager':>9} "
          f"{'first loss - eager':>19}")
    for name, variant in variants.items():
        rounds = [statistics.median(variant["times"][i:i + args.steps])
                  for i in range(0, len(variant["times"]), args.steps)]
        ratio = statistics.median(rounds) / statistics.median([statistics.median(eager["times"][i:i + args.steps])
                                                             for i in range(0, len(eager["times"]), args.steps)])
        print(f"{name:28} {variant['first_step_s']:12.1f} {statistics.median(rounds) * 1000:14.1f} "
              f"({min(rounds) * 1000:.1f}-{max(rounds) * 1000:.1f}){'':8} {ratio:9.3f} "
              f"{abs(variant['first'] - eager['first']):19.2e}")


if __name__ == "__main__":
    main()
