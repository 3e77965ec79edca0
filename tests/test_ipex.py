"""ipex: the version guard (every session) and ipex.optimize for real (the nox 'ipex' session, torch 2.8)."""
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import accel
from accel.errors import PlanError
from accel.hardware import ipex_problem
from accel.testing import snapshot, tiny_loader, tiny_model, tiny_optimizer, train_steps
from accel.workloads import accuracy, digits_datasets

TORCH = torch.__version__.split("+")[0]
MISMATCHED = "2.7.0" if TORCH.startswith("2.8.") else "2.8.0"  # an IPEX that does not fit this torch


def test_version_guard_refuses_the_plan_and_the_process_lives(tmp_path):
    """An installed IPEX of the wrong version is never imported: it would os._exit(127) like the real one."""
    package = tmp_path / "intel_extension_for_pytorch"
    package.mkdir()
    (package / "__init__.py").write_text("import os\nos._exit(127)  # what IPEX does on a torch mismatch\n")
    info = tmp_path / f"intel_extension_for_pytorch-{MISMATCHED}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: intel-extension-for-pytorch\nVersion: {MISMATCHED}\n")
    script = textwrap.dedent("""
        import sys
        import accel
        from accel.testing import tiny_model, tiny_optimizer, tiny_loader
        model = tiny_model()
        try:
            accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["ipex"], device="cpu")
        except accel.PlanError as error:
            print(error)
        run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), {"ipex": {"optional": True}},
                               device="cpu")
        print("optional:", run.report.row("ipex").status, run.report.row("ipex").reason)
        print("imported:", "intel_extension_for_pytorch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], env={"PYTHONPATH": str(tmp_path), "PATH": ""},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    want = MISMATCHED.rsplit(".", 1)[0]
    assert f"ipex: IPEX {want} needs torch {want}.*, found {TORCH}" in done.stdout
    assert "optional: skipped optional, and IPEX" in done.stdout
    assert "imported: False" in done.stdout


@pytest.mark.skipif(ipex_problem() is None, reason="IPEX works here")
def test_plan_naming_ipex_fails_where_ipex_cannot_run():
    model = tiny_model()
    with pytest.raises(PlanError, match=re.escape("ipex: " + ipex_problem())):
        accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["ipex"], device="cpu")
    assert "intel_extension_for_pytorch" not in sys.modules


@pytest.mark.parametrize("ipex_dtype, amp_dtype", [("bf16", "fp16"), ("float16", "bfloat16"), ("bf16", None),
                                                   ("fp32", "bf16")])
def test_dtype_contradicting_amp_is_a_plan_error(ipex_dtype, amp_dtype):
    plan = {"ipex": {"dtype": ipex_dtype}}
    if amp_dtype:
        plan["amp"] = {"dtype": amp_dtype}
    model = tiny_model()
    with pytest.raises(PlanError, match=r"ipex\.dtype: '\w+': contradicts the plan's precision") as error:
        accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan, device="cpu")
    assert any(p.kind == "conflict" and p.field == "dtype" for p in error.value.problems)


def test_dtype_agreeing_with_amp_is_no_conflict():
    model = tiny_model()
    plan = {"ipex": {"dtype": "bfloat16"}, "amp": {"dtype": "bf16"}}
    try:
        decisions = accel.decide(model, tiny_optimizer(model), tiny_loader(), plan, device="cpu")
    except PlanError as error:  # here IPEX may be missing: that is a "missing" problem, never a conflict
        assert not [p for p in error.problems if p.kind == "conflict"], str(error)
    else:
        assert decisions.compute_dtype is torch.bfloat16


@pytest.mark.ipex
@pytest.mark.skipif(ipex_problem() is not None, reason=str(ipex_problem()))
def test_ipex_optimize_trains_on_real_digits():
    train, test = digits_datasets()
    torch.manual_seed(0)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = snapshot(model, optimizer)
    loader = torch.utils.data.DataLoader(train, batch_size=32, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    run = accel.accelerate(model, optimizer, loader, ["ipex"], device="cpu")
    row = run.report.row("ipex")
    assert row.status == "applied" and row.changes["dtype"] == "float32" and row.changes["level"] == "O1"
    assert run.model is not model and run.optimizer is not optimizer
    assert snapshot(model, optimizer).changes(before) == []  # IPEX worked on copies
    losses = train_steps(run, epochs=3)
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
    assert accuracy(run.model, test) > 0.8


@pytest.mark.ipex
@pytest.mark.skipif(ipex_problem() is not None, reason=str(ipex_problem()))
def test_ipex_follows_amp_bf16():
    """On a CPU without the instructions IPEX prepacks bf16 weights with (a Zen 3: no AVX-512), ipex.optimize raised
    an AssertionError: the model trains with its weights unpacked there, and the report says so."""
    import intel_extension_for_pytorch as ipex

    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), {"ipex": {}, "amp": {"dtype": "bf16"}},
                           device="cpu")
    packed = ipex._C.onednn_has_bf16_support()
    assert ("weights_prepack" not in run.report.row("ipex").changes) is packed, run.report.row("ipex").changes
    assert run.report.row("ipex").changes["dtype"] == "bfloat16"
    assert run.report.row("ipex").changes["why"] == "the plan's compute dtype (amp: asked for)"
    assert run.autocast_dtype is torch.bfloat16
    before = [p.detach().clone() for p in run.model.parameters()]
    losses = train_steps(run)
    assert all(loss == loss for loss in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters()))


@pytest.mark.ipex
@pytest.mark.skipif(ipex_problem() is not None, reason=str(ipex_problem()))
@pytest.mark.parametrize("model", ["spectral", "batchnorm"])
def test_setting_up_ipex_trains_nothing(model):
    """ipex.optimize reads each conv's weight: a spectral_norm weight ran its power iteration (its _u and _v moved a
    step ahead of the plain loop's, found by CI's generated cases). The buffers are put back after setting up."""
    from zoo import Case

    from accel.testing import check_equivalence

    case = Case(model=model, batch="tuple", extra="none", loader="plain", optimizer="sgd", loop="add_group")
    result = check_equivalence([{"ipex": {}}], case.build, steps=2)
    assert result.failed is None and not result.differences, result
