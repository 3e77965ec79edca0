"""check_equivalence: train the same user code with and without a plan and compare what was trained.

The user code is a model, an optimizer, a loader, a step, and a loop (``accel.testing.loops``): what the loop
does with the objects it holds (schedulers, learning-rate writes, unfreezing, its own checkpoints, validation,
hooks, an EMA, accelerate() again). The objects stay live: the loop drives the accelerated training exactly
as the plain one, or the report names what went stale.

    from accel.testing import Setup, check_equivalence

    def build():                      # called for each run: the same objects from the same seed every time
        torch.manual_seed(0)
        model = MyNet()
        return Setup(model, torch.optim.SGD(model.parameters(), lr=0.1), make_loader(seed=0))

    result = check_equivalence(["channels_last", "amp"], build, steps=3)
    assert result.ok, result          # every difference named, beyond what the plan's cards declare

What a plan may change is the union of its applied accelerators' cards (``Accelerator.keeps``). Always checked:
the user's objects and the process are unchanged by accelerate() (and by a refused plan); the loop saw the same
batches; the outputs have the same structure and shapes; parameter names, requires_grad flags and ties are the
same, and frozen parameters never change. By the card: the weights and buffers, the optimizer's state and the
losses, bit for bit ("exact"), to float precision ("float"), within a tolerance ("tolerance"), or not compared
("changed", e.g. pruning).
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from accel.accelerator import EXACT, REGISTRY, Keeps
from accel.core import accelerate
from accel.errors import AccelerateError, PlanError
from accel.loaders import release_workers
from accel.modules import tied_groups
from accel.plan import Plan
from accel.measure import TrainStep, endless
from accel.batches import map_tensors
from accel.run import Run
from accel.testing.loops import Held, Loop
from accel.testing.snapshots import snapshot, whole

LEVELS = ("exact", "float", "tolerance", "changed")


@dataclass
class Setup:
    """A user's training objects; step_fn(run, batch) -> loss when batches are not (inputs, targets); the loop's
    behaviour around the steps; evaluate(model) -> the model's output on held-out data (for validation, EMA)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    step_fn: Callable[[Run, Any], torch.Tensor] | None = None
    loop: Loop = field(default_factory=Loop)
    evaluate: Callable[[torch.nn.Module], torch.Tensor] | None = None

    def held(self, run: Run | None = None) -> Held:
        """What the loop holds: the user's objects, or where the run's report names one stale, the run's."""
        stale = run.report.stale if run is not None else {}
        return Held(run.unwrap() if "model" in stale else self.model,
                    run.optimizer if "optimizer" in stale else self.optimizer, self.loader, self.evaluate)


def combined(cards: list[Keeps]) -> Keeps:
    """What a plan keeps: the loosest level of its applied accelerators, their largest tolerances."""
    if not cards:
        return EXACT
    return Keeps(max((c.weights for c in cards), key=LEVELS.index), rtol=max(c.rtol for c in cards),
                 atol=max(c.atol for c in cards), loss_rtol=max(c.loss_rtol for c in cards),
                 structure=all(c.structure for c in cards), note="; ".join(c.note for c in cards if c.note))


def fingerprint(batch: Any) -> str:
    """The batch's containers and every tensor's dtype, shape and values, as a short text."""
    def one(tensor: torch.Tensor) -> str:
        data = tensor.detach().cpu().contiguous()
        digest = hashlib.blake2b(data.reshape(-1).view(torch.uint8).numpy().tobytes(), digest_size=6).hexdigest()
        return f"{str(data.dtype)[6:]}{list(data.shape)}:{digest}"

    described = map_tensors(one, batch)
    return f"{type(batch).__name__}:{described!r}"


def structure(output: Any) -> str:
    return repr(map_tensors(lambda t: f"{str(t.dtype)[6:]}{list(t.shape)}", output))


def ties(model: torch.nn.Module) -> list[tuple[str, ...]]:
    """Groups of parameter names that are one tensor, in a fixed order."""
    return sorted(tuple(names) for names in tied_groups(model))


TORCH_SETS_ON_IMPORT = ("KMP_INIT_AT_FORK", "KMP_DUPLICATE_LIB_OK", "TORCHINDUCTOR_", "_TORCHINDUCTOR_",
                        "CUDA_MODULE_LOADING")  # torch's compiler sets these (names, or prefixes) the first time it
# runs in a process, whoever uses it: not the plan's (torch 2.8's inductor sets CUDA_MODULE_LOADING=LAZY)


