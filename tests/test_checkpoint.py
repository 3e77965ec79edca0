"""run.save / run.load: the same run continues exactly; a different plan is refused; a crash mid-save loses nothing."""
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scripts.launching import one_rank_env

import accel
from accel.run.checkpoint import CheckpointError
from accel.run.state import saved_plan
from accel.testing import tiny_loader, tiny_model, tiny_optimizer, train_steps


def new_run(plan, seed=0):
    model = tiny_model(seed)
    loader = tiny_loader(samples=64, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(3))
    return accel.accelerate(model, tiny_optimizer(model), loader, plan=plan, device="cpu")


@pytest.mark.parametrize("plan", [[], {"compile": {"backend": "eager"}}, {"amp": {"dtype": "fp16"}}],
                         ids=["plain", "compile", "fp16-grad-scaler"])
def test_a_loaded_run_continues_exactly_like_the_saved_one(plan, tmp_path):
    run = new_run(plan)
    train_steps(run, epochs=1)
    run.save(tmp_path / "ckpt.pt")
    run_scaler_at_save = run.scaler.state_dict() if run.scaler is not None else None
    after_save = (torch.rand(3), random.random(), np.random.rand())
    train_steps(run, epochs=2)
    expected = {k: v.clone() for k, v in run.unwrap().state_dict().items()}

    other = new_run(plan, seed=1)  # other weights, fresh optimizer and counters
    summary = other.load(tmp_path / "ckpt.pt")
    assert summary["step"] == other.steps == 4 and summary["epoch"] == other.loader.epoch == 1
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(again[0], after_save[0]) and again[1:] == after_save[1:]
    if other.scaler is not None:
        assert other.scaler.state_dict() == run_scaler_at_save
    train_steps(other, epochs=2)
    assert other.steps == 12
    for name, tensor in expected.items():
        assert torch.equal(other.unwrap().state_dict()[name], tensor), name


def test_rng_states_come_back(tmp_path):
    run = new_run([])
    run.save(tmp_path / "ckpt.pt")
    first = (torch.rand(4), random.random(), np.random.rand())
    run.load(tmp_path / "ckpt.pt")
    second = (torch.rand(4), random.random(), np.random.rand())
    assert torch.equal(first[0], second[0]) and first[1:] == second[1:]


