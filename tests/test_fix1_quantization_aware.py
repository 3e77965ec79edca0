"""Quantization-aware training (torch.ao.quantization's observers and fake quantizers) under activation_checkpointing
and run.save/run.load: the observers keep empty or one-element statistics until they first observe, and resize them
in place (a first pass) or in their own _load_from_state_dict (a resume). Each test failed before its fix."""
import copy
import warnings

import pytest
import torch
from torch import nn
from torch.ao.quantization import default_fused_act_fake_quant, default_fused_per_channel_wt_fake_quant

import accel
from accel import modules
from accel.errors import CheckpointError


class FakeQuantLinear(nn.Module):
    """A layer quantization-aware as torch.ao.nn.qat's Linear: its weight fake-quantized per channel (min_val empty,
    scale one element until the first pass resizes them) and its output per tensor, called in its own forward."""

    def __init__(self, size: int):
        super().__init__()
        self.linear = nn.Linear(size, size)
        self.weight_fake_quant = default_fused_per_channel_wt_fake_quant()
        self.output_fake_quant = default_fused_act_fake_quant()

    def forward(self, x):
        weight = self.weight_fake_quant(self.linear.weight)
        return self.output_fake_quant(torch.relu(nn.functional.linear(x, weight, self.linear.bias)))


class Block(nn.Module):
    def __init__(self, size: int = 8):
        super().__init__()
        self.a, self.b = FakeQuantLinear(size), FakeQuantLinear(size)

    def forward(self, x):
        return x + self.b(self.a(x))


class Positions(nn.Module):
    """A block keeping the positions it last saw, an expanded tensor (as Hugging Face's position_ids), rebound in
    every forward."""

    def __init__(self, size: int = 8):
        super().__init__()
        self.linear = nn.Linear(size, size)
        self.positions = torch.arange(size).expand(1, size)

    def forward(self, x):
        self.positions = torch.arange(x.shape[-1]).expand(x.shape[0], -1)
        return x + torch.tanh(self.linear(x + self.positions))


class Counting(nn.Module):
    """A block counting its calls in a tensor it makes, and adds to, under torch.inference_mode (an inference tensor:
    only inference_mode writes it)."""

    def __init__(self, size: int = 8):
        super().__init__()
        self.linear = nn.Linear(size, size)
        self.calls = None

    def forward(self, x):
        with torch.inference_mode():
            self.calls = torch.zeros(()) if self.calls is None else self.calls
            self.calls += 1
        return x + torch.tanh(self.linear(x)) * self.calls.clone()


def trained_state(model: nn.Module, plan, steps: int = 3) -> dict:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None, plan, device="cpu")
    try:
        for _ in range(steps):
            run.backward(run.model(x).square().mean())
            run.step()
        assert plan == [] or run.report.row("activation_checkpointing").status == "applied", run.report
    finally:
        run.close()
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("make", [lambda: nn.Sequential(Block(), Block(), nn.Linear(8, 2)),
                                  lambda: nn.Sequential(Positions(), Positions(), nn.Linear(8, 2)),
                                  lambda: nn.Sequential(Counting(), Counting(), nn.Linear(8, 2))],
                         ids=["observers", "expanded", "inference"])
def test_blocks_whose_first_pass_resizes_or_rebinds_their_state_recompute_as_the_plain_loop(make):
    """Before: the recomputation copied an observer's empty min_val into the buffer its first pass had resized
    (and an expanded tensor the pass rebound into itself): RuntimeError in the first backward."""
    torch.manual_seed(0)
    plain = make()
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing runs unchecked
        mine = trained_state(ours, ["activation_checkpointing"])
    want = trained_state(plain, [])
    assert want.keys() == mine.keys() and [k for k in want if not torch.equal(want[k], mine[k])] == []


def test_observers_and_fake_quantizers_are_no_blocks():
    """Before: prepare_qat's FakeQuantize modules (each holding its observer) and a FloatFunctional holding its
    activation_post_process were 'repeated blocks', checkpointed by modules='auto'."""
    model = nn.Sequential(torch.ao.quantization.QuantStub(), nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3),
                          torch.ao.quantization.DeQuantStub())
    model.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
    torch.ao.quantization.prepare_qat(model.train(), inplace=True)
    assert modules.repeated_blocks(model) == set() and modules.repeated_blocks(model, 1) == set()
    together = nn.Sequential(Block(), Block())
    assert modules.repeated_blocks(together) == {"Block", "FakeQuantLinear"}  # layers, fake-quantized or not


def qat_model(out: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), nn.BatchNorm1d(8), nn.Linear(8, out))


def test_a_qat_run_resumes_from_its_own_checkpoint_and_another_model_s_is_refused_untouched(tmp_path):
    """Before: run.load compared the saved shapes with the fresh model's, whose fake quantizers hold a one-element
    scale and empty min_val until they first observe (their own _load_from_state_dict resizes them, as
    load_state_dict does): 'shapes differ'. A Linear's weight, a BatchNorm of another size stay refused."""
    from accel.run.checkpoint_fit import model_problems

    model = qat_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None, ["threads"], device="cpu")
    try:
        run.backward(run.model(torch.randn(4, 8)).square().mean())
        run.step()
        run.save(tmp_path / "qat.pt")
    finally:
        run.close()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    for out, fits in ((2, True), (3, False)):
        fresh = qat_model(out)
        before = {k: v.clone() for k, v in fresh.state_dict().items()}
        run = accel.accelerate(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), None, ["threads"], device="cpu")
        try:
            if fits:
                run.load(tmp_path / "qat.pt")
            else:
                with pytest.raises(CheckpointError, match=r"shapes differ .*2\.weight \(2, 8\) vs \(3, 8\)"):
                    run.load(tmp_path / "qat.pt")
        finally:
            run.close()
        now = fresh.state_dict()
        assert all(torch.equal(v, now[k]) for k, v in (trained if fits else before).items())
    norm, other = nn.BatchNorm1d(8), nn.BatchNorm1d(4)  # a module loading itself that refuses another shape
    assert "running_mean (4,) vs (8,)" in model_problems(other.state_dict(), norm.state_dict(), norm)[0]
    assert norm.running_mean.shape == (8,)
