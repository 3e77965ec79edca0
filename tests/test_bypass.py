"""Nothing silent in the loops people really write (issue 25): a half-migrated loop (its own backward and optimizer
step), its own accumulation beside grad_accumulation, a gradient penalty under compile, and a model the user
compiled before accelerate(). Each accelerator whose work a bypassed call carried says so once, in a
BypassWarning and in its report row, and the loop trains as it would without accel."""
import gc
import warnings

import pytest
import torch
from torch import nn

import accel
from accel.errors import BypassWarning, LoopError
from accel.testing import tiny_loader, tiny_model

STEPS = 4


def setup(lr=0.05):
    model = tiny_model()
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), tiny_loader()


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def plain_loop(autocast=None, every=1, divide=1):
    """The loop without accel: its own backward and step (and its own accumulation, every N batches)."""
    model, optimizer, loader = setup()
    for index, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = nn.functional.cross_entropy(model(x), y)
        (loss / divide).backward()
        if (index + 1) % every == 0:
            optimizer.step()
            optimizer.zero_grad()
    return weights(model)


def own_steps(run, optimizer):
    """A half-migrated epoch: run.loader, run.model and run.autocast(), the loop's own backward and step."""
    for x, y in run.loader:
        with run.autocast():
            loss = nn.functional.cross_entropy(run.model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def accumulate_yourself(run, step):
    """The loop's own accumulation (transformers' no_trainer): loss / 2 through run.backward, ``step()`` every second
    batch of run.loader; returns the BypassWarnings said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for index, (x, y) in enumerate(run.loader):
            with run.autocast():
                loss = nn.functional.cross_entropy(run.model(x), y)
            run.backward(loss / 2)
            if index % 2:
                step()
    return bypass_warnings(caught)


def bypass_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, BypassWarning)]


def test_a_half_migrated_loop_names_what_it_made_idle_once_and_trains_as_without_accel():
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}},
                                                      {"grad_clipping": {"max_norm": 0.01}}], device="cpu")
    assert run.report.applied == ["grad_accumulation", "grad_clipping"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        own_steps(run, optimizer)
    said = bypass_warnings(caught)
    assert len(said) == 2, said  # once per accelerator, however many steps
    for name in ("grad_accumulation", "grad_clipping"):
        row = run.report.row(name)
        assert row.status == "idle" and "optimizer.step() itself" in row.reason, row
        assert "call run.step()" in row.reason
    assert "loss.backward() itself" in run.report.row("grad_accumulation").reason
    assert "idle" in str(run.report) and name not in run.report.applied
    assert run.optimizer_steps == 0 and run.steps == 0
    assert same(weights(model), plain_loop())  # nothing clipped, nothing accumulated: the loop as written
    run.close()
    assert not optimizer._optimizer_step_pre_hooks  # the watch's hook left with the run


def test_the_readme_loop_is_never_told_it_bypassed_anything():
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}},
                                                      {"grad_clipping": {"max_norm": 1.0}}], device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BypassWarning)
        for _ in range(2):
            for x, y in run.loader:
                with run.autocast():
                    loss = nn.functional.cross_entropy(run.model(x), y)
                run.backward(loss)
                run.step()
    assert run.report.applied == ["grad_accumulation", "grad_clipping"]
    run.close()


def test_nothing_is_watched_where_no_accelerator_relies_on_the_calls():
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, ["channels_last", "fused_optimizer"], device="cpu")
    assert not run.watch.needed and not optimizer._optimizer_step_pre_hooks
    assert run.loader.drawn is None  # the loader's fast path stays
    run.close()


def fp16_run():
    model, optimizer, loader = setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp16 may be emulated on this CPU: said by amp, not what is tested
        run = accel.accelerate(model, optimizer, loader, [{"amp": {"dtype": "float16", "grad_scaler": True}}],
                               device="cpu")
    assert run.scaler is not None
    return model, optimizer, run


@pytest.mark.parametrize("own", ["backward", "step"])
def test_amp_stands_aside_when_the_loop_goes_around_its_grad_scaler(own):
    """A loss the scaler scaled, stepped by the loop's optimizer.step(), would step 65536x; the loop's own unscaled
    backward stepped through the scaler would step 65536x too little: amp unscales and stands aside, named."""
    model, optimizer, run = fp16_run()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in run.loader:
            with run.autocast():
                loss = nn.functional.cross_entropy(run.model(x), y)
            if own == "backward":
                loss.backward()
                run.step()
            else:
                run.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    said = bypass_warnings(caught)
    assert len(said) == 1 and "amp" in said[0] and "no loss scaling" in said[0], said
    assert run.report.row("amp").status == "idle"
    expected = plain_loop(autocast=torch.float16)
    if own == "backward":  # the loop's own unscaled backward, stepped as it is
        assert same(weights(model), expected)
    else:  # one step's gradients were computed scaled in fp16 (other roundings), then unscaled: within amp's card
        card = accel.plan.contract.REGISTRY["amp"].keeps
        assert all(torch.allclose(a, b, rtol=card.rtol, atol=card.atol) for a, b in zip(weights(model), expected))
    run.close()


def test_own_accumulation_beside_grad_accumulation_is_noticed_and_the_loops_own_trains():
    """transformers' no_trainer loop: loss / N, backward every batch, a step every N batches. With grad_accumulation
    too it trained with half the updates in silence; now the second batch before run.step() is noticed."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 4}}], device="cpu")
    said = accumulate_yourself(run, step=run.step)
    assert len(said) == 1 and "accumulates gradients itself" in said[0], said
    assert "multiplied back by 4" in said[0]
    assert run.report.row("grad_accumulation").status == "idle"
    assert run.optimizer_steps == len(loader) // 2  # the loop's own updates, all of them
    assert same(weights(model), plain_loop(every=2, divide=2))
    run.close()


def test_two_backward_passes_per_step_over_the_loops_own_loader_are_said_not_undone():
    """A GAN's discriminator backpropagates its real and its fake loss, then steps: two run.backward() per run.step()
    is then one batch, not the loop's own accumulation. Without run.loader accel cannot tell: it says both."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, None, [{"grad_accumulation": {"steps": 2}}], device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in loader:
            with run.autocast():
                real = nn.functional.cross_entropy(run.model(x[:8]), y[:8])
                fake = nn.functional.cross_entropy(run.model(x[8:]), y[8:])
            run.backward(real)
            run.backward(fake)
            run.step()
    said = bypass_warnings(caught)
    assert len(said) == 1 and "a GAN's real and fake" in said[0], said
    row = run.report.row("grad_accumulation")
    assert row.status == "applied" and row.warnings, row
    assert run.optimizer_steps == len(loader) // 2  # still accumulating two batches per update, as asked
    run.close()


def critic_with_penalty(run, x):
    out = run.model(x)
    grad, = torch.autograd.grad(out.sum(), x, create_graph=True)
    return out.mean() + ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()


def test_a_gradient_penalty_under_compile_is_named_with_the_plans_that_run_it():
    torch._dynamo.reset()
    model, optimizer, _ = setup()
    before = weights(model)
    run = accel.accelerate(model, optimizer, None, ["channels_last", {"compile": {"backend": "aot_eager"}}],
                           device="cpu")
    x = torch.randn(4, 1, 8, 8, requires_grad=True)
    with pytest.raises(LoopError) as raised:
        run.backward(critic_with_penalty(run, x))
    message = str(raised.value)
    assert "compile" in message and "create_graph=True" in message and "plan=['channels_last']" in message
    assert same(weights(model), before) and run.steps == 0 and not optimizer.state
    assert all(p.grad is None for p in model.parameters())
    run.close()
    again = accel.accelerate(model, optimizer, None, ["channels_last"], device="cpu")  # what the error advises
    again.backward(critic_with_penalty(again, x))
    again.step()
    again.close()


def test_a_model_you_compiled_is_trained_inside_and_unwraps_to_your_module():
    torch._dynamo.reset()
    model, optimizer, loader = setup()
    compiled = torch.compile(model, backend="eager")
    run = accel.accelerate(compiled, optimizer, loader, ["channels_last", {"activation_checkpointing":
                                                                            {"modules": ["Conv2d"]}}], device="cpu")
    assert run.report.applied == ["channels_last", "activation_checkpointing"]
    assert run.model is compiled and run.unwrap() is model
    assert run.report.decisions["your_compile"].startswith("kept")
    for x, y in run.loader:
        with run.autocast():
            loss = nn.functional.cross_entropy(run.model(x), y)
        run.backward(loss)
        run.step()
    fresh = tiny_model(seed=1)
    fresh.load_state_dict(run.unwrap().state_dict())  # no "_orig_mod." keys
    assert same(weights(fresh), weights(model))
    again = accel.accelerate(compiled, optimizer, loader, [{"compile": {"backend": "eager"}}], device="cpu")
    assert run.closed and again.steps == run.steps  # the same model: the earlier run handed over
    assert again.model is not compiled and again.unwrap() is model
    assert "replaced by the plan's compile" in again.report.decisions["your_compile"]
    again.close()


def test_auto_in_a_loop_that_steps_the_optimizer_itself_says_it_measured_nothing():
    """plan="auto" times the steps between run.step() calls: a loop that never makes one left it measuring forever,
    with an empty report. It now ends on the plain loop at once and says why."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, accel.Auto(cache=False, budget_s=10,
                                                                accelerators=["channels_last", "fused_optimizer"]),
                           device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        own_steps(run, optimizer)
    said = bypass_warnings(caught)
    assert len(said) == 1 and "plan='auto'" in said[0], said
    tuning = run.report.tuning
    assert tuning is not None and "nothing was measured" in tuning.why and not tuning.plan.to_dict()
    assert all(row.status == "not measured" for row in tuning.rows[1:])
    assert same(weights(model), plain_loop())
    run.close()
    assert not optimizer._optimizer_step_pre_hooks


