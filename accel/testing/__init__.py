"""Testing an accelerator (docs/contract.md, "Testing an accelerator"): check_equivalence trains the same user code
with and without a plan and compares what was trained; apply_one applies one accelerator alone to tiny real objects
and says what changed.

    with accel.testing.process_state_restored():
        result = accel.testing.apply_one(MyAccelerator(level=2))
    assert result.row.status == "applied"

What a plan may change is the union of its applied accelerators' cards (``Accelerator.keeps``). Always checked: the
user's objects and the process unchanged by accelerate(), the same batches, outputs' structure, parameter names,
flags and ties, frozen parameters; by the card, the weights, optimizer state and losses (exact, float, tolerance, or
changed). The parts: trace.py (the user's code, what one training of it records), comparison.py (two, by a card).
"""
from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from accel import randomness
from accel.api import decide
from accel.errors import AccelerateError, PlanError
from accel.measure import TrainStep
from accel.plan import Plan, same_options
from accel.plan.contract import EXACT, REGISTRY, Accelerator, Keeps
from accel.run import Run
from accel.run.device_loader import release_workers
from accel.run.journal import pin_process
from accel.run.report import Row
from accel.search import accelerate
from accel.testing.comparison import combined, compare, declares_training, distance
from accel.testing.snapshots import Snapshot, snapshot
from accel.testing.trace import Held, Loop, Setup, Trace, global_hooks, process_state, remove_hooks_since, trained
from accel.workloads import NormCNN, digits_datasets, tiny_loader, tiny_model, tiny_optimizer

__all__ = ["Applied", "Equivalence", "Held", "Loop", "Setup", "Snapshot", "apply_one", "check_equivalence",
           "process_state_restored", "snapshot", "tiny_loader", "tiny_model", "tiny_optimizer", "tiny_setup",
           "train_steps"]


def train_steps(run: Run, epochs: int = 1, loss_fn=nn.functional.cross_entropy) -> list[float]:
    """The training loop from the README, over run.loader; returns the losses."""
    step = TrainStep(loss_fn=loss_fn)
    run.model.train()
    return [step(run, batch).item() for _ in range(epochs) for batch in run.loader]


def tiny_setup(seed: int = 0) -> Setup:
    """A user's code in miniature, for check_equivalence(plan, tiny_setup): a CNN with BatchNorm, Adam, and 96 of
    sklearn's real digits in batches of 16, built the same from the same seed every time."""
    torch.manual_seed(seed)
    model = NormCNN()
    images, labels = digits_datasets(seed=0)[0].tensors
    loader = DataLoader(TensorDataset(images[:96], labels[:96]), batch_size=16)
    return Setup(model, torch.optim.Adam(model.parameters(), lr=0.01), loader)


@dataclass
class Applied:
    run: Run
    row: Row
    changed: list[str]  # what the accelerator changed, from the user's objects to the run's


def apply_one(accelerator: Accelerator, model: nn.Module | None = None, optimizer=None, loader=None,
              device: str = "cpu") -> Applied:
    """Apply one accelerator alone to tiny real objects (or yours) and list what it changed."""
    model = model if model is not None else tiny_model()
    optimizer = optimizer if optimizer is not None else tiny_optimizer(model)
    loader = loader if loader is not None else tiny_loader()
    before = snapshot(model, optimizer, loader)
    run = accelerate(model, optimizer, loader, plan=[accelerator], device=device)
    after = snapshot(run.unwrap(), run.optimizer, getattr(run.loader, "loader", None))
    after.model_id = id(run.model)
    return Applied(run, run.report.row(accelerator.name), before.changes(after))


@contextlib.contextmanager
def process_state_restored() -> Iterator[None]:
    """Undo process-wide settings (threads, affinity, environment) an accelerator may change, and remove torch's
    process-wide hooks registered meanwhile, each said in a warning (a leaked one runs in every later model)."""
    threads = torch.get_num_threads()
    environ = dict(os.environ)
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    hooks = global_hooks()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environ)
        if affinity is not None:
            pin_process(tuple(affinity))
        remove_hooks_since(hooks)


