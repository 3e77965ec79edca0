"""What differs between the plain training and the accelerated one, beyond what the plan's cards declare
(``Accelerator.keeps``): the levels "exact", "float", "tolerance" and "changed", and the comparison itself."""
from __future__ import annotations

import re

import torch

from accel.plan.contract import EXACT, Keeps
from accel.testing.trace import Trace

LEVELS = ("exact", "float", "tolerance", "changed")


def declares_training(keeps: Keeps) -> bool:
    """A card that changes what one step does (when or how much it steps) but no structure: the reference runs it."""
    return keeps.weights == "changed" and keeps.structure


def combined(cards: list[Keeps]) -> Keeps:
    """What a plan keeps: the loosest level of its accelerators' cards (but those that declare training), their
    largest tolerances."""
    cards = [c for c in cards if not declares_training(c)]
    if not cards:
        return EXACT
    return Keeps(max((c.weights for c in cards), key=LEVELS.index), rtol=max(c.rtol for c in cards),
                 atol=max(c.atol for c in cards), loss_rtol=max(c.loss_rtol for c in cards),
                 structure=all(c.structure for c in cards), note="; ".join(c.note for c in cards if c.note))


def _close(a: torch.Tensor, b: torch.Tensor, keeps: Keeps) -> bool:
    """exact: bit for bit; float: element by element within rtol/atol, or the whole tensor within rtol (adaptive
    optimizers divide by the gradient's size, so a last-bit difference on a near-zero gradient is a visible step on
    that element; a tensor too small for that falls back on the whole model's distance in compare_tensors)."""
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
    """At most 5% of the elements (at least 4) beyond the element test: single adaptive steps, not a systematic
    error, which moves many."""
    if a.shape != b.shape:
        return False
    beyond = ~torch.isclose(a.float(), b.float(), rtol=keeps.rtol, atol=keeps.atol)
    return int(beyond.sum()) <= max(4, int(0.05 * a.numel()))


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


def compare(reference: Trace, accelerated: Trace, keeps: Keeps, loop_keeps: Keeps | None = None) -> list[str]:
    """Every difference between the plain training and the accelerated one that the card does not declare: the
    batches, outputs' structure, names and shapes, flags, ties, frozen parameters, hyper-parameters; below "changed"
    also counters and which optimizer states exist; then the weights and states at the card's level. What the loop
    built itself (a second model under its own run of the plan) is held to ``loop_keeps``: the whole plan's card,
    since its run may apply what the first model's skipped."""
    found = [f"batches: the loop saw another batch at step {i}: {b} instead of {a}"
             for i, (a, b) in enumerate(zip(reference.batches, accelerated.batches)) if a != b][:1]
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
    found += [f"learning rates: step {i} used {b} instead of {a}"
              for i, (a, b) in enumerate(zip(reference.rates, accelerated.rates)) if a != b][:1]
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
    for what, ours, theirs, card in (("weights", reference.state, accelerated.state, keeps),
                                     ("your objects", reference.user, accelerated.user, keeps),
                                     ("what the loop built", reference.observed, accelerated.observed,
                                      loop_keeps or keeps)):
        found += compare_tensors(what, ours, theirs, card)
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