def test_a_loop_that_draws_its_next_batch_before_run_step_is_not_taken_for_its_own_accumulation():
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}}], device="cpu")
    batches = iter(run.loader)
    batch = next(batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BypassWarning)
        while batch is not None:
            with run.autocast():
                loss = nn.functional.cross_entropy(run.model(batch[0]), batch[1])
            run.backward(loss)
            batch = next(batches, None)  # prefetched before the step
            run.step()
    assert run.report.row("grad_accumulation").status == "applied"
    assert run.optimizer_steps == len(loader) // 2
    run.close()


def test_a_run_dropped_without_close_leaves_no_watch_that_breaks_the_next_one():
    model, optimizer, loader = setup()

    def epoch():
        run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}}], device="cpu")
        before = run.optimizer_steps
        for x, y in run.loader:
            with run.autocast():
                loss = nn.functional.cross_entropy(run.model(x), y)
            run.backward(loss)
            run.step()
        return run.optimizer_steps - before

    with warnings.catch_warnings():
        warnings.simplefilter("error", BypassWarning)
        first = epoch()
        gc.collect()  # the first run is gone, never closed: its hook is still on the optimizer, and stays idle
        assert first == epoch() == len(loader) // 2


def test_an_accelerator_the_loop_goes_around_twice_is_named_once():
    """Its own accumulation (noticed at the second batch), then its own optimizer.step(): grad_accumulation stood
    aside at the first and says nothing more at the second."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}}], device="cpu")
    said = accumulate_yourself(run, step=lambda: (optimizer.step(), optimizer.zero_grad()))
    assert len(said) == 1 and "accumulates gradients itself" in said[0], said
    assert same(weights(model), plain_loop(every=2, divide=2))
    run.close()


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_a_half_migrated_loop_on_two_ranks_steps_on_the_gradients_the_wrapper_held(tmp_path, wrapper):
    """Under grad_accumulation the wrapper reduces nothing in the first micro-step (DDP's no_sync, FSDP2's unreduced
    buffers). A loop that steps the optimizer itself there made the ranks step apart on their own gradients (ddp), or
    step a batch late on nothing (fsdp: momentum carried the difference). The gradients held are now reduced into
    .grad before the loop's own step: both ranks train what one process trains on the global batch."""
    import json

    from scripts.launching import output, torchrun

    plan = {wrapper: {}, "grad_accumulation": {"steps": 2}}
    result = torchrun("half_migrated_ranks.py", json.dumps(plan), tmp_path, timeout=180)
    assert result.returncode == 0, output(result)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for said in ranks:
        assert set(said["applied"]) == {wrapper} and said["grad_accumulation"] == "idle", said
        assert said["bypass_warnings"] == 1 and said["steps_seen"] == 0, said  # the loop's own steps, named once
        assert said["ranks_identical"], said
        assert said["moved"] > 0.05 and said["max_difference"] < 1e-5, said