def process_state() -> tuple:
    """Threads, environment, affinity and the backend flags an accelerator may set (amp sets TF32 on CUDA)."""
    affinity = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    environ = {k: v for k, v in os.environ.items() if not k.startswith(TORCH_SETS_ON_IMPORT)}
    flags = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.get_float32_matmul_precision())
    return torch.get_num_threads(), environ, affinity, flags


KERNEL_CHOICES = ("params", "fused", "foreach", "capturable", "differentiable")  # how a step runs, not what it does


@dataclass
class Trace:
    """What one training saw and left."""

    batches: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    trainable: dict[str, bool] = field(default_factory=dict)
    ties: list[tuple[str, ...]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)  # the optimizer's hyper-parameters, per group
    frozen_moved: list[str] = field(default_factory=list)
    rates: list[list[float]] = field(default_factory=list)  # the learning rates each step used, per group
    steps_counted: int = 0  # run.steps at the end (accelerate() again continues it)
    user: dict[str, torch.Tensor] = field(default_factory=dict)  # the user's own model and optimizer state
    observed: dict[str, torch.Tensor] = field(default_factory=dict)  # what the loop built (EMA, validation)
    closed: tuple = ()  # hooks and optimizer flags on the user's objects after run.close()
    run: Any = None


def train(run: Run, setup: Setup, steps: int, seed: int) -> Trace:
    """The README loop for `steps` batches, with the setup's loop behaviour, recording the batches, outputs,
    losses and learning rates, then the model's, the user's and the loop's state."""
    trace = Trace()
    loop, held = setup.loop, setup.held(run)
    model = run.unwrap()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    user_names = {id(p): n for n, p in setup.model.named_parameters()}  # the optimizer's places, by the user's names
    start = [user_names.get(id(p)) for group in setup.optimizer.param_groups for p in group["params"]]
    hook = model.register_forward_hook(lambda module, args, output: trace.outputs.append(structure(output)))
    step = TrainStep(step_fn=setup.step_fn)
    torch.manual_seed(seed)
    try:
        batches = endless(run.loader)
        run.model.train()
        loop.start(held, run)
        for i in range(steps):
            again = loop.before(i, held, run)
            if again is not run:  # accelerate() again: the new run's loader, from the start of an epoch
                run, batches = again, endless(again.loader)
            batch = next(batches)
            trace.batches.append(fingerprint(batch))
            trace.rates.append([group["lr"] for group in run.optimizer.param_groups])
            loss = float(loop.step(i, run, held, batch, step.loss))
            trace.losses.append(loss)
            loop.after(i, held, run, loss)
    finally:
        hook.remove()
    trace.run = run  # the run at the end (the loop may have made another): the one to close
    trace.steps_counted = run.steps
    trace.observed = {k: whole(v).detach().cpu().clone() for k, v in loop.observed().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    trace.state = {k: whole(v).detach().cpu().clone() for k, v in model.state_dict().items()}
    trace.user = {f"your model's {k}": whole(v).detach().cpu().clone() for k, v in setup.model.state_dict().items()}
    for index, state in setup.optimizer.state_dict()["state"].items():
        trace.user.update({f"your optimizer's {index}.{k}": whole(v).detach().cpu().float().clone() for k, v in state.items()
                           if isinstance(v, torch.Tensor)})
    trace.trainable = {n: p.requires_grad for n, p in model.named_parameters()}
    trace.ties = ties(model)
    trace.frozen_moved = [n for n, p in model.named_parameters() if n in frozen and not p.requires_grad and
                          (p.shape != frozen[n].shape or not torch.equal(p.detach(), frozen[n]))]  # (unfrozen: trains)
    # Through state_dict(), what the user saves (IPEX keeps a conv's momentum in its blocked layout and converts
    # it back there), named by position in the user's optimizer: engines may step master copies that are not
    # the model's parameters (IPEX's fp32 weights beside a bf16 model), in the same order.
    # A parameter of the model is named by the model; one that is not (a master copy) by the name its place held
    # when training began (a group the loop added later holds the model's own parameters).
    params = [param for group in run.optimizer.param_groups for param in group["params"]]
    positions = [names.get(id(p)) or (start[i] if i < len(start) else None) or f"(not in the model) {tuple(p.shape)}"
                 for i, p in enumerate(params)]
    saved = run.optimizer.state_dict()
    states = saved["state"]
    trace.groups = [{k: v for k, v in group.items() if k not in KERNEL_CHOICES} for group in saved["param_groups"]]
    for index, key in enumerate(positions):
        trace.optimizer[key] = {k: whole(v).detach().cpu().float().clone() for k, v in states.get(index, {}).items()
                                if isinstance(v, torch.Tensor)}
    return trace


def closed_state(setup: Setup) -> tuple:
    """How the user's objects run once the run is closed: their hooks and forwards, the optimizer's flags."""
    after = snapshot(setup.model, setup.optimizer)
    return tuple(after.hooks), repr(after.kernels)


def _close(a: torch.Tensor, b: torch.Tensor, keeps: Keeps) -> bool:
    """exact: bit for bit; float: element by element within rtol/atol, or the whole tensor within rtol.

    The second form is for adaptive optimizers (RMSprop, Adagrad, Adam): they divide by the gradient's own
    size, so a last-bit difference on a near-zero gradient becomes a visible step on that one element
    (measured: 1.8e-4 on one element, 8e-5 over the tensor, with channels_last under RMSprop). Where the tensor is
    too small for that (conv1 of the zoo's CNN, 72 elements: a corner weight sees only the digits' zero border, so
    its gradient is exactly 0 in eager and 1e-9 through channels_last's kernels, which RMSprop's eps of 1e-8 turns
    into 5e-4 a step: 1.6e-3 after 3), compare_tensors takes the whole model's relative distance within rtol.
    """
    if a.shape != b.shape:
        return False
    if keeps.weights == "exact" or not a.is_floating_point():
        return torch.equal(a, b)
    a, b = a.float(), b.float()
    if torch.allclose(a, b, rtol=keeps.rtol, atol=keeps.atol):
        return True
    return float((a - b).norm()) <= keeps.rtol * max(float(b.norm()), keeps.atol)


def distance(reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> float:
    """The whole model's relative distance |a - b| / |b| over every floating tensor both have."""
    names = [n for n, t in reference.items() if t.is_floating_point() and n in other and other[n].shape == t.shape]
    delta = sum(float((reference[n].float() - other[n].float()).square().sum()) for n in names)
    size = sum(float(reference[n].float().square().sum()) for n in names)
    return (delta / max(size, 1e-30)) ** 0.5


def _few_off(a: torch.Tensor, b: torch.Tensor, keeps: Keeps) -> bool:
    """At most 2% of the elements (at least 4) beyond the element test: single adaptive steps, not a systematic
    error, which moves many."""
    if a.shape != b.shape:
        return False
    beyond = ~torch.isclose(a.float(), b.float(), rtol=keeps.rtol, atol=keeps.atol)
    return int(beyond.sum()) <= max(4, int(0.02 * a.numel()))


def compare_tensors(what: str, reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor],
                    keeps: Keeps) -> list[str]:
    """Tensors by name at the card's level: each within exact/float, or the whole within the tolerance."""
    if keeps.weights == "tolerance":  # lower precision: single elements may move a whole (adaptive) step
        gap = distance(reference, other)
        return [f"{what}: the relative distance {gap:.3g} exceeds the tolerance card's {keeps.rtol:g}"] \
            if gap > keeps.rtol else []
    found, off = [], []
    for name, tensor in reference.items():
        theirs = other.get(name)
        if theirs is None:
            found.append(f"{what}: {name} is missing")
        elif not _close(tensor, theirs, keeps):
            delta = (tensor.float() - theirs.float()).abs().max().item() if tensor.shape == theirs.shape else "shape"
            off.append((name, f"{what}: {name} differs beyond the {keeps.weights} card (max |difference| {delta})"))
    if off and keeps.weights == "float" and all(_few_off(reference[n], other[n], keeps) for n, _ in off):
        # a small tensor can hold an adaptive step on one element (see _close); the whole model is then within rtol
        gap = distance(reference, other)
        if gap <= keeps.rtol:
            off = []
    return found + [text for _, text in off]


def compare(reference: Trace, accelerated: Trace, keeps: Keeps) -> list[str]:
    """Every difference between the plain training and the accelerated one that the card does not declare.

    At every level: the batches, the outputs' structure (dtypes aside below float), parameter and buffer names and
    shapes (unless the card declares surgery), requires_grad, ties, frozen parameters, the optimizer's
    hyper-parameters. Below "changed" also: counters and other non-float tensors (BatchNorm's batch count),
    and which optimizer states exist. Then the weights and states at the card's level.
    """
    found = []
    for i, (a, b) in enumerate(zip(reference.batches, accelerated.batches)):
        if a != b:
            found.append(f"batches: the loop saw another batch at step {i}: {b} instead of {a}")
            break
    if len(reference.batches) != len(accelerated.batches):
        found.append(f"batches: {len(accelerated.batches)} steps instead of {len(reference.batches)}")
    precise = keeps.weights in ("exact", "float")
    shapes = list if precise else (lambda outputs: [re.sub(r"b?float(16|32|64)", "", o) for o in outputs])
    if shapes(reference.outputs) != shapes(accelerated.outputs):
        step = next((i for i, (a, b) in enumerate(zip(shapes(reference.outputs), shapes(accelerated.outputs)))
                     if a != b), min(len(reference.outputs), len(accelerated.outputs)))
        found.append(f"outputs: {accelerated.outputs[step:step + 1]} instead of {reference.outputs[step:step + 1]} "
                     f"(forward {step})")
    shared = set(reference.trainable) & set(accelerated.trainable)
    if keeps.structure:
        if set(reference.state) != set(accelerated.state):
            found.append(f"structure: names {sorted(set(reference.state) ^ set(accelerated.state))[:4]} differ")
        reshaped = [n for n, t in reference.state.items() if n in accelerated.state and
                    t.shape != accelerated.state[n].shape]
        if reshaped:
            found.append(f"structure: shapes of {reshaped[:4]} differ")
    flags = [n for n in sorted(shared) if reference.trainable[n] != accelerated.trainable[n]]
    if flags:
        found.append(f"requires_grad: changed for {flags[:4]}")
    if [t for t in reference.ties if set(t) <= shared] != [t for t in accelerated.ties if set(t) <= shared] or (
            reference.ties and not accelerated.ties):
        found.append(f"ties: {accelerated.ties} instead of {reference.ties}")
    if accelerated.frozen_moved:
        found.append(f"frozen parameters changed: {accelerated.frozen_moved[:4]}")
    if reference.groups != accelerated.groups:
        found.append(f"optimizer hyper-parameters: {accelerated.groups} instead of {reference.groups}")
    for i, (a, b) in enumerate(zip(reference.rates, accelerated.rates)):
        if a != b:
            found.append(f"learning rates: step {i} used {b} instead of {a}")
            break
    if accelerated.steps_counted != reference.steps_counted:  # one per batch, unless the loop steps itself
        found.append(f"counters: run.steps is {accelerated.steps_counted} after {len(accelerated.batches)} batches "
                     f"instead of {reference.steps_counted}")
    if reference.closed != accelerated.closed:
        found.append(f"after run.close(): your objects run with {accelerated.closed} instead of {reference.closed}")
    if keeps.weights == "changed":
        return found
    counters = [n for n, t in reference.state.items() if not t.is_floating_point() and n in accelerated.state
                and not _close(t, accelerated.state[n], EXACT)]
    if counters:
        found.append(f"counters: {counters[:4]} differ (e.g. BatchNorm counting batches twice)")
    for name, state in reference.optimizer.items():
        other = accelerated.optimizer.get(name, {})
        if set(state) != set(other):
            found.append(f"optimizer state: {name} holds {sorted(other)} instead of {sorted(state)}")
    for what, ours, theirs in (("weights", reference.state, accelerated.state),
                               ("your objects", reference.user, accelerated.user),
                               ("what the loop built", reference.observed, accelerated.observed)):
        found += compare_tensors(what, ours, theirs, keeps)
    if precise:
        for name, state in reference.optimizer.items():
            other = accelerated.optimizer.get(name, {})
            for key, value in state.items():
                if key in other and not _close(value, other[key], keeps):
                    found.append(f"optimizer state: {name}.{key} differs beyond the {keeps.weights} card")
    loss_rtol = keeps.loss_rtol if keeps.weights != "exact" else 0.0
    ref_loss = sum(reference.losses) / max(1, len(reference.losses))
    acc_loss = sum(accelerated.losses) / max(1, len(accelerated.losses))
    if abs(acc_loss - ref_loss) > loss_rtol * max(abs(ref_loss), 1e-8) + (0 if keeps.weights == "exact" else 1e-6):
        found.append(f"losses: mean {acc_loss:.6f} instead of {ref_loss:.6f} (tolerance {loss_rtol:g})")
    return found


@dataclass
class Equivalence:
    """The verdict: what the plan changed beyond its cards, and whether it touched the user's objects."""

    plan: list[str]
    keeps: Keeps = EXACT
    applied: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    stale: dict[str, str] = field(default_factory=dict)  # what the report named stale (the user's model/optimizer)
    idle: dict[str, str] = field(default_factory=dict)  # applied, then bypassed by the loop: why (accel/watch.py)
    refused: str | None = None  # a PlanError: refused up front
    failed: str | None = None  # an AccelerateError: failed while applying, rolled back
    differences: list[str] = field(default_factory=list)
    objects_changed: list[str] = field(default_factory=list)
    process_changed: bool = False

    @property
    def ok(self) -> bool:
        return not self.differences and not self.objects_changed and not self.process_changed and not self.failed

    def __str__(self) -> str:
        head = f"plan {self.plan}: " + ("refused" if self.refused else "failed" if self.failed
                                        else f"applied {self.applied}")
        lines = [head + (f", keeps {self.keeps.weights}" if not self.refused else "")]
        lines += [f"  idle: {name}: {why}" for name, why in self.idle.items()]
        lines += [f"  difference: {d}" for d in self.differences]
        lines += [f"  your objects changed: {c}" for c in self.objects_changed]
        if self.process_changed:
            lines.append("  the process (threads, environment, affinity) was not put back")
        for text in (self.refused, self.failed):
            if text:
                lines.append("  " + text.replace("\n", "\n  "))
        return "\n".join(lines)


def declares_training(keeps: Keeps) -> bool:
    """A card that changes what one step does (when or how much it steps) but no structure."""
    return keeps.weights == "changed" and keeps.structure


def in_reference(plan: Any) -> list[dict[str, Any]]:
    """The plan's accelerators that the plain reference runs too (see check_equivalence)."""
    try:
        entries = Plan(plan).to_dict()
    except PlanError:
        return []  # the accelerated run reports it
    return [{name: options} for name, options in entries.items()
            if name in REGISTRY and declares_training(REGISTRY[name].keeps)]


def built(build: Callable[[], Setup]) -> Setup:
    """The user's objects as the loop has them before accelerate(): wrapped (compiled, streamed), prepared."""
    setup = build()
    setup.model, setup.loader = setup.loop.wrap(setup.model, setup.loader)
    setup.loop.prepare(setup.held())
    return setup


def check_equivalence(plan: Any, build: Callable[[], Setup], steps: int = 3, seed: int = 0,
                      device: Any = "cpu") -> Equivalence:
    """Train `steps` batches of build()'s objects plainly and through the plan; return what differs.

    A plan refused up front (PlanError) is a valid outcome, provided the objects and the process are untouched.
    Accelerators that declare a change of the training itself and keep the structure (grad_accumulation,
    grad_clipping) run in the reference too, so the rest of the plan is still held to its own cards.
    """
    reference = built(build)
    plain = accelerate(reference.model, reference.optimizer, reference.loader, plan=in_reference(plan),
                       device=device)
    expected = None
    try:
        expected = train(plain, reference, steps, seed)
    finally:
        (expected.run if expected is not None else plain).close()
        reference.loop.finish()
        release_workers(reference.loader)
    expected.closed = closed_state(reference)
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
    result.keeps = combined([a.keeps for a in run.accelerators if not declares_training(a.keeps)])
    # accelerate() may change how the user's objects run (hooks, fused flags: undone by close), never what they hold
    result.objects_changed = before.changes(snapshot(setup.model, setup.optimizer, setup.loader), how=False,
                                            sharded=run.sharded)
    before_objects = snapshot(setup.model, setup.optimizer)
    accelerated = None
    try:
        accelerated = train(run, setup, steps, seed)
    finally:
        (accelerated.run if accelerated is not None else run).close()
        setup.loop.finish()
        release_workers(setup.loader)
    accelerated.closed = closed_state(setup)
    result.process_changed = process_state() != process
    result.idle = {r.name: r.reason for r in accelerated.run.report.rows if r.status == "idle"}
    if hasattr(run, "arms"):  # plan="auto" in the loop: every plan that took turns is held to its own card
        result.keeps = combined([REGISTRY[name].keeps for arm in run.arms if arm.rounds or arm.steps
                                 for name in arm.plan if not declares_training(REGISTRY[name].keeps)])
    for what in run.report.stale:  # named stale: the user's object is not what trains, by declaration
        index = ("model", "optimizer").index(what)  # the loop drove the run's instead, as the report advised
        expected.closed = tuple("" if i == index else v for i, v in enumerate(expected.closed))
        accelerated.closed = tuple("" if i == index else v for i, v in enumerate(accelerated.closed))
        prefix = f"your {what}"
        expected.user = {k: v for k, v in expected.user.items() if not k.startswith(prefix)}
        accelerated.user = {k: v for k, v in accelerated.user.items() if not k.startswith(prefix)}
    result.differences = compare(expected, accelerated, result.keeps)
    if run.report.stale:  # the plan trains a copy: the user's model and optimizer stay as they were
        # (the loader is the user's and served the training: its generator moved as in the plain loop)
        result.objects_changed += [f"after training: {c}" for c in
                                   before_objects.changes(snapshot(setup.model, setup.optimizer), how=False)]
    return result
