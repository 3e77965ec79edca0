"""attack9: a run of plan="auto" resumes any checkpoint run.save wrote, as the fixed plan's run resumes it: the same
batches and the same weights after (docs/lifecycle.md: run.load under auto takes the checkpoint's plan)."""
import warnings

import pytest
import torch
from scripts.launching import one_rank_env
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.errors import BypassWarning
from accel.search import inloop

DIGITS = load_digits()
IMAGES = torch.tensor(DIGITS.images[:192], dtype=torch.float32).unsqueeze(1) / 16
LABELS = torch.tensor(DIGITS.target[:192])


def objects(seed, momentum=0.9):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)


def loader():
    return DataLoader(TensorDataset(IMAGES, LABELS), batch_size=32, shuffle=True,
                      generator=torch.Generator().manual_seed(3))


def train(run, steps):
    """The user's loop: labels of each batch seen, as many steps."""
    seen = []
    while len(seen) < steps:
        for x, y in run.loader:
            seen.append(y.clone())
            run.backward(nn.functional.cross_entropy(run.model(x), y))
            run.step()
            if len(seen) == steps:
                break
    return seen


def test_auto_resumes_a_checkpoint_saved_with_grad_accumulation(tmp_path, monkeypatch):
    """grad_accumulation keeps its state per rank (accelerators_per_rank): auto's load refused every such checkpoint
    as 'state of accelerators this run did not apply', before it switched to the checkpoint's plan."""
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    plan = [{"grad_accumulation": {"steps": 2}}]
    model, optimizer = objects(0)
    run = accel.accelerate(model, optimizer, loader(), plan, device="cpu")
    train(run, 3)  # in the middle of accumulating
    run.save(tmp_path / "ckpt.pt")
    expected = train(run, 6)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    run.close()

    model, optimizer = objects(1)
    again = accel.accelerate(model, optimizer, loader(), accel.Auto(cache=False, budget_s=5), device="cpu")
    info = again.load(tmp_path / "ckpt.pt")
    assert info["step"] == 3 and again.phase == "settled" and again.plan.names() == ["grad_accumulation"]
    seen = train(again, 6)
    again.close()
    assert all(torch.equal(a, b) for a, b in zip(seen, expected, strict=True))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name


class SlowDigits(TensorDataset):
    """Digits whose items take 4 ms each on the test's clock: the loop waits for data, so auto picks workers."""

    def __init__(self, clock):
        super().__init__(IMAGES[:48], LABELS[:48])
        self.clock = clock

    def __getitem__(self, index):
        self.clock.advance(0.004)
        return super().__getitem__(index)


def test_a_checkpoint_loaded_after_auto_settled_keeps_its_plan_at_the_next_epoch(tmp_path, monkeypatch):
    """auto settled with a rebuilt loader pending for the next epoch; run.load of a checkpoint saved with
    grad_accumulation took its plan, but the next epoch switched to the search's pending plan: the accumulation was
    dropped, silently (the optimizer stepped every batch, on undivided losses)."""
    from virtual_clock import VirtualClock

    import accel.clock

    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    clock = VirtualClock()
    with accel.clock.use(clock):
        model, optimizer = objects(0)
        run = accel.accelerate(model, optimizer, DataLoader(SlowDigits(clock), batch_size=4),
                               [{"grad_accumulation": {"steps": 2}}], device="cpu")
        train(run, 4)
        run.save(tmp_path / "ckpt.pt")
        run.close()
        model, optimizer = objects(1)
        clock.per_forward(model, 0.01)
        run = accel.accelerate(model, optimizer, DataLoader(SlowDigits(clock), batch_size=4),
                               accel.Auto(cache=False, budget_s=10, candidates=[[{"loader": {"num_workers": 1}}]]),
                               device="cpu")
        while run.phase != "settled":
            train(run, 12)
        assert run.loader.pending is not None  # the verdict's workers wait for the next epoch
        run.load(tmp_path / "ckpt.pt")
        train(run, 12)  # one epoch: the next one begins
        names = run.plan.names()
        run.close()
    assert names == ["grad_accumulation"]


def test_auto_resumes_a_sharded_checkpoint_taking_its_plan(tmp_path, monkeypatch):
    """A sharded checkpoint (fsdp) under plan="auto": run.load compared the checkpoint's plan with the candidate auto
    was measuring and refused it ('create the run with the same plan'), where a single file's plan is taken; had they
    matched, the search went on switching plans after the resume."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    model, optimizer = objects(0)
    run = accel.accelerate(model, optimizer, loader(), [{"grad_accumulation": {"steps": 2}}, "fsdp"], device="cpu")
    train(run, 2)
    run.save(tmp_path / "shards")
    run.close()

    model, optimizer = objects(1)
    again = accel.accelerate(model, optimizer, loader(), accel.Auto(cache=False, budget_s=5), device="cpu")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", BypassWarning)  # DCP's own step to build the optimizer's state is not yours
            info = again.load(tmp_path / "shards")
        assert info["step"] == 2 and again.phase == "settled", info
        assert "grad_accumulation" in again.plan.names() and "resumed from" in again.report.tuning.why
        train(again, 2)
        assert again.steps == 4 and "grad_accumulation" in again.plan.names()
    finally:
        again.close()


@pytest.mark.parametrize("plan", [[{"grad_accumulation": {"steps": 2}}, "fsdp"], "auto"])
def test_grad_accumulation_keeps_accumulating_after_a_sharded_load(tmp_path, monkeypatch, plan):
    """set_state_dict steps an optimizer without state once, to build it: grad_accumulation's watch took that for a
    loop calling optimizer.step() itself and went idle ('it divides no loss and holds no step'), so after resuming
    a sharded checkpoint the optimizer stepped every batch on undivided losses, under a false BypassWarning. A plain
    SGD (no momentum: no state at all) is the optimizer it happens with."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    model, optimizer = objects(0, momentum=0)
    run = accel.accelerate(model, optimizer, loader(), [{"grad_accumulation": {"steps": 2}}, "fsdp"], device="cpu")
    train(run, 2)
    run.save(tmp_path / "shards")
    run.close()

    model, optimizer = objects(1, momentum=0)
    again = accel.accelerate(model, optimizer, loader(),
                             accel.Auto(cache=False, budget_s=5) if plan == "auto" else plan, device="cpu")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", BypassWarning)
            again.load(tmp_path / "shards")
            held = []
            for _, (x, y) in zip(range(4), again.loader):
                again.backward(nn.functional.cross_entropy(again.model(x), y))
                held.append(again.step())  # True: the optimizer step held for the next micro-batch
    finally:
        again.close()
    assert held == [True, False, True, False]
