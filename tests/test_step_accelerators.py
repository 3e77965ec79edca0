"""grad_accumulation, grad_clipping and activation_checkpointing: each alone, against the loop written by hand."""
import contextlib
import copy
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scripts.launching import one_rank_env
from torch import nn
from torch.nn.modules.module import _global_forward_pre_hooks as global_pre_hooks
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.accelerators.activation_checkpointing import ActivationCheckpointing
from accel.accelerators.grad_accumulation import GradAccumulation
from accel.accelerators.grad_clipping import GradClipping
from accel.hardware import probe
from accel.modules import repeated_blocks
from accel.plan.contract import overrides
from accel.testing import apply_one, snapshot, tiny_loader, tiny_model, train_steps


def data(samples=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(samples, 1, 8, 8, generator=g), torch.randint(0, 10, (samples,), generator=g))


def close(a, b, rtol=1e-5, atol=1e-6):
    return all(torch.allclose(x, y, rtol=rtol, atol=atol) for x, y in zip(a.state_dict().values(),
                                                                       b.state_dict().values()))


# --- grad_accumulation ----------------------------------------------------------------------------------------

@settings(max_examples=6, deadline=None)
@given(steps=st.integers(2, 4), micro=st.sampled_from([4, 8]), lr=st.sampled_from([0.1, 0.01]))
def test_n_micro_batches_train_as_one_batch_n_times_larger(steps, micro, lr):
    """A model without batch statistics: accumulating N micro-batches of B equals batches of N x B (SGD)."""
    dataset = data(samples=steps * micro * 3)
    accumulated, reference = tiny_model(), tiny_model()
    run = accel.accelerate(accumulated, torch.optim.SGD(accumulated.parameters(), lr=lr, momentum=0.9),
                           DataLoader(dataset, batch_size=micro), {"grad_accumulation": {"steps": steps}},
                           device="cpu")
    skipped = []
    for x, y in run.loader:
        with run.autocast():
            loss = nn.functional.cross_entropy(run.model(x), y)
        run.backward(loss)
        skipped.append(run.step())
    assert skipped == ([True] * (steps - 1) + [False]) * 3  # run.step() says when the optimizer really stepped
    assert (run.steps, run.optimizer_steps) == (3 * steps, 3)
    plain = torch.optim.SGD(reference.parameters(), lr=lr, momentum=0.9)
    for x, y in DataLoader(dataset, batch_size=micro * steps):
        nn.functional.cross_entropy(reference(x), y).backward()
        plain.step()
        plain.zero_grad()
    assert close(accumulated, reference)


def test_a_run_resumed_mid_accumulation_continues_exactly(tmp_path):
    def new():
        model = tiny_model()
        return accel.accelerate(model, torch.optim.Adam(model.parameters(), lr=0.01),
                                DataLoader(data(), batch_size=8), {"grad_accumulation": {"steps": 3}}, device="cpu")

    def step(run, batch):
        x, y = batch
        run.backward(nn.functional.cross_entropy(run.model(x), y))
        return run.step()

    batches = list(DataLoader(data(), batch_size=8))
    straight = new()
    for batch in batches:
        step(straight, batch)
    first = new()
    for batch in batches[:4]:  # 3 + 1: one micro-batch accumulated when saved
        step(first, batch)
    first.save(tmp_path / "mid.pt")
    resumed = new()
    summary = resumed.load(tmp_path / "mid.pt")
    assert summary["step"] == 4 and resumed.state("grad_accumulation").micro == 1
    assert all(p.grad is not None for p in resumed.unwrap().parameters())
    for batch in batches[4:]:
        step(resumed, batch)
    assert close(resumed.unwrap(), straight.unwrap(), rtol=0, atol=0)


def test_a_checkpoint_that_does_not_fit_the_accumulation_is_refused_and_changes_nothing(tmp_path):
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                           {"grad_accumulation": {"steps": 3}}, device="cpu")
    with pytest.raises(ValueError, match="micro-step 5 does not fit steps=3"):
        run.load_accelerator_state("grad_accumulation", {"micro": 5, "grads": {}})
    with pytest.raises(ValueError, match="do not fit the model"):
        run.load_accelerator_state("grad_accumulation", {"micro": 1, "grads": {"conv9.weight": torch.zeros(1)}})
    assert run.state("grad_accumulation").micro == 0 and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("autocast", [True, False])