@dataclass
class Equivalence:
    """The verdict: what the plan changed beyond its cards, and whether it touched the user's objects."""

    plan: list[str]
    keeps: Keeps = EXACT
    applied: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    stale: dict[str, str] = field(default_factory=dict)  # what the report named stale (the user's model/optimizer)
    idle: dict[str, str] = field(default_factory=dict)  # applied, then bypassed by the loop: why (accel/run/watch.py)
    refused: str | None = None  # a PlanError: refused up front
    failed: str | None = None  # an AccelerateError: failed while applying, rolled back
    differences: list[str] = field(default_factory=list)
    objects_changed: list[str] = field(default_factory=list)
    process_changed: bool = False
    amplified: float = 0.0  # how far the plain loop nudged at the last bit ended from itself, where that covered

    @property
    def ok(self) -> bool:
        return not self.differences and not self.objects_changed and not self.process_changed and not self.failed

    def __str__(self) -> str:
        head = f"plan {self.plan}: " + ("refused" if self.refused else "failed" if self.failed
                                        else f"applied {self.applied}")
        lines = [head + (f", keeps {self.keeps.weights}" if not self.refused else "")]
        lines += [f"  idle: {name}: {why}" for name, why in self.idle.items()]
        if self.amplified:
            lines.append(f"  the loop amplifies last-bit differences to a distance of {self.amplified:.3g} by itself: "
                         "float-order differences within it are not the plan's")
        lines += [f"  difference: {d}" for d in self.differences]
        lines += [f"  your objects changed: {c}" for c in self.objects_changed]
        if self.process_changed:
            lines.append("  the process (threads, environment, affinity) was not put back")
        lines += ["  " + text.replace("\n", "\n  ") for text in (self.refused, self.failed) if text]
        return "\n".join(lines)


def draws_random_numbers(loader: DataLoader) -> bool:
    """Whether the dataset or collate_fn draws random numbers from the process's random states for a sample: one
    sample is fetched and collated here, every random state kept. Only on the reference's own objects: it reads the
    dataset in this process (a file it opens lazily stays open), which accel never does to a user's."""
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        return False
    with randomness.kept():
        before = randomness.rng_state()
        try:
            item = dataset[0]
            loader.collate_fn([item] if loader.batch_sampler is not None else item)
        except Exception:  # noqa: BLE001 (a dataset indexed otherwise: nothing known, nothing claimed)
            return False
        return not same_options(before, randomness.rng_state())


def in_reference(plan: Any, setup: Setup, device: Any) -> list[dict[str, Any]]:
    """The plan's accelerators that the plain reference runs too (see check_equivalence); and the loader, with
    the workers the plan decides, where the setup's dataset draws random numbers (its row declares the draws)."""
    try:
        entries = Plan(plan).to_dict()
    except PlanError:
        return []  # the accelerated run reports it
    kept = [{name: options} for name, options in entries.items()
            if name in REGISTRY and declares_training(REGISTRY[name].keeps)]
    if "loader" in entries and isinstance(setup.loader, DataLoader) and draws_random_numbers(setup.loader):
        try:
            workers = decide(setup.model, setup.optimizer, setup.loader, plan, device=device).workers
        except PlanError:
            return kept
        kept.append({"loader": {**entries["loader"], "num_workers": workers}})
    return kept


def built(build: Callable[[], Setup]) -> Setup:
    """The user's objects as the loop has them before accelerate(): wrapped (compiled, streamed), prepared."""
    setup = build()
    setup.model, setup.loader = setup.loop.wrap(setup.model, setup.loader)
    setup.loop.prepare(setup.held())
    return setup


def plain_run(setup: Setup, plan: Any, device: Any) -> Any:
    """The reference: the plain loop, with what of the plan changes the training itself (in_reference)."""
    try:
        return accelerate(setup.model, setup.optimizer, setup.loader, plan=in_reference(plan, setup, device),
                          device=device)
    except PlanError:  # (no optimizer for grad_accumulation, say): the plan below is refused for it, as it should
        return accelerate(setup.model, setup.optimizer, setup.loader, plan=[], device=device)


