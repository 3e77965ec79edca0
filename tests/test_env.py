"""accel env: hardware, runtime and every accelerator's availability with the reason, as data and as text."""
import json

import pytest

import accel
from accel.cli import main
from accel.cli.env import environment
from accel.errors import PlanError, Problem
from accel.hardware import EXTRAS, ipex_problem, package_version, probe
from accel.plan.contract import REGISTRY, Accelerator, Stage, register, unregister
from accel.workloads import tiny_model


class NeedsPackage(Accelerator):
    name = "needs_package"
    stage = Stage.KERNELS
    requires = ("surely-not-an-installed-package",)


class RefusesCpu(Accelerator):
    name = "refuses_cpu"
    stage = Stage.KERNELS

    def check(self, ctx):
        return [Problem(self.name, f"cannot run on {ctx.device.type}", kind="missing")]


@pytest.fixture
def custom():
    for cls in (NeedsPackage, RefusesCpu):
        register(cls)
    yield
    for cls in (NeedsPackage, RefusesCpu):
        unregister(cls.name)


def test_environment_reports_every_accelerator_with_the_reason(custom):
    data = environment()
    assert set(data["accelerators"]) == set(REGISTRY)
    for entry in data["accelerators"].values():
        assert isinstance(entry["available"], bool) and entry["reason"]
        assert not {"optimizer", "loader"} & set(entry["requires"]), entry  # objects it needs, not packages
    assert data["accelerators"]["needs_package"] == {
        "stage": "kernels", "requires": {"surely-not-an-installed-package": None}, "available": False,
        "reason": "needs the package 'surely-not-an-installed-package', which is not installed "
                  "(pip install surely-not-an-installed-package)"}
    assert data["accelerators"]["refuses_cpu"]["reason"] == "cannot run on cpu"
    assert data["accelerators"]["channels_last"]["available"] is True
    json.loads(json.dumps(data, default=str))


def test_environment_matches_the_hardware_probe_and_the_ipex_guard():
    data = environment()
    hardware = probe()
    assert data["hardware"]["physical_cores"] == hardware.physical_cores
    assert data["hardware"]["native_bf16"] == hardware.native_bf16
    assert data["hardware"]["openmp"] == hardware.openmp
    problem = ipex_problem()
    assert data["runtime"]["ipex"] == problem if problem else "safe to import" in data["runtime"]["ipex"]
    if problem is not None and "ipex" in REGISTRY:
        assert data["accelerators"]["ipex"]["available"] is False


def test_cli_env_prints_json_and_text(capsys):
    assert main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware"]["cpus_allowed"] and data["accelerators"]
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert "physical cores" in text and "accelerators (plan-time checks" in text
    for name in REGISTRY:
        assert name in text


def test_a_missing_package_is_named_with_the_extra_that_installs_it():
    """The PlanError itself names accel's extra (pyproject.toml's optional deps), not the bare package, so prune's
    row of `accel env` says what ipex's says."""
    missing = [distribution for distribution in EXTRAS if package_version(distribution) is None]
    if not missing:
        pytest.skip("every optional package accel has an extra for is installed here")

    class NeedsExtra(Accelerator):
        name = "needs_extra"
        stage = Stage.KERNELS
        requires = (missing[0],)

    model = tiny_model()
    with pytest.raises(PlanError) as raised:
        accel.accelerate(model, None, None, plan=[NeedsExtra()])
    assert [p.allowed for p in raised.value.problems] == [f"pip install 'accel[{EXTRAS[missing[0]]}]'"]
