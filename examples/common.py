"""What the chapter examples share: the book's CNN, real digits shaped like CIFAR images, one training
function, table printing and the --quick argument.

Every example trains through accel's public API only: `accel.accelerate(model, optimizer, loader, plan)`,
then run.model / run.loader / run.autocast / run.backward / run.step / run.report. The baseline is the same
call with an empty plan, which is the plain PyTorch loop (nothing is wrapped or changed).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing accel
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import accel  # noqa: E402
from accel.testing import process_state_restored  # noqa: E402
from accel.workloads import BookCNN, cifar_shaped, digits_datasets  # noqa: E402

RESULT_MARK = "EXAMPLE-RESULT "  # a child process prints its result as one JSON line after this mark


def book_cnn(seed: int = 0) -> BookCNN:
    torch.manual_seed(seed)
    return BookCNN()


def digits(seed: int = 0, limit: int | None = None) -> tuple[TensorDataset, TensorDataset]:
    """Real train/test digits as 3x32x32 images; `limit` keeps the first N training samples (quick mode)."""
    train, test = (cifar_shaped(d) for d in digits_datasets(seed))
    if limit is not None:
        train = TensorDataset(*(t[:limit] for t in train.tensors))
    return train, test


def loader_for(dataset, batch_size: int, seed: int = 0, **kwargs) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed),
                      **kwargs)


@torch.no_grad()
def accuracy(run: accel.Run, dataset: TensorDataset, batch_size: int = 512) -> float:
    """Test accuracy of the run's model, under the run's autocast, with inputs on the run's device."""
    model = run.model
    model.eval()
    correct = 0
    images, labels = dataset.tensors
    for start in range(0, len(labels), batch_size):
        x = images[start:start + batch_size].to(run.device)
        with run.autocast():
            correct += (model(x).argmax(1).cpu() == labels[start:start + batch_size]).sum().item()
    model.train()
    return correct / len(labels)


def train(model: nn.Module, loader, plan, epochs: int = 1, lr: float = 0.003, test_set=None, device="cpu",
          max_steps: int | None = None, optimizer=None) -> dict:
    """Accelerate with `plan`, train, and return time, step times, accuracy and the report.

    `seconds` is the wall time of the whole loop (the first step's compile or warm-up included);
    `step_ms` is the report's steady median step (the first step left out).
    """
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    run = accel.accelerate(model, optimizer, loader, plan=plan, device=device)
    steps, losses = 0, []
    started = time.perf_counter()
    run.model.train()
    for _ in range(epochs):
        for x, y in run.loader:
            with run.autocast():
                loss = nn.functional.cross_entropy(run.model(x), y)
            run.backward(loss)
            run.step()
            losses.append(loss.item())
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        if max_steps is not None and steps >= max_steps:
            break
    seconds = time.perf_counter() - started
    timing = run.report.timing()
    result = {"seconds": seconds, "steps": steps, "step_ms": timing.get("steady_median_ms"),
              "first_step_s": timing.get("first_step_s"), "loss": losses[-1] if losses else None,
              "samples_per_s": steps * (loader.batch_size or 1) / seconds if seconds else None,
              "report": run.report, "run": run}
    if test_set is not None:
        result["accuracy"] = accuracy(run, test_set)
    return result


def isolated():
    """Put back the thread count, CPU affinity and environment an accelerator (threads) changes, between variants."""
    return process_state_restored()


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments every example takes: --quick (seconds, for the smoke test) and --seed."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a few steps on a few samples: checks it runs, numbers mean nothing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="also print the table's rows as one JSON line")
    return p


def fmt(value, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return format(value, spec)
    return str(value)


def print_table(title: str, columns: list[tuple[str, str, str]], rows: list[dict], baseline: dict | None = None,
                json_out: bool = False) -> None:
    """Print rows as the book prints its results: one line per variant, a speed-up against the baseline.

    columns: (key, header, format spec). A "speedup" column is added when a baseline row with "seconds" is given.
    """
    if baseline is not None and "seconds" in baseline:
        for row in rows:
            if row.get("seconds"):
                row["speedup"] = baseline["seconds"] / row["seconds"]
        columns = [*columns, ("speedup", "speed-up", ".2f")]
    cells = [[header for _, header, _ in columns]]
    cells += [[fmt(row.get(key), spec) for key, _, spec in columns] for row in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    print(f"\n{title}")
    for i, line in enumerate(cells):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"({hardware_line()}; timings on a shared machine are noisy)")
    if json_out:
        print(json.dumps([{k: v for k, v in r.items() if isinstance(v, (int, float, str, type(None)))} for r in rows]))


def hardware_line() -> str:
    hw = accel.probe()
    return (f"{hw.physical_cores} cores of {hw.cpu_model.strip()}, torch {torch.__version__.split('+')[0]}, "
            f"{torch.get_num_threads()} threads")


def emit(result: dict) -> None:
    """For child processes: print the result where the parent finds it."""
    print(RESULT_MARK + json.dumps({k: v for k, v in result.items() if isinstance(v, (int, float, str, type(None)))}),
          flush=True)


def collect(output: str) -> list[dict]:
    """The results child processes printed with emit()."""
    return [json.loads(line[len(RESULT_MARK):]) for line in output.splitlines() if line.startswith(RESULT_MARK)]


def missing(what: str, how: str) -> int:
    """Explain why an example cannot run here, and exit 0: a missing feature is not a failure of the example."""
    print(f"SKIPPED: {what}\n{how}")
    return 0


def free_port() -> int:
    """A free TCP port on loopback for a launch's master (other jobs on the machine may hold 29500)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_flag(p: argparse.ArgumentParser) -> None:
    """--worker: the parent example starts this file again, in a fresh or launched process, to run one variant."""
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def environ_with(**values: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(values)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env
