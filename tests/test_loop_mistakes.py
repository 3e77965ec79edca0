"""A loop's own mistakes said, and legitimate loops never told they made one (issue 41, attacked from outside): a
closure optimizer (LBFGS), a batch whose backward is skipped on purpose under grad_accumulation, the loop's own
zero_grad in the middle of an accumulation, and amp's loss scaling beside a second optimizer or a closure one.
Each failed before the fix."""
import warnings

import pytest
import torch
from torch import nn

import accel
from accel.errors import BypassWarning, LoopWarning, PlanError


def setup(optimizer=torch.optim.SGD, **options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=generator)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1)), batch_size=4)
    return model, optimizer(model.parameters(), **(options or {"lr": 0.1})), loader


def loss_of(run, x, y):
    with run.autocast():
        return (run.model(x).squeeze(-1).float() - y).square().mean()


def said(caught, category=(BypassWarning, LoopWarning)):
    return [str(w.message) for w in caught if issubclass(w.category, category)]


def test_a_closure_optimizer_stepped_by_the_loop_is_said_as_such_not_as_a_backward_of_its_own():
    """LBFGS needs optimizer.step(closure), which run.step() cannot take; its closure calls run.backward. Before: the
    report said 'the loop called loss.backward() itself, not run.backward(loss)', which it had not, and advised
    run.step(), which cannot take a closure."""
    model, optimizer, loader = setup(torch.optim.LBFGS, lr=0.5, max_iter=3)
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}}], device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in run.loader:
            def closure():
                run.optimizer.zero_grad()
                loss = loss_of(run, x, y)
                run.backward(loss)
                return loss
            run.optimizer.step(closure)
    row = run.report.row("grad_accumulation")
    run.close()
    assert row.status == "idle" and "closure" in row.reason, row
    assert "loss.backward() itself" not in row.reason and len(said(caught)) == 1, said(caught)


def accumulate(run, skip=(), zero_grad=False):
    """The README loop under grad_accumulation; the batches in ``skip`` have a non-finite loss and no backward, and
    run.step() is called for them anyway; ``zero_grad``: the loop zeroes the gradients before each batch, as
    upstream loops do (optimizer.zero_grad() first)."""
    for i, (x, y) in enumerate(run.loader):
        if zero_grad:
            run.optimizer.zero_grad()
        loss = loss_of(run, x, y)
        if i not in skip:
            run.backward(loss)
        run.step()


def test_a_batch_skipped_on_purpose_keeps_grad_accumulation_and_is_said_once():
    """Before: run.step() with no backward but gradients held from the batch before was taken for the loop's own
    loss.backward(): grad_accumulation went idle, and accumulation stopped for the rest of the training."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}}], device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accumulate(run, skip={1})
    run.close()
    assert run.report.row("grad_accumulation").status == "applied"
    assert not said(caught, BypassWarning) and len(said(caught, LoopWarning)) == 1, said(caught)
    assert run.optimizer_steps == 2  # batches 0 and 1 (skipped), 2 and 3

    expected, optimizer, _ = setup()  # by hand: the mean over each pair of batches, the skipped one adding nothing
    batches = list(loader)
    for pair in ([0], [2, 3]):
        for i in pair:
            (loss_of(accel.accelerate(expected, None, None, [], device="cpu"), *batches[i]) / 2).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.allclose(a, b) for a, b in zip(model.parameters(), expected.parameters()))


def test_the_loops_own_zero_grad_inside_an_accumulation_is_said_and_grad_accumulation_stands_aside():
    """Upstream loops keep optimizer.zero_grad() at the top of each batch (torchvision's references, DCGAN,
    fast_neural_style). Before: under grad_accumulation it threw away every held gradient, silently: each optimizer
    step saw one batch's gradients divided by N."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}}], device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accumulate(run, zero_grad=True)
    run.close()
    row = run.report.row("grad_accumulation")
    assert row.status == "idle" and "zero_grad" in row.reason, row
    assert len(said(caught, BypassWarning)) == 1 and run.optimizer_steps == 3  # batches 1, 2 and 3 step