def loop_amplification(build: Callable[[], Setup], plan: Any, steps: int, seed: int, device: Any,
                       expected: Trace) -> float:
    """How far the plain loop ends from its own run when nudged at the last bit, up or down, the weights once or every
    gradient: a loop in a fast phase of an adaptive optimizer grows a last-bit difference past any card by itself, so a
    plan's float-order differences there are judged against the farthest of these four (where the loop is calm, about
    zero). One nudge is not enough: where the loop is chaotic, where it ends varies fivefold with the nudge."""
    farthest = 0.0
    for every_gradient, toward in itertools.product((False, True), (float("inf"), float("-inf"))):
        setup = built(build)
        params = [p for p in setup.model.parameters() if p.is_floating_point()]
        with torch.no_grad():
            for p in params if not every_gradient else ():
                p.copy_(torch.nextafter(p, p.new_tensor(toward)))
        handles = [p.register_hook(lambda grad, toward=toward: torch.nextafter(grad, grad.new_tensor(toward)))
                   for p in params if every_gradient and p.requires_grad]
        try:
            nudged = trained(plain_run(setup, plan, device), setup, steps, seed)
        finally:
            for handle in handles:
                handle.remove()
        farthest = max(farthest, apart(expected, nudged))
    return farthest


def apart(one: Trace, other: Trace) -> float:
    """The largest relative distance of two trainings' tensors: the model's, the user's objects', the loop's own."""
    return max(distance(one.state, other.state), distance(one.user, other.user),
               distance(one.observed, other.observed))


FLOAT_ORDER = ("beyond the float card", "losses: mean")  # the differences float order can make


def check_equivalence(plan: Any, build: Callable[[], Setup], steps: int = 3, seed: int = 0,
                      device: Any = "cpu") -> Equivalence:
    """Train `steps` batches of build()'s objects plainly and through the plan; return what differs. A plan refused
    up front is valid if nothing was touched; accelerators that change the training itself and keep the structure
    run in the reference too, so the rest of the plan is held to its own cards."""
    reference = built(build)
    expected = trained(plain_run(reference, plan, device), reference, steps, seed)
    setup = built(build)
    before, process = snapshot(setup.model, setup.optimizer, setup.loader), process_state()
    try:
        run = accelerate(setup.model, setup.optimizer, setup.loader, plan=plan, device=device)
    except (PlanError, AccelerateError) as error:
        result = Equivalence([], **{"refused" if isinstance(error, PlanError) else "failed": str(error)})
        result.objects_changed = before.changes(snapshot(setup.model, setup.optimizer, setup.loader))
        result.process_changed = process_state() != process
        release_workers(setup.loader)
        return result
    result = Equivalence(run.plan.names(), applied=run.report.applied, stale=dict(run.report.stale),
                         skipped={r.name: r.reason for r in run.report.rows if r.status == "skipped"})
    result.keeps = combined([a.keeps for a in run.accelerators])
    # accelerate() may change how the user's objects run (hooks, fused flags: undone by close), never what they hold
    result.objects_changed = before.changes(snapshot(setup.model, setup.optimizer, setup.loader), how=False,
                                            sharded=run.sharded)
    before_objects = snapshot(setup.model, setup.optimizer)
    accelerated = trained(run, setup, steps, seed)
    result.process_changed = process_state() != process
    result.idle = {r.name: r.reason for r in accelerated.run.report.rows if r.status == "idle"}
    if hasattr(run, "arms"):  # plan="auto" in the loop: every plan that took turns is held to its own card
        result.keeps = combined([REGISTRY[name].keeps for arm in run.arms if arm.rounds or arm.steps
                                 for name in arm.plan])
    for what in run.report.stale:  # named stale: the user's object is not what trains, by declaration
        index = ("model", "optimizer").index(what)  # the loop drove the run's instead, as the report advised
        for trace in (expected, accelerated):
            trace.closed = tuple("" if i == index else v for i, v in enumerate(trace.closed))
            trace.user = {k: v for k, v in trace.user.items() if not k.startswith(f"your {what}")}
    loop_keeps = combined([result.keeps] + [REGISTRY[name].keeps for name in run.plan.names() if name in REGISTRY])
    result.differences = compare(expected, accelerated, result.keeps, loop_keeps)
    numeric = [d for d in result.differences if any(words in d for words in FLOAT_ORDER)]
    if numeric and result.keeps.weights == "float":  # a plan's float order, or a change? the loop's own reach says
        reach = loop_amplification(build, plan, steps, seed, device, expected)
        if apart(expected, accelerated) <= 2 * reach:
            result.differences = [d for d in result.differences if d not in numeric]
            result.amplified = reach
    if run.report.stale:  # the plan trains a copy: the user's model and optimizer stay as they were
        # (the loader is the user's and served the training: its generator moved as in the plain loop)
        result.objects_changed += [f"after training: {c}" for c in
                                   before_objects.changes(snapshot(setup.model, setup.optimizer), how=False)]
    return result