def test_under_ddp_the_first_micro_batches_do_not_synchronise(monkeypatch, autocast):
    """A real one-rank gloo group: DDP's gradient sync is off for the forward and backward of micro-batches 1..N-1,
    whether or not the loop enters run.autocast() (the run sets it after every run.step(); 2 real ranks:
    tests/test_ddp.py)."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                           ["ddp", {"grad_accumulation": {"steps": 3}}], device="cpu")
    try:
        ddp = next(m for m in run.wrappers() if isinstance(m, nn.parallel.DistributedDataParallel))
        syncing = []
        for x, y in run.loader:
            with run.autocast() if autocast else contextlib.nullcontext():
                syncing.append(ddp.require_backward_grad_sync)
                loss = nn.functional.cross_entropy(run.model(x), y)
            syncing[-1] = (syncing[-1], ddp.require_backward_grad_sync)  # the same in backward as in forward
            run.backward(loss)
            run.step()
        assert syncing == [(False, False), (False, False), (True, True), (False, False)]
        assert run.unwrap() is model and run.report.row("ddp").changes["sampler"].startswith("kept (world size 1")
    finally:
        run.close()
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("plan", [[], [{"amp": {"dtype": "bfloat16"}}]])
def test_run_autocast_only_autocasts_it_pauses_no_gradient_sync(monkeypatch, plan):
    """run.autocast() enters autocast (amp's) and nothing else: grad_accumulation has no forward_context any more,
    and DDP's gradient sync is what the run set at its last run.step(), inside and outside alike."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    assert not overrides(GradAccumulation(steps=2), "forward_context")
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                           ["ddp", {"grad_accumulation": {"steps": 2}}, *plan], device="cpu")
    try:
        ddp = next(m for m in run.wrappers() if isinstance(m, nn.parallel.DistributedDataParallel))
        assert [a.name for a in run._contexts] == [a for p in plan for a in p]
        for x, y in run.loader:
            outside = ddp.require_backward_grad_sync
            with run.autocast():
                assert ddp.require_backward_grad_sync is outside
                assert torch.is_autocast_enabled("cpu") is bool(plan)
                loss = nn.functional.cross_entropy(run.model(x), y)
            assert ddp.require_backward_grad_sync is outside and not torch.is_autocast_enabled("cpu")
            run.backward(loss)
            run.step()
    finally:
        run.close()


def test_steps_one_is_skipped_with_the_reason():
    result = apply_one(GradAccumulation())
    assert result.row.status == "skipped" and "steps >= 2" in result.row.reason


# --- grad_clipping --------------------------------------------------------------------------------------------

def hand_loop(model, optimizer, loader, clip, scaler=None, dtype=None):
    for x, y in loader:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(x), y)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        clip(model.parameters())
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("options, clip", [
    ({"max_norm": 0.05}, lambda p: nn.utils.clip_grad_norm_(p, 0.05)),
    ({"max_norm": 0.5, "norm_type": "inf"}, lambda p: nn.utils.clip_grad_norm_(p, 0.5, norm_type=float("inf"))),
    ({"value": 0.01}, lambda p: nn.utils.clip_grad_value_(p, 0.01)),
])
def test_clipping_is_the_hand_written_loops(options, clip):
    clipped, reference = tiny_model(), tiny_model()
    run = accel.accelerate(clipped, torch.optim.SGD(clipped.parameters(), lr=0.5), tiny_loader(),
                           {"grad_clipping": options}, device="cpu")
    train_steps(run)
    hand_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.5), tiny_loader(), clip)
    assert close(clipped, reference, rtol=0, atol=0)
    if "max_norm" in options:
        assert run.state("grad_clipping").last_norm > 0


def test_under_the_grad_scaler_it_unscales_first():
    """fp16 with a GradScaler on the CPU: clipping sees the true gradients, as in torch's recipe. accel warns that
    fp16 is emulated exactly where the CPU has no native fp16 (avx512_fp16 or AMX-FP16): a Xeon with AMX has it."""
    clipped, reference = tiny_model(), tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = accel.accelerate(clipped, torch.optim.SGD(clipped.parameters(), lr=0.5), tiny_loader(),
                               [{"amp": {"dtype": "fp16"}}, {"grad_clipping": {"max_norm": 0.05}}], device="cpu")
    assert any("emulated" in str(w.message) for w in caught) is not probe().native_fp16, \
        [str(w.message) for w in caught]
    assert run.report.row("grad_clipping").changes["under_grad_scaler"] == "unscaled first"
    train_steps(run)
    hand_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.5), tiny_loader(),
              lambda p: nn.utils.clip_grad_norm_(p, 0.05), scaler=torch.amp.GradScaler("cpu"), dtype=torch.float16)
    assert close(clipped, reference, rtol=0, atol=0)
    assert run.state("grad_clipping").last_norm < 100  # a true norm, not one scaled by 65536


def test_with_accumulation_it_clips_the_accumulated_gradient_once_per_step():
    norms = []
    original = nn.utils.clip_grad_norm_
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                           [{"grad_clipping": {"max_norm": 1.0}}, {"grad_accumulation": {"steps": 2}}], device="cpu")
    assert run.plan.names() == ["grad_accumulation", "grad_clipping"]
    try:
        nn.utils.clip_grad_norm_ = lambda *a, **k: norms.append(1) or original(*a, **k)
        train_steps(run)
    finally:
        nn.utils.clip_grad_norm_ = original
    assert len(norms) == 2 and run.optimizer_steps == 2


