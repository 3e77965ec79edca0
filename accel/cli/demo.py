"""accel demo: torchvision's resnet18 on sklearn's real digits, the plain loop against plan="auto", side by side.

Both train in one process in turns (each with its own process settings), so the machine's load hits both alike; the
speed-up is the ratio of their paired turns with its interval, auto's measuring included.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

import accel
from accel.cli import parse_plan_argument, positive
from accel.errors import AccelError
from accel.hardware import importable
from accel.measure import Ratio, TrainStep, endless, round_order
from accel.workloads import accuracy, build_model, cifar_shaped, digits_datasets


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("demo", help="resnet18 on real digits: the plain loop against plan='auto'")
    parser.add_argument("--plan", default="auto",
                        help="'auto', comma-separated accelerator names, or a .toml/.yaml plan file")
    parser.add_argument("--model", default="resnet18", help="a torchvision model name")
    parser.add_argument("--epochs", type=positive, default=5, help="epochs each training runs")
    parser.add_argument("--batch-size", type=positive, default=64, help="images per training step")
    parser.add_argument("--image-size", type=positive, default=64, help="digits upsampled to this size")
    parser.add_argument("--turn", type=positive, default=7, help="steps each training takes in a turn")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds plan='auto' may measure in the loop; unset: at most 30%% of the plain run's time")
    parser.add_argument("--plot", default="accel-demo.png",
                        help="the chart of the comparison, written when matplotlib is installed")
    parser.add_argument("--no-plot", action="store_true", help="write no chart")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def next_run(tuning) -> str:
    """What a second run of the demo will do, as the cache says: only an established answer is kept."""
    if tuning is None:
        return "nothing was chosen, so a second run measures again"
    if tuning.from_cache:
        return f"the plan came from the cache, key {tuning.key[:12]}"
    if tuning.key:
        return f"cached under key {tuning.key[:12]}: a second run takes the plan from the cache at its first batch"
    return "not cached (the search was cut short or too noisy to be sure), so a second run measures again"


STEP = TrainStep()  # your loop's step: cross-entropy under run.autocast(), run.backward(loss), run.step()


class TurnClock:
    """The clock auto reads here (accel.clock): it runs only while the accelerated training takes its turn, so its
    chunks, rounds and budget are its own steps, never the plain loop's turns between them."""

    def __init__(self, now: Callable[[], float] = time.perf_counter):
        self.now, self.paused_s, self.since = now, 0.0, None

    def __call__(self) -> float:
        now = self.now()
        return now - self.paused_s - (now - self.since if self.since is not None else 0.0)

    def pause(self) -> None:  # twice in a row when the turns' order turns round: the first pause holds
        if self.since is None:
            self.since = self.now()

    def resume(self) -> None:
        if self.since is not None:
            self.paused_s, self.since = self.paused_s + self.now() - self.since, None


class Training:
    """One of the two trainings: its run, where it is in its epochs, its turns' seconds and steps."""

    def __init__(self, name: str, model_name: str, plan, image_size: int, batch_size: int):
        self.name, self.turn_s = name, []
        train_set, self.test_set = (cifar_shaped(d, image_size) for d in digits_datasets())
        torch.manual_seed(0)  # both trainings start from the same weights and batches
        model = build_model(model_name, classes=10)  # torchvision's, random weights, as accel bench builds
        loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, drop_last=True,
                            generator=torch.Generator().manual_seed(0))
        started = time.perf_counter()
        self.run = accel.accelerate(model, torch.optim.Adam(model.parameters(), lr=1e-3), loader, plan=plan,
                                    device="cpu")
        self.setup_s = time.perf_counter() - started
        self.run.model.train()
        self.batches = endless(self.run.loader)
        self.run.journal.suspend()  # its process settings apply only while it takes its turn

    def turn(self, steps: int, bar) -> None:
        """Train ``steps`` steps of your loop (epoch after epoch), timed whole."""
        self.run.journal.resume()
        started = time.perf_counter()
        for _ in range(steps):
            STEP(self.run, next(self.batches))
            bar.update()
        self.turn_s.append(time.perf_counter() - started)
        self.run.journal.suspend()

    def finish(self) -> dict:
        run, search = self.run, self.run.report.search  # auto's words; None for a plan given
        run.journal.resume()
        result = {"seconds": sum(self.turn_s), "setup_s": self.setup_s, "steps": run.steps, "turn_s": self.turn_s,
                  "accuracy": accuracy(run.model, self.test_set, run.autocast), "report": run.report,
                  "chosen_at": search and search.chosen_at, "settled_at": search and search.settled_at}
        run.close()
        return result