# --- issue 41: the loop's own mistakes, said ---------------------------------------------------------------------

def test_a_step_with_no_backward_since_the_last_one_is_said_once():
    """Before: run.step() returned False ("stepped") and the weights did not move, without a word."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [], device="cpu")
    x, y = next(iter(run.loader))
    run.backward(nn.functional.cross_entropy(run.model(x), y))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.step()  # the loop's step: nothing said
        before = weights(model)
        run.step()
        run.step()
    said = [str(w.message) for w in caught if issubclass(w.category, accel.LoopWarning)]
    assert len(said) == 1 and "no run.backward() since the last run.step()" in said[0], said
    assert caught[0].filename == __file__  # pointing at the loop's line
    assert same(before, weights(model))
    run.close()


def test_a_loop_over_its_own_loader_while_the_plan_changed_run_loader_is_said_in_the_row():
    """pytorch/examples' loops keep `for data, target in train_loader:`. Before: the report still said 'loader ...
    applied num_workers=1', and nothing said the loop never used run.loader."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, [{"loader": {"num_workers": 1}}], device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(run.model(x), y))
            run.step()
    said = bypass_warnings(caught)
    row = run.report.row("loader")
    assert len(said) == 1 and "never iterated run.loader" in said[0] and caught[0].filename == __file__, said
    assert row.status == "applied" and any("never iterated run.loader" in w for w in row.warnings), row
    assert "never iterated run.loader" in str(run.report)
    run.close()
    model, optimizer, loader = setup()  # the README loop over run.loader: nothing said
    run = accel.accelerate(model, optimizer, loader, [{"loader": {"num_workers": 1}}], device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in run.loader:
            run.backward(nn.functional.cross_entropy(run.model(x), y))
            run.step()
    assert not bypass_warnings(caught) and not run.report.row("loader").warnings
    run.close()
