"""What the user holds stays live after accelerate(): every loop behaviour of zoo.loops drives the
accelerated training exactly as the plain loop, with every built-in alone here (plans of up to three over the
whole zoo: tests/test_equivalence.py), or the report names what went stale. Each test below also names the bug it
guards against, as it was before the objects were kept live."""
import dataclasses
import warnings

import pytest
import torch
from torch.nn.modules.module import _global_forward_pre_hooks as global_pre_hooks
from zoo import Case
from zoo.loops import LOOPS

import accel
from accel.errors import CheckpointError, StaleWarning
from accel.hardware import package_version
from accel.plan.contract import Stage, register, unregister
from accel.run.checkpoint import read
from accel.testing import check_equivalence, tiny_loader, tiny_model, train_steps

SINGLES = {"fused_optimizer": {}, "channels_last": {}, "activation_checkpointing": {"modules": ["Conv2d"]},
           "amp": {"dtype": "bfloat16"}, "compile": {"backend": "eager"}, "threads": {"threads": 1},
           "loader": {"num_workers": 1}, "grad_accumulation": {"steps": 2}, "grad_clipping": {"max_norm": 0.5}}


@pytest.mark.parametrize("name", sorted(SINGLES))
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_every_loop_behaviour_drives_every_accelerator_as_the_plain_loop(loop, name):
    if name == "compile":
        torch._dynamo.reset()
    optimizer = "momentum" if loop in ("unfreeze", "add_group", "late_group") else "adam"  # fused SGD's first-step trap
    result = check_equivalence([{name: SINGLES[name]}], Case("batchnorm", "dict", "mask", "shuffled", optimizer,
                                                           loop=loop).build, steps=4)
    assert result.ok and not result.stale, result


def adam_setup(seed=0):
    model = tiny_model(seed)
    return model, torch.optim.Adam(model.parameters(), lr=0.01), tiny_loader()


def test_a_scheduler_built_before_accelerate_drives_the_fused_optimizer():
    """Before: fused_optimizer trained a rebuilt copy at a constant rate while the scheduler moved the user's."""
    weights = []
    for plan in ([], ["fused_optimizer"]):
        model, optimizer, loader = adam_setup()
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=20)
        run = accel.accelerate(model, optimizer, loader, plan)
        assert run.optimizer is optimizer and not run.report.stale
        if plan:
            assert optimizer.param_groups[0]["fused"] is True
        for _ in range(2):
            for x, y in run.loader:
                with run.autocast():
                    loss = torch.nn.functional.cross_entropy(run.model(x), y)
                run.backward(loss)
                run.step()
                scheduler.step()
        weights.append([p.detach().clone() for p in model.parameters()])
        run.close()
        assert optimizer.param_groups[0]["fused"] is None  # the user's own value, back
    for plain, fused in zip(*weights):
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)


def test_your_checkpoints_of_a_fused_optimizer_save_your_settings_and_loading_one_stays_fused():
    model, optimizer, loader = adam_setup()
    run = accel.accelerate(model, optimizer, loader, ["fused_optimizer"])
    train_steps(run)
    saved = optimizer.state_dict()
    assert [g["fused"] for g in saved["param_groups"]] == [None] and optimizer.param_groups[0]["fused"] is True
    optimizer.load_state_dict(saved)
    assert optimizer.param_groups[0]["fused"] is True and optimizer.param_groups[0]["foreach"] is None
    run.close()
    assert optimizer.param_groups[0]["fused"] is None and optimizer.defaults["fused"] is None


@pytest.mark.parametrize("plan", [["channels_last"], [{"activation_checkpointing": {"modules": ["Conv2d"]}}]])
def test_model_eval_on_your_model_reaches_what_runs(plan):
    """Before: channels_last and activation_checkpointing ran a copy of the module tree: model.eval() did not
    reach it, so validation updated BatchNorm's statistics."""
    result = check_equivalence(plan, Case("batchnorm", loop="validation").build, steps=4)
    assert result.ok and result.applied, result
    model, optimizer, loader = adam_setup()
    run = accel.accelerate(model, optimizer, loader, plan)
    assert run.model is model and run.unwrap() is model
    run.close()