def run(args) -> int:
    if not importable("sklearn"):
        raise AccelError("trains on scikit-learn's bundled digits: pip install 'accel[demo]'")
    plan = parse_plan_argument(args.plan)
    per_epoch = len(digits_datasets()[0]) // args.batch_size  # the loader drops the last, partial batch
    total = args.epochs * per_epoch
    if plan == "auto":  # the run's length: compile (or another costly accelerator) must pay back within it
        plan = accel.Auto(budget_s=args.budget, expected_steps=total or None)
    else:
        accel.Plan(plan)  # a bad plan is refused before any training (main() prints the PlanError)
    began = time.perf_counter()
    bar = tqdm(total=2 * total, unit="step", file=sys.stderr, desc="loading torchvision and the digits", leave=False)
    import torchvision

    if args.model not in torchvision.models.list_models(module=torchvision.models):
        bar.close()
        raise AccelError(f"{args.model!r} is not a torchvision model")
    clock = TurnClock()
    with accel.clock.use(clock):
        sides = [Training("plain", args.model, [], args.image_size, args.batch_size),
                 Training("accelerated", args.model, plan, args.image_size, args.batch_size)]
        counts = [min(args.turn, total - done) for done in range(0, total, args.turn)]
        for index, steps in enumerate(counts):
            for side in round_order(sides, index, rotate=False):
                bar.set_description(f"{side.name}: turn {index + 1} of {len(counts)}" + (
                    f" (auto: {side.run.search.phase})" if hasattr(side.run, "search") else ""))
                clock.pause() if side is sides[0] else clock.resume()
                side.turn(steps, bar)
        bar.close()
        plain, accelerated = (side.finish() for side in sides)
    wall_s = time.perf_counter() - began  # the speed-up of each turn both took side by side: their step times' ratio
    ratio = Ratio([p / a for p, a in zip(plain["turn_s"], accelerated["turn_s"]) if a > 0])
    tuning = accelerated["report"].tuning
    told = tuning.settings.get("expected_steps") if tuning is not None else getattr(plan, "expected_steps", None)
    speedup = {"estimate": ratio.estimate, "low": ratio.low, "high": ratio.high, "turns": ratio.rounds,
               "noisy": ratio.noisy(), "totals": plain["seconds"] / accelerated["seconds"]}
    if args.json:
        print(json.dumps({"plain": {**plain, "report": plain["report"].to_dict()},
                          "accelerated": {**accelerated, "report": accelerated["report"].to_dict()},
                          "speedup": speedup, "expected_steps": told, "wall_s": wall_s}, default=str))
        return 0
    print(accelerated["report"])
    print()
    print(f"{args.model} on sklearn digits at {args.image_size}x{args.image_size}, batch {args.batch_size}, "
          f"{args.epochs} epochs ({total} steps each), trained in one process in {len(counts)} paired turns of up to "
          f"{args.turn} steps")
    print(f"{'':12} {'train s':>8} {'ms/step':>8} {'test acc':>9}")
    for name, result in (("plain", plain), ("accelerated", accelerated)):
        print(f"{name:12} {result['seconds']:8.2f} {1000 * result['seconds'] / result['steps']:8.1f} "
              f"{result['accuracy']:9.3f}")
    print(headline(ratio))
    if told is not None:
        print(f"plan='auto' was told the run's length: expected_steps={told} ({args.epochs} epoch"
              f"{'s' if args.epochs != 1 else ''} x {per_epoch} batches), so a costly accelerator (compile) is kept "
              "only if its warm-up pays back within them")
    if isinstance(plan, accel.Auto):  # a plan given searches nothing, so nothing is cached for a next run
        search = accelerated["report"].search
        chose = ("it was still measuring when the training ended: nothing was chosen" if search is None or
                 search.chosen is None else f"chose {'+'.join(search.chosen) or 'the plain loop'} (first verdict at "
                 f"step {search.chosen_at} of {accelerated['steps']})")
        print(f"auto: {chose}; {next_run(tuning)}")
    else:
        print(f"choosing the plan took {accelerated['setup_s']:.1f} s before training")
    if not args.no_plot and importable("matplotlib"):
        plot(args.plot, plain, accelerated, ratio, counts, args.model)
        print(f"chart: {args.plot}")
    print(f"total wall time {wall_s:.0f} s")
    return 0


SAME_SPEED = 0.05  # an interval within 5% of 1 on both sides: measured, and no faster


def verdict(ratio: Ratio) -> str:
    """faster, same (an interval narrow about 1), slower, or noisy (too wide to tell: one turn is always noisy)."""
    if ratio.above(1.0):
        return "faster"
    if 1 - SAME_SPEED <= ratio.low and ratio.high <= 1 + SAME_SPEED:
        return "same"
    return "slower" if ratio.below(1.0) else "noisy"