def test_clipping_needs_one_limit():
    with pytest.raises(accel.PlanError, match="give max_norm .* or value"):
        apply_one(GradClipping())
    with pytest.raises(accel.PlanError, match="give max_norm"):
        apply_one(GradClipping(max_norm=1.0, value=0.5))
    with pytest.raises(accel.PlanError, match="norm_type.*must be > 0 or 'inf'"):
        accel.Plan({"grad_clipping": {"max_norm": 1.0, "norm_type": -2}})


# --- activation_checkpointing ---------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1)
        self.norm = nn.BatchNorm2d(width)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return x + self.drop(torch.relu(self.norm(self.conv(x))))


class Blocks(nn.Module):
    """Repeated blocks with BatchNorm and dropout: what checkpointing must recompute without changing a thing."""

    def __init__(self, width=4):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.blocks = nn.Sequential(Block(width), Block(width), Block(width))
        self.head = nn.Linear(width * 64, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.blocks(self.stem(x)), 1))


def test_checkpointed_blocks_train_exactly_like_the_plain_loop():
    torch.manual_seed(0)
    user = Blocks()
    reference = copy.deepcopy(user)
    before = snapshot(user)
    run = accel.accelerate(user, torch.optim.Adam(user.parameters(), lr=0.01), tiny_loader(),
                           ["activation_checkpointing"], device="cpu")
    assert run.report.row("activation_checkpointing").changes["modules"] == "3 x Block: blocks.0, blocks.1, blocks.2"
    assert sum("forward" in m.__dict__ for m in user.modules()) == 3  # your blocks, checkpointed (undone by close)
    assert before.changes(snapshot(user), how=False) == []
    torch.manual_seed(1)
    train_steps(run, epochs=2)
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    torch.manual_seed(1)
    reference.train()
    for _ in range(2):
        for x, y in tiny_loader():
            nn.functional.cross_entropy(reference(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    for (name, a), b in zip(user.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name  # weights, and BatchNorm statistics counted once per batch
    assert run.unwrap() is user
    run.close()
    changes = before.changes(snapshot(user), how=True)
    assert changes and not [c for c in changes if "hooks or forwards" in c], changes  # trained values, no hook left
    assert not any("forward" in m.__dict__ for m in user.modules())


def test_named_modules_are_checked_and_a_model_without_blocks_is_skipped_with_the_reason():
    assert repeated_blocks(Blocks()) == {"Block"}
    with pytest.raises(accel.PlanError, match=r"no module of class \['Bottleneck'\].*e\.g\. Block"):
        apply_one(ActivationCheckpointing(modules=["Bottleneck"]), model=Blocks())
    skipped = apply_one(ActivationCheckpointing())
    assert skipped.row.status == "skipped" and "no repeated block" in skipped.row.reason
    chosen = apply_one(ActivationCheckpointing(modules=["Conv2d"]), model=Blocks())
    assert chosen.row.changes["modules"].startswith("4 x Conv2d: ")


def test_in_eval_and_without_gradients_the_forward_runs_as_it_is():
    torch.manual_seed(0)
    model = Blocks()
    run = accel.accelerate(model, None, None, ["activation_checkpointing"], device="cpu")
    run.model.eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(run.model(x), model.eval()(x))


def test_your_own_unscale_before_clipping_under_fp16_unscales_once():
    """Before: amp unscaled on every call, so your run.unscale_gradients() (to log a norm, as docs/migration.md
    shows) and grad_clipping's made the GradScaler raise 'unscale_() has already been called'."""
    norms = []
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                           plan={"amp": {"dtype": "float16"}, "grad_clipping": {"max_norm": 0.5}}, device="cpu")
    assert run.scaler is not None
    for x, y in run.loader:
        with run.autocast():
            loss = nn.functional.cross_entropy(run.model(x), y)
        run.backward(loss)
        run.unscale_gradients()
        norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
        run.step()
    clipped = run.state("grad_clipping").last_norm
    assert len(norms) == len(run.loader) and float(clipped) == pytest.approx(norms[-1])  # true norms, once
    run.close()


def test_auto_measures_your_model_after_the_earlier_run_on_it_is_undone():
    """Before: plan="auto" measured copies of a model that still carried the earlier run's hooks. The plan's
    resolver (accel.tune's, for plan="auto" apart) is called once the earlier run is undone."""
    import accel.api

    model, hooks = tiny_model(), len(global_pre_hooks)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                           plan=["channels_last"], device="cpu")
    assert len(global_pre_hooks) == hooks + 1  # channels_last's
    seen = []

    def resolve(model_, *args):
        seen.append(len(global_pre_hooks))
        return [], None  # the plan the search would pick; the ordering is what is checked

    again = accel.api.accelerate(model, run.optimizer, tiny_loader(), device="cpu", resolve=resolve)
    assert seen == [hooks] and run.closed
    again.close()