def test_accelerate_again_continues_the_optimizer_state_and_the_counters():
    """Before: a second accelerate() under fused_optimizer restarted Adam's moments (0.042 away from plain)."""
    finals = []
    for plan in ([], ["fused_optimizer", "channels_last"]):
        model, optimizer, loader = adam_setup()
        run = accel.accelerate(model, optimizer, loader, plan)
        train_steps(run)
        second = accel.accelerate(model, optimizer, loader, plan)
        assert run.closed and "steps=4" in second.report.continued
        assert second.steps == 4 and second.loader.epoch == 1
        train_steps(second)
        assert second.steps == 8 and second.optimizer_steps == 8
        finals.append([p.detach().clone() for p in model.parameters()])
        second.close()
    for plain, accelerated in zip(*finals):
        torch.testing.assert_close(accelerated, plain, rtol=1e-4, atol=1e-5)


def test_a_refused_second_plan_leaves_the_first_run_open_and_applied():
    model, optimizer, loader = adam_setup()
    hooks = len(global_pre_hooks)
    run = accel.accelerate(model, optimizer, loader, ["channels_last", "fused_optimizer"])
    with pytest.raises(accel.PlanError):
        accel.accelerate(model, optimizer, loader, [{"amp": {"dtype": "no-such"}}])
    assert not run.closed and optimizer.param_groups[0]["fused"] is True
    assert len(global_pre_hooks) == hooks + 1  # channels_last's, once
    train_steps(run)
    run.close()
    assert len(global_pre_hooks) == hooks


def test_a_second_plan_that_fails_while_applying_puts_the_first_run_back():
    @register
    class Broken(accel.Accelerator):
        name, stage = "broken", Stage.COMPILATION

        def apply(self, ctx):
            raise RuntimeError("boom")

    try:
        model, optimizer, loader = adam_setup()
        hooks = len(global_pre_hooks)
        run = accel.accelerate(model, optimizer, loader, ["channels_last", "fused_optimizer"])
        with pytest.raises(accel.AccelerateError, match="boom"):
            accel.accelerate(model, optimizer, loader, ["channels_last", "broken"])
        assert not run.closed and optimizer.param_groups[0]["fused"] is True
        assert len(global_pre_hooks) == hooks + 1  # channels_last's, once
        run.close()
        assert optimizer.param_groups[0]["fused"] is None and len(global_pre_hooks) == hooks
    finally:
        unregister("broken")


def test_a_forward_hook_registered_after_compile_runs():
    """Before: dynamo skips its guards on module hooks by default; a hook added after compiling never ran."""
    torch._dynamo.reset()
    guards = torch._dynamo.config.skip_nnmodule_hook_guards
    model, optimizer, loader = adam_setup()
    run = accel.accelerate(model, optimizer, loader, [{"compile": {"backend": "eager"}}])
    x = next(iter(loader))[0]
    plain = run.model(x).detach()
    handle = model.fc2.register_forward_hook(lambda module, args, output: output * 0)
    assert torch.count_nonzero(run.model(x)) == 0
    handle.remove()
    torch.testing.assert_close(run.model(x).detach(), plain)
    run.close()
    assert torch._dynamo.config.skip_nnmodule_hook_guards is guards  # as it was, back


def test_fused_sgd_steps_a_layer_unfrozen_mid_training():
    """torch's fused SGD raises a TypeError when some parameters of a group have momentum and others not yet."""
    result = check_equivalence(["fused_optimizer"], Case(optimizer="momentum", loop="unfreeze").build, steps=4)
    assert result.ok and result.applied == ["fused_optimizer"], result


def test_an_ema_of_a_checkpointed_model_runs_its_own_weights():
    """activation_checkpointing's forward is bound to the module, so a deep copy (AveragedModel) runs the copy."""
    model, optimizer, loader = adam_setup()
    run = accel.accelerate(model, optimizer, loader, [{"activation_checkpointing": {"modules": ["Conv2d"]}}])
    ema = torch.optim.swa_utils.AveragedModel(model)
    with torch.no_grad():
        for p in ema.module.parameters():
            p.zero_()
    x = next(iter(loader))[0]
    assert torch.count_nonzero(ema.module.conv1(x)) == 0
    assert "conv1" in run.report.row("activation_checkpointing").changes["modules"]
    run.close()