def headline(ratio: Ratio) -> str:
    """The speed-up with its interval; none, where the interval is narrow about 1; or plainly that the machine was
    too noisy to tell."""
    words = (f"{ratio.estimate:.2f}x ({ratio.low:.2f}-{ratio.high:.2f}, 90% interval over {ratio.rounds} paired "
             "turns)")
    return {"faster": f"speed-up: {words}: the plain loop's step over the accelerated one's in the same turns, auto's "
                      "measuring included",
            "same": f"no speed-up here: {words}; the two trainings ran at the same speed, within {SAME_SPEED:.0%}",
            "slower": f"slower: {words}: the accelerated training's step took longer than the plain loop's, in the "
                      "same turns",
            "noisy": f"the machine was too noisy for a verdict: the speed-up read {words}, and that could be none at "
                     "all (run it again when the machine is quieter)"}[verdict(ratio)]


def plot(path: str, plain: dict, accelerated: dict, ratio: Ratio, counts: list[int], model: str) -> None:
    """Each turn's step, both ways, and (when auto measured candidates) each candidate's step against the plain
    loop's with its interval, the chosen one marked; no empty panel, nothing cut."""
    import matplotlib  # optional (pip install 'accel[demo]'): the chart is drawn only where it is installed

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tuning = accelerated["report"].tuning
    rows = [r for r in (tuning.rows[1:] if tuning is not None else []) if r.vs_baseline is not None and r.ratio]
    fig, axes = plt.subplots(1, 2 if rows else 1, figsize=(13 if rows else 7, max(4.2, 0.5 * len(rows) + 2)),
                             constrained_layout=True, squeeze=False)
    steps = list(itertools.accumulate(counts))
    left = axes[0][0]
    for result, color in ((plain, "grey"), (accelerated, "tab:green")):
        left.plot(steps, [1000 * s / n for s, n in zip(result["turn_s"], counts)], "o-", color=color,
                  label=f"{'plain loop' if result is plain else 'plan=auto'}: {result['seconds']:.1f} s in all, "
                        f"test accuracy {result['accuracy']:.3f}")
    search = accelerated["report"].search
    chosen = None if search is None or search.chosen is None else "+".join(search.chosen) or "the plain loop kept"
    if accelerated["chosen_at"]:
        left.axvline(accelerated["chosen_at"], color="tab:green", linestyle=":",
                     label=f"auto's first verdict (step {accelerated['chosen_at']}): {chosen}")
    left.set_xlabel("training step (end of each turn)")
    left.set_ylabel("ms per step in the turn")
    left.set_ylim(bottom=0)
    fig.legend(*left.get_legend_handles_labels(), loc="outside lower left", fontsize=8)  # never over the data
    left.set_title("each turn, both trainings in one process", fontsize=10)
    if rows:
        right, names = axes[0][1], []
        for y, row in enumerate(reversed(rows)):  # one bar a candidate, its interval scaled to its step time
            scale = row.vs_baseline / row.ratio["estimate"]
            low, high = ((row.ratio[end] or row.ratio["estimate"]) * scale for end in ("low", "high"))
            mark = row.plan == tuning.plan.to_dict()
            names.append(f"{row.name}{'  (chosen)' if mark else ''}\n{row.vs_baseline:.2f} ({low:.2f}-{high:.2f})")
            right.barh(y, row.vs_baseline, height=0.6, xerr=[[max(row.vs_baseline - low, 0)],
                       [max(high - row.vs_baseline, 0)]], color="tab:orange" if mark else "tab:blue", capsize=3)
        right.set_yticks(range(len(rows)), names, fontsize=8)
        right.set_ylim(-0.8, len(rows) - 0.2)  # one candidate is one bar, not a wall
        right.axvline(1.0, color="grey", linestyle="--")
        right.set_xlabel("step time over the plain loop's (90% interval; below 1 is faster)")
        right.set_title("what plan='auto' measured in the loop", fontsize=10)
    words = {"faster": "{:.2f}x faster", "same": "no speed-up: {:.2f}x", "slower": "slower: {:.2f}x",
             "noisy": "too noisy for a verdict: {:.2f}x"}[verdict(ratio)].format(ratio.estimate)
    verdict_line = f"{words} ({ratio.low:.2f}-{ratio.high:.2f}, 90%)"
    fig.suptitle(f"{model} on sklearn digits: the plain loop against plan='auto' ({chosen or 'nothing chosen'}), "
                 f"trained in turns in one process\n{verdict_line}", fontsize=11)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
