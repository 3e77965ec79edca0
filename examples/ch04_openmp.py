"""Chapter 4: OpenMP. The same training (the book's CNN on real digits) in fresh processes, because OpenMP reads
its settings when the runtime loads:
  1. as started: GNU OpenMP (torch's own libgomp), no variables set;
  2. the `threads` accelerator: threads = physical cores, pinned, in the running process;
  3. `accel launch`: the rank pinned and OMP_NUM_THREADS set before torch loads;
  4. `accel launch --iomp`: Intel OpenMP preloaded, with KMP_AFFINITY and KMP_BLOCKTIME=1 (needs
     `pip install intel-openmp`; the row says so when it is missing).

    python examples/ch04_openmp.py            # 3 epochs each
    python examples/ch04_openmp.py --quick
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from common import (
    book_cnn,
    collect,
    digits,
    emit,
    environ_with,
    free_port,
    loader_for,
    parser,
    print_table,
    train,
    worker_flag,
)

OPENMP_PREFIXES = ("OMP_", "KMP_", "GOMP_")


def worker(args) -> int:
    """One variant in this process: train and print the result for the parent."""
    import accel

    train_set, test_set = digits(args.seed, 64 if args.quick else None)
    result = train(book_cnn(args.seed), loader_for(train_set, args.batch_size, args.seed), plan=json.loads(args.plan),
                   epochs=1 if args.quick else args.epochs, test_set=test_set)
    print(result["report"])
    emit({**result, "openmp": accel.probe().openmp, "threads": __import__("torch").get_num_threads()})
    return 0


def variant(name: str, command: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    results = collect(done.stdout)
    if done.returncode != 0 or not results:
        why = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit {done.returncode}"]
        print(f"--- {name}: failed ---\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return {"variant": name, "openmp": "n/a: " + why[0][:100]}
    print(f"--- {name} ---\n" + "\n".join(line for line in done.stdout.splitlines()
                                         if line.startswith(("accel", "steps", "thr"))))
    return {"variant": name, **results[0]}


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--epochs", type=int, default=3)
    args_parser.add_argument("--batch-size", type=int, default=64)
    worker_flag(args_parser)
    args_parser.add_argument("--plan", default="[]", help="the plan of a --worker run (JSON)")
    args = args_parser.parse_args(argv)
    if args.worker:
        return worker(args)
    me = str(Path(__file__).resolve())
    common_args = ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--seed", str(args.seed)]
    common_args += ["--quick"] if args.quick else []
    clean = {k: v for k, v in environ_with().items() if not k.startswith(OPENMP_PREFIXES) and k != "LD_PRELOAD"}

    def launch(*flags: str) -> list[str]:
        return [sys.executable, "-m", "accel", "launch", "--nproc-per-node", "1", "--master-port", str(free_port()),
                *flags, me, "--worker", *common_args]

    rows = [variant("as started (baseline)", [sys.executable, me, "--worker", *common_args], clean)]
    if not args.quick:  # --quick checks both ways of starting; the threads row is the baseline's code path
        rows.append(variant("threads accelerator", [sys.executable, me, "--worker", "--plan", '["threads"]',
                                                    *common_args], clean))
    rows.append(variant("accel launch (GNU vars)", launch(), clean))
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.exists():
        rows.append(variant("accel launch --iomp", launch("--iomp"), clean))
    else:
        rows.append({"variant": "accel launch --iomp", "openmp": f"skipped: no {iomp} (pip install intel-openmp)"})
    print_table("OpenMP settings, the book's CNN on real digits, one fresh process per row",
                [("variant", "variant", "s"), ("openmp", "OpenMP", "s"), ("threads", "threads", "d"),
                 ("seconds", "train s", ".2f"), ("step_ms", "ms/step", ".1f"), ("accuracy", "test acc", ".3f")],
                rows, baseline=rows[0], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
