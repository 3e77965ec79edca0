"""run.close() ends the process group accel started, its gloo threads with it: nothing of it is left to a forked
DataLoader worker (tests/test_forked_workers.py), whose collector would otherwise join threads it does not have."""
import gc

import pytest
import torch
from scripts.launching import one_rank_env
from test_fsdp import Fails
from zoo import MODELS, Net

import accel
from accel.distributed.group import _gloo_states
from accel.plan.contract import register, unregister
from accel.testing import tiny_loader, tiny_optimizer, train_steps


def threads_before() -> list[str]:
    """The gloo threads this process has before a test's run: none, unless an earlier test in it joined a group of its
    own (torch keeps a group your script joined, and its threads, past destroy_process_group() for the process's
    life, as it does without accel)."""
    gc.collect()
    return _gloo_states()


def test_closing_a_ddp_run_ends_gloo_s_threads_even_across_a_hand_over(one_rank):
    before = threads_before()
    gc.disable()  # the closed runs stay uncollected: only close() may end the group
    try:
        model = Net(**MODELS["blocks"])
        optimizer = tiny_optimizer(model)
        first = accel.accelerate(model, optimizer, tiny_loader(), plan=["ddp"], device="cpu")
        train_steps(first)
        if _gloo_states() == before:  # torch 2.8 names no gloo thread: nothing here to count
            first.close()
            pytest.skip("this torch names no gloo worker thread (pt_gloo_runloop): nothing to count")
        second = accel.accelerate(model, optimizer, tiny_loader(), plan=["ddp"], device="cpu")  # hands over
        train_steps(second)
        second.close()
        assert not torch.distributed.is_initialized()
        assert _gloo_states() == before  # before the fix: two pt_gloo_runloop threads lived on in DDP's reducer
    finally:
        gc.enable()


def test_closing_an_fsdp_run_ends_gloo_s_threads_and_leaves_no_fsdp_hook_on_the_model(one_rank):
    before = threads_before()
    gc.disable()
    try:
        model = Net(**MODELS["blocks"])
        optimizer = tiny_optimizer(model)
        hooks = [dict(m._state_dict_pre_hooks) for m in model.modules()]
        first = accel.accelerate(model, optimizer, tiny_loader(), plan=["fsdp"], device="cpu")
        train_steps(first)  # FSDP2 adds its state_dict pre-hooks at the first forward, past what it shards
        second = accel.accelerate(model, optimizer, tiny_loader(), plan=["fsdp"], device="cpu")  # hands over
        train_steps(second)
        second.close()
        assert [dict(m._state_dict_pre_hooks) for m in model.modules()] == hooks
        assert _gloo_states() == before  # before the fix: its mesh infos, torch's mesh caches and those hooks held it
        assert set(model.state_dict()) == {name for name, _ in model.named_parameters()} | {
            name for name, _ in model.named_buffers()}
    finally:
        gc.enable()


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_a_failed_hand_over_gives_the_earlier_run_its_hold_on_the_group_back(one_rank, wrapper):
    """The next plan fails after its own wrapper: the earlier run, its changes redone, trains on through the group
    its wrapper let go of meanwhile, and its close ends the group."""
    before = threads_before()
    register(Fails)
    try:
        model = Net(**MODELS["blocks"])
        optimizer = tiny_optimizer(model)
        earlier = accel.accelerate(model, optimizer, tiny_loader(), plan=[wrapper], device="cpu")
        train_steps(earlier)
        with pytest.raises(accel.AccelerateError, match="boom"):
            accel.accelerate(model, optimizer, tiny_loader(), plan=[wrapper, "fails_last"], device="cpu")
        assert all(torch.isfinite(torch.tensor(train_steps(earlier))))
        earlier.close()
        assert _gloo_states() == before
    finally:
        unregister("fails_last")


def test_a_group_your_script_joined_stays_yours_after_ddp_and_fsdp_runs_close(monkeypatch):
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        for wrapper in ("ddp", "fsdp"):
            model = Net(**MODELS["blocks"])
            run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=[wrapper], device="cpu")
            train_steps(run)
            run.close()
            assert torch.distributed.is_initialized()  # yours, and its threads (where torch names them)
            total = torch.ones(1)
            torch.distributed.all_reduce(total)  # your group still works
            assert total.item() == 1
    finally:
        torch.distributed.destroy_process_group()