def test_zero_grad_after_each_step_and_the_readme_loop_are_never_taken_for_a_mistake():
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}}], device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BypassWarning)
        warnings.simplefilter("error", LoopWarning)
        for x, y in run.loader:
            run.backward(loss_of(run, x, y))
            if not run.step():
                run.optimizer.zero_grad()  # after an update: nothing held
    run.close()
    assert run.report.row("grad_accumulation").status == "applied" and run.optimizer_steps == 2


def fp16(model, optimizer, loader):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # (fp16 is emulated on most CPUs: amp says so)
        run = accel.accelerate(model, optimizer, loader, [{"amp": {"dtype": "float16", "grad_scaler": True}}],
                               device="cpu")
    return run, [str(w.message) for w in caught]


def test_a_second_optimizer_under_loss_scaling_is_told_to_unscale_and_then_trains_every_step():
    """Muon for the matrices beside AdamW for the rest, SparseAdam beside Adam: the loop steps the second itself.
    Before: nothing said its parameters hold gradients scaled by 65536, and run.unscale_gradients(second), which
    amp's card offers, unscaled them at the first step only (the optimizer stayed marked unscaled)."""
    model, _, loader = setup()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[2].parameters(), lr=0.1)
    run, warned = fp16(model, first, loader)
    assert any("not in the optimizer (2.weight, 2.bias)" in w and "run.scaler.step(it)" in w for w in warned)
    seen, skipped = [], []
    for _ in range(3):
        for x, y in run.loader:
            run.backward(loss_of(run, x, y))
            run.unscale_gradients(second)  # true gradients, to read or clip
            seen.append(float(model[2].weight.grad.abs().max()))
            run.scaler.step(second)  # skips a step whose gradients overflowed, as the first optimizer's is
            second.zero_grad()
            skipped.append(run.step())
    run.close()

    plain, _, _ = setup()  # fp32, the same steps skipped
    first, second = torch.optim.SGD(plain[0].parameters(), lr=0.1), torch.optim.SGD(plain[2].parameters(), lr=0.1)
    expected = []
    for skip, (x, y) in zip(skipped, [batch for _ in range(3) for batch in loader]):
        (plain(x).squeeze(-1) - y).square().mean().backward()
        expected.append(float(plain[2].weight.grad.abs().max()))
        for optimizer in (second, first):
            if not skip:
                optimizer.step()
            optimizer.zero_grad()
    assert 0 < sum(skipped) < len(skipped) - 4  # the scaler found its scale, then every step stepped
    stepped = [i for i, skip in enumerate(skipped) if not skip]
    assert [seen[i] for i in stepped] == pytest.approx([expected[i] for i in stepped], rel=0.05)  # true gradients


def test_loss_scaling_with_a_closure_optimizer_is_refused_before_anything_changes():
    """Before: accepted; the GradScaler then stepped LBFGS without its closure (TypeError in run.step())."""
    model, optimizer, loader = setup(torch.optim.LBFGS)
    with pytest.raises(PlanError, match="closure"):
        fp16(model, optimizer, loader)
    assert not optimizer._optimizer_step_pre_hooks


def test_a_run_loaded_in_the_middle_of_an_accumulation_is_not_taken_for_the_loops_zero_grad(tmp_path):
    """run.load puts the checkpoint's accumulated gradients in place of those the last run.step() held."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}}], device="cpu")
    batches = iter(run.loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BypassWarning)
        run.backward(loss_of(run, *next(batches)))
        run.step()
        run.save(tmp_path / "run.pt")
        run.load(tmp_path / "run.pt")
        run.backward(loss_of(run, *next(batches)))
        run.step()
    run.close()
    assert run.report.row("grad_accumulation").status == "applied" and run.optimizer_steps == 1