@pytest.mark.skipif(package_version("nni") is None, reason="needs nni")
def test_prune_names_your_model_and_optimizer_stale_and_says_what_to_use():
    model, optimizer, loader = adam_setup()
    with pytest.warns(StaleWarning) as caught:
        run = accel.accelerate(model, optimizer, loader, ["prune"])
    assert set(run.report.stale) == {"model", "optimizer"}
    assert "run.unwrap()" in run.report.stale["model"] and "run.optimizer" in run.report.stale["optimizer"]
    assert "stale: your model" in str(run.report)
    assert sum(issubclass(w.category, StaleWarning) for w in caught) == 2
    result = check_equivalence(["prune"], Case(loop="ema").build)
    assert result.stale and result.ok, result
    run.close()


def test_the_harness_catches_an_accelerator_that_ignores_your_learning_rate_writes():
    """A card that promises too much fails: this one steps with the learning rate it saw at apply time."""
    @dataclasses.dataclass
    class FrozenState(accel.State):
        rates: list[float]  # the learning rates at apply time

    @register
    class Frozen(accel.Accelerator):
        name, stage = "frozen_lr", Stage.STEP

        def apply(self, ctx):
            return FrozenState([group["lr"] for group in ctx.optimizer.param_groups])

        def optimizer_step(self, run, state, optimizer, proceed):
            written = [group["lr"] for group in optimizer.param_groups]
            for group, rate in zip(optimizer.param_groups, state.rates):
                group["lr"] = rate
            try:
                return proceed(optimizer)
            finally:
                for group, rate in zip(optimizer.param_groups, written):
                    group["lr"] = rate

    try:
        result = check_equivalence(["frozen_lr"], Case(optimizer="adam", loop="lr_writes").build, steps=4)
        plain_loop = check_equivalence(["frozen_lr"], Case(optimizer="adam").build, steps=4)
    finally:
        unregister("frozen_lr")
    assert any(d.startswith("weights:") for d in result.differences), result
    assert any(d.startswith("your objects:") for d in result.differences), result
    assert plain_loop.ok, plain_loop  # without the loop's writes, nothing to see


def test_a_checkpoint_dict_without_accels_keys_is_an_error_naming_the_file(tmp_path):
    """Before: {"format": 1, "plan": ...} raised KeyError."""
    path = tmp_path / "foreign.pt"
    torch.save({"format": 2, "plan": {}}, path)
    with pytest.raises(CheckpointError, match=r"foreign\.pt: incomplete accel checkpoint .*missing \['model'"):
        read(path)
    torch.save({"format": 1, "plan": {}}, path)  # accel 0.1's format is no longer read
    with pytest.raises(CheckpointError, match=r"foreign\.pt: not an accel checkpoint \(format 1; run.save writes "):
        read(path)


def test_the_run_owns_its_state():
    model, optimizer, loader = adam_setup()
    with warnings.catch_warnings():  # amp named with its dtype: on a CPU without native bf16 "auto" skips it
        warnings.filterwarnings("ignore", "amp: .* is emulated")
        run = accel.accelerate(model, optimizer, loader, [{"grad_accumulation": {"steps": 2}},
                                                          {"amp": {"dtype": "bfloat16"}}])
    train_steps(run)
    state = run.state_dict()
    assert state["step"] == 4 and set(state["accelerators"]) == {"grad_accumulation", "amp"}
    train_steps(run)
    run.load_state_dict(state)
    assert run.steps == 4 and torch.equal(next(model.parameters()), state["model"]["conv1.weight"])
    with pytest.raises(ValueError, match="are not in the model"):
        run.load_state_dict({**state, "model": {"nope": torch.zeros(1)}})
    assert run.steps == 4
    run.close()


def test_no_warning_when_nothing_went_stale():
    model, optimizer, loader = adam_setup()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleWarning)
        run = accel.accelerate(model, optimizer, loader, ["channels_last", "fused_optimizer", "amp"])
    assert run.report.stale == {} and "stale" not in str(run.report)
    run.close()
