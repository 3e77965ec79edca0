"""pytorch/examples super_resolution (and every script that does ``torch.save(model, path)``) pickles the whole module
mid-training. Under a plan the file must be the one the plain loop writes: loadable where accel is not installed,
and the model it gives must run as the user's model, not as accel's run. Before: channels_last kept its input
conversion as forward pre-hooks on the user's convolutions, a module's attribute that pickle writes (and deepcopy
copies): the file named accel.accelerators.channels_last.to_channels_last, did not load without accel, and the loaded
model converted its inputs for ever, with no run left to close.

And accel.testing.check_equivalence cannot test such a loop at all: its trace registers a lambda as a forward hook on
the model (accel/testing/trace.py, train()), which pickle refuses, in the plain run as in the accelerated one."""
import copy
import io
import subprocess
import sys
import warnings

import pytest
import torch

import accel
from accel.testing import Loop, Setup, check_equivalence

from .examples_super_resolution import Net, build

PLANS = [["threads"], ["channels_last"], ["activation_checkpointing"], ["fused_optimizer"],
         [{"amp": {"dtype": "bfloat16"}}], [{"grad_accumulation": {"steps": 2}}]]


def saved_mid_training(plan) -> bytes:
    """The super_resolution port's objects, one step through the plan, then torch.save(model) of the user's model."""
    setup = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan=plan, device="cpu")
    try:
        input, target = next(iter(run.loader))
        with run.autocast():
            loss = torch.nn.functional.mse_loss(run.model(input).float(), target)
        run.backward(loss)
        run.step()
        file = io.BytesIO()
        torch.save(setup.model, file)
        return file.getvalue()
    finally:
        run.close()


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_a_model_pickled_mid_training_is_the_users_model_alone(plan):
    data = saved_mid_training(plan)
    loaded = torch.load(io.BytesIO(data), weights_only=False)
    assert isinstance(loaded, Net)
    added = {name: (dict(m._forward_pre_hooks), dict(m._forward_hooks)) for name, m in loaded.named_modules()
             if m._forward_pre_hooks or m._forward_hooks or "forward" in vars(m)}
    assert not added, added
    assert b"accel." not in data


@pytest.mark.slow  # (a new interpreter imports torch)
def test_a_model_pickled_under_channels_last_loads_where_accel_is_not_installed(tmp_path):
    path = tmp_path / "model_epoch_1.pth"
    path.write_bytes(saved_mid_training(["channels_last"]))
    code = ("import sys, types, torch; sys.modules['accel'] = None\n"  # no accel: the corpus's Net, defined here
            "class Net(torch.nn.Module): pass\n"
            "sys.modules['corpus'] = types.ModuleType('corpus')\n"
            "sys.modules['corpus.examples_super_resolution'] = m = types.ModuleType('m'); m.Net = Net\n"
            f"torch.load({str(path)!r}, weights_only=False)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-400:]


class Checkpoints(Loop):
    """super_resolution's checkpoint(): the whole module pickled after a step."""

    def after(self, step, held, run, loss):
        torch.save(held.model, io.BytesIO())


def test_check_equivalence_can_test_a_loop_that_pickles_its_model():
    def build_pickling():
        setup = build()
        return Setup(setup.model, setup.optimizer, setup.loader, loop=Checkpoints())

    assert check_equivalence(["threads"], build_pickling, steps=1).ok


def test_a_copy_made_mid_training_runs_as_the_users_model_and_the_run_only_its_own():
    """timm's ModelEmaV2 deep-copies the model mid-training: the copy carries nothing of the run and its convolutions
    see the plain loop's memory order, while the run's convert theirs until run.close()."""
    setup = build()
    run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan=["channels_last"], device="cpu")
    copied = copy.deepcopy(setup.model)
    assert not [m for m in copied.modules() if m._forward_pre_hooks or m._forward_hooks]
    seen = []
    for model in (copied, setup.model):
        model.conv2.register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    input, _ = next(iter(run.loader))
    copied(input), run.model(input)
    run.close()
    setup.model(input)
    assert seen == [True, False, True]