def test_the_checkpoint_holds_the_unwrapped_model_and_the_plan(tmp_path):
    run = new_run({"compile": {"backend": "eager"}})
    run.save(tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert set(state["model"]) == set(tiny_model().state_dict())  # no "_orig_mod." prefixes
    assert saved_plan(tmp_path / "ckpt.pt") == run.plan


def test_a_different_plan_is_refused_with_the_way_out(tmp_path):
    new_run({"compile": {"backend": "eager"}}).save(tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError, match="saved_plan"):
        new_run([]).load(tmp_path / "ckpt.pt")


def test_a_sharded_checkpoint_of_another_plan_is_refused_with_the_same_way_out(tmp_path, one_rank):
    """A fixed plan's refusal of a folder of shards said 'create the run with the same plan', where a file's names
    saved_plan(path): both say it in one message now, and the plan it names loads the shards."""
    run = new_run([{"grad_accumulation": {"steps": 2}}, "fsdp"])
    run.save(tmp_path / "shards")
    run.close()
    other = new_run(["fsdp"])
    with pytest.raises(CheckpointError) as refused:
        other.load(tmp_path / "shards")
    other.close()
    named = re.search(r"create the run with plan=accel\.run\.state\.saved_plan\('([^']+)'\)", str(refused.value))
    assert named, refused.value
    again = new_run(saved_plan(named.group(1)), seed=1)
    try:
        assert again.load(tmp_path / "shards")["step"] == 0 and "grad_accumulation" in again.plan.names()
    finally:
        again.close()


SAVER = textwrap.dedent("""
    import sys, torch, accel
    from accel.testing import tiny_loader, tiny_optimizer
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.Linear(2048, 512))  # ~17 MB a save
    run = accel.accelerate(model, tiny_optimizer(model), None, plan=[], device="cpu")
    run.save(sys.argv[1])
    print("saved", flush=True)
    while True:
        with torch.no_grad():
            model[0].weight.add_(1.0)
        run.save(sys.argv[1])
""")


@pytest.mark.slow
def test_a_crash_during_a_save_leaves_a_whole_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    saver = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert saver.stdout.readline().strip() == "saved"
        time.sleep(1.0)  # let it be somewhere inside one of its saves
    finally:
        saver.send_signal(signal.SIGKILL)
        saver.wait()
    state = torch.load(path, weights_only=True)  # whole: it unpickles, and its tensors are complete
    weight = state["model"]["0.weight"]
    assert weight.shape == (2048, 512) and torch.isfinite(weight).all()


def test_a_pruned_model_loads_into_its_pruned_shape(tmp_path):
    """The plan is re-applied by accelerate() before load: the weights fit the shrunk layers."""
    pytest.importorskip("nni")
    run = new_run(["prune"])
    train_steps(run, epochs=1)
    run.save(tmp_path / "ckpt.pt")
    pruned = {k: v.shape for k, v in run.unwrap().state_dict().items()}
    assert pruned["conv1.weight"] != tiny_model().conv1.weight.shape  # pruning did shrink it
    other = new_run(saved_plan(tmp_path / "ckpt.pt"), seed=1)
    other.load(tmp_path / "ckpt.pt")
    for name, tensor in run.unwrap().state_dict().items():
        assert torch.equal(other.unwrap().state_dict()[name], tensor), name
    assert {k: v.shape for k, v in other.unwrap().state_dict().items()} == pruned


def test_a_samplers_own_generator_resumes_on_the_same_batches(tmp_path):
    """A RandomSampler(generator=g) draws from g, not the loader's generator: it is saved and restored too."""
    def batches(run):
        return [label.tolist() for _, label in run.loader]

    def build(seed):
        model = tiny_model(seed)
        data = tiny_loader(samples=48, batch_size=16).dataset
        sampler = torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(5))
        loader = torch.utils.data.DataLoader(data, batch_size=16, sampler=sampler)
        return accel.accelerate(model, tiny_optimizer(model), loader, plan=[], device="cpu")

    run = build(0)
    run.save(tmp_path / "ckpt.pt")
    expected = batches(run)
    other = build(1)
    batches(other)  # its sampler's generator moves on
    other.load(tmp_path / "ckpt.pt")
    assert batches(other) == expected


def test_a_checkpoint_written_by_0_3_loads_with_each_accelerators_state():
    """tests/checkpoints/run_0_3.pt: accel 0.3 (its accelerators saved their state through hooks of their own), three
    batches into amp fp16 + grad_accumulation(steps=2) + grad_clipping on tiny_model with SGD, saved mid-accumulation.
    0.4's states save themselves under the same keys: the scaler's scale, the micro-step and its gradients load."""
    saved = torch.load(Path(__file__).parent / "checkpoints" / "run_0_3.pt", weights_only=False)
    model = tiny_model()
    plan = [{"amp": {"dtype": "float16"}}, {"grad_accumulation": {"steps": 2}}, {"grad_clipping": {"max_norm": 1.0}}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # fp16 emulated on a CPU without it
        run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.01), tiny_loader(), plan, device="cpu")
    run.load(Path(__file__).parent / "checkpoints" / "run_0_3.pt")
    assert run.steps == 3 and run.state("grad_accumulation").micro == 1
    assert run.scaler.get_scale() == saved["accelerators"]["amp"]["scaler"]["scale"]
    grads = saved["accelerators_per_rank"][0]["grad_accumulation"]["grads"]
    assert grads and all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())
    assert run.accelerator_state_dict("amp").keys() == {"scaler"}
    assert run.accelerator_state_dict("grad_accumulation").keys() == {"micro", "grads"}
    run.close()


def test_a_sharded_checkpoint_keeps_numpy_scalars_as_plain_numbers(tmp_path, monkeypatch):
    """What run.save does for a file (attack6: an np.float64 option), it does for fsdp's folder of shards too: its
    accel.pt holds Python's numbers, which run.load (torch.load with weights_only) reads back."""
    for key, value in one_rank_env().items():  # torchrun --nproc-per-node 1: a gloo group of one in this process
        monkeypatch.setenv(key, value)
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan={"fsdp": {"timeout_s": np.float64(60)}},
                           device="cpu")
    try:
        train_steps(run, epochs=1)
        run.save(tmp_path / "ckpt")
        assert run.load(tmp_path / "ckpt")["step"] == run.steps
    finally:
        run.close()
