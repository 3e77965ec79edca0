"""tune / plan="auto": candidates from hardware facts, chosen by measurement, never slower than the baseline."""
import dataclasses
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import accel
from accel.accelerator import Accelerator, Stage, register, unregister
from accel.hardware import ISA_FLAGS, probe
from accel.report import Report
from accel.testing import snapshot, tiny_loader, tiny_model, tiny_optimizer
from accel.tune import TuneResult, generate_candidates


class Wrapped(torch.nn.Module):
    """A new module around the run's model, so the user's model never carries the test's hook."""

    def __init__(self, inner, scale=1.0):
        super().__init__()
        self.inner, self.scale = inner, scale

    def forward(self, x):
        return self.inner(x) * self.scale


class Slow(Accelerator):
    """Deliberately slow: a forward pre-hook that really sleeps 0.5 s (a tiny step takes a few ms,
    a few hundred on a loaded machine)."""

    name = "slow"
    stage = Stage.KERNELS

    def apply(self, ctx):
        ctx.model = Wrapped(ctx.model)
        ctx.model.register_forward_pre_hook(lambda module, args: time.sleep(0.5))
        return {"sleeps": "0.5 s per forward"}


class Wrong(Accelerator):
    """Changes what the model computes (logits x 30): whatever its speed, its loss is off."""

    name = "wrong"
    stage = Stage.KERNELS

    def apply(self, ctx):
        ctx.model = Wrapped(ctx.model, scale=30.0)
        return {"logits": "x30"}


class Broken(Accelerator):
    """Fails while being applied, as a real accelerator can on an unusual model."""

    name = "broken"
    stage = Stage.KERNELS

    def apply(self, ctx):
        raise RuntimeError("cannot handle this model")


@pytest.fixture
def custom():
    for cls in (Slow, Wrong, Broken):
        register(cls)
    yield
    for cls in (Slow, Wrong, Broken):
        unregister(cls.name)


def objects():
    model = tiny_model()
    optimizer = tiny_optimizer(model)
    loader = tiny_loader(samples=64, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
    return model, optimizer, loader


def test_a_deliberately_slow_candidate_is_never_chosen_and_the_users_objects_end_as_they_started(custom):
    model, optimizer, loader = objects()
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(next(iter(loader))[0]), torch.zeros(16, dtype=torch.long)).backward()
    optimizer.step()  # real optimizer state to restore
    before = snapshot(model, optimizer, loader)
    generator_state = loader.generator.get_state()
    result = accel.tune(model, optimizer, loader, device="cpu", candidates=[["slow"], ["channels_last"]],
                        steps=2, budget_s=60)
    assert "slow" not in result.plan.names()
    assert [r.name for r in result.rows] == ["eager", "slow", "channels_last"]
    slow = result.row("slow")
    assert slow.status in ("measured", "stopped early")
    # every candidate starts from the same weights, optimizer state and RNG, and sees the same batches
    assert slow.losses == result.rows[0].losses[:len(slow.losses)]
    assert before.changes(snapshot(model, optimizer, loader)) == []
    assert torch.equal(loader.generator.get_state(), generator_state)


def test_only_a_slow_candidate_gives_the_empty_plan_with_the_reason(custom):
    model, optimizer, loader = objects()
    result = accel.tune(model, optimizer, loader, device="cpu", candidates=[["slow"]], steps=2, budget_s=60)
    assert result.plan.names() == []
    assert "empty plan" in result.why
    assert set(result.ablation) == {"slow"}


def test_a_candidate_that_changes_the_loss_is_refused_whatever_its_speed(custom):
    model, optimizer, loader = objects()
    result = accel.tune(model, optimizer, loader, device="cpu", candidates=[["wrong"]], steps=2, budget_s=60)
    row = result.row("wrong")
    assert row.loss_ok is False and "tolerance" in row.reason
    assert result.plan.names() == []
    assert row.losses[0] > result.rows[0].losses[0]


def test_the_budget_bounds_the_search_and_says_what_was_not_measured():
    model, optimizer, loader = objects()
    result = accel.tune(model, optimizer, loader, device="cpu", steps=1, budget_s=0)
    assert result.rows[0].status == "measured"  # the baseline is always measured
    assert {r.status for r in result.rows[1:]} == {"not measured"}
    assert all("budget" in r.reason for r in result.rows[1:])
    assert result.plan.names() == []


def test_the_result_is_data_and_prints_in_the_report():
    model, optimizer, loader = objects()
    result = accel.tune(model, optimizer, loader, device="cpu", candidates=[["channels_last"]], steps=1)
    data = result.to_dict()
    assert data["plan"] == result.plan.to_dict() and data["rows"][0]["name"] == "eager"
    assert isinstance(result, TuneResult) and "why:" in str(result)
    report = Report(device="cpu", hardware="test", tuning=result)
    assert "accel tune: chose" in str(report) and report.to_dict()["tuning"]["why"] == result.why


def test_tune_needs_an_optimizer_and_a_loader():
    with pytest.raises(ValueError, match="optimizer and a loader"):
        accel.tune(tiny_model(), None, None, device="cpu")


@settings(max_examples=30, deadline=None)
@given(isa=st.sets(st.sampled_from(ISA_FLAGS)), bf16=st.sampled_from([None, True, False]),
       conv=st.booleans(), with_optimizer=st.booleans())
def test_candidates_follow_the_hardware_facts(isa, bf16, conv, with_optimizer):
    hardware = dataclasses.replace(probe(), isa=tuple(sorted(isa)))
    model = tiny_model() if conv else torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    optimizer = tiny_optimizer(model) if with_optimizer else None
    names = {name for plan in generate_candidates(hardware, model, optimizer, "cpu", bf16) for name in plan}
    native = bool({"avx512_bf16", "amx_bf16"} & isa)
    assert ("amp" in names) == (bf16 is True or (bf16 is None and native))
    assert ("channels_last" in names) == conv
    assert ("fused_optimizer" in names) == ("fused_optimizer" in accel.accelerator.REGISTRY and with_optimizer)
    assert "threads" in names and "compile" in names


def test_bf16_is_offered_on_a_cpu_with_avx512_bf16_and_not_on_a_zen3():
    zen3 = dataclasses.replace(probe(), isa=("avx2", "fma"))
    zen4 = dataclasses.replace(probe(), isa=("avx2", "fma", "avx512f", "avx512_bf16"))
    model = tiny_model()
    assert {"amp": {"dtype": "bfloat16"}} in generate_candidates(zen4, model, None, "cpu")
    assert not any("amp" in plan for plan in generate_candidates(zen3, model, None, "cpu"))
    assert {"amp": {"dtype": "bfloat16"}} in generate_candidates(zen3, model, None, "cpu", bf16=True)


def test_a_candidate_that_fails_is_reported_and_the_search_goes_on(custom):
    model, optimizer, loader = objects()
    before = snapshot(model, optimizer, loader)
    result = accel.tune(model, optimizer, loader, device="cpu", candidates=[["broken"], ["channels_last"]], steps=1)
    assert result.row("broken").status == "failed" and "cannot handle this model" in result.row("broken").reason
    assert result.row("channels_last").status != "not measured"
    assert "broken" not in result.plan.names()
    assert before.changes(snapshot(model, optimizer, loader)) == []
