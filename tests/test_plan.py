"""Plans: every accepted form, the library's order, and every problem reported together."""
from dataclasses import dataclass

import pytest
import torch

import accel
from accel import Accelerator, Options, Plan, PlanError, Skip, Stage, State, option
from accel.hardware import ipex_problem
from accel.testing import apply_one, snapshot, tiny_loader, tiny_model, tiny_optimizer

CORE = ["threads", "loader", "amp", "channels_last", "compile"]


def test_list_dict_and_plan_forms_are_the_same_plan():
    as_list = Plan(["compile", {"loader": {"num_workers": 1}}, "threads"])
    as_dict = Plan({"threads": {}, "loader": {"num_workers": 1}, "compile": None})
    assert as_list == as_dict == Plan(as_list)
    assert as_list.names() == ["threads", "loader", "compile"]


def test_to_dict_round_trips_with_the_options_the_user_set():
    plan = Plan([{"compile": {"mode": "max-autotune", "fullgraph": True}}, "amp"])
    assert plan.to_dict() == {"amp": {}, "compile": {"mode": "max-autotune", "fullgraph": True}}
    assert Plan(plan.to_dict()) == plan


def test_toml_and_yaml_files(tmp_path):
    toml = tmp_path / "plan.toml"
    toml.write_text('[threads]\n\n[loader]\nnum_workers = 2\n\n[compile]\nmode = "default"\n\n[amp]\n')
    yaml = tmp_path / "plan.yaml"
    yaml.write_text("threads:\nloader:\n  num_workers: 2\ncompile:\n  mode: default\namp: {}\n")
    listed = tmp_path / "list.yaml"
    listed.write_text("- amp\n- threads\n- loader: {num_workers: 2}\n- compile: {mode: default}\n")
    assert Plan(toml) == Plan(str(yaml)) == Plan(listed)
    assert Plan(toml).to_dict()["loader"] == {"num_workers": 2}


def test_false_switches_an_accelerator_off(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text("amp = false\n[threads]\n")
    assert Plan(path).names() == ["threads"]


def test_order_is_by_stage_not_by_listing():
    names = Plan(["compile", "amp", "channels_last", "loader", "threads"]).names()
    assert names == ["threads", "loader", "channels_last", "amp", "compile"]
    stages = [accel.plan.contract.REGISTRY[n].stage for n in names]
    assert stages == sorted(stages)


def test_unknown_names_and_options_get_suggestions():
    with pytest.raises(PlanError) as error:
        Plan(["chanels_last", {"compile": {"fullgrap": True}}])
    text = str(error.value)
    assert "chanels_last: unknown accelerator; did you mean 'channels_last'?" in text
    assert "compile.fullgrap: unknown option; did you mean 'fullgraph'?" in text
    assert [p.kind for p in error.value.problems] == ["unknown", "unknown"]


def test_bad_values_name_accelerator_field_value_and_what_is_allowed():
    with pytest.raises(PlanError) as error:
        Plan({"compile": {"mode": "fastest"}, "loader": {"num_workers": -1, "pin_memory": "yes"},
              "amp": {"dtype": "float8"}, "threads": {"threads": True}})
    problems = {(p.accelerator, p.field): p for p in error.value.problems}
    assert set(problems) == {("compile", "mode"), ("loader", "num_workers"), ("loader", "pin_memory"),
                             ("amp", "dtype"), ("threads", "threads")}
    assert problems["compile", "mode"].value == "fastest"
    assert "'max-autotune'" in problems["compile", "mode"].allowed
    assert "must be >= 0" in str(problems["loader", "num_workers"])
    assert "wrong type bool" in str(problems["threads", "threads"])


def test_duplicates_and_malformed_entries():
    with pytest.raises(PlanError) as error:
        Plan(["amp", {"amp": {"dtype": "bf16"}}, 42, {"loader": 3}])
    messages = [str(p) for p in error.value.problems]
    assert any("listed more than once" in m for m in messages)
    assert any("42" in m and "not a plan entry" in m for m in messages)
    assert any(m.startswith("loader: 3: options must be a mapping") for m in messages)


def test_a_string_that_is_not_a_file_is_explained():
    with pytest.raises(PlanError, match=r"a one-accelerator plan is written \['compile'\]"):
        Plan("compile")


def test_plan_and_context_problems_are_reported_together_and_nothing_is_touched():
    model, loader = tiny_model(), tiny_loader()
    optimizer = tiny_optimizer(model)
    before = snapshot(model, optimizer, loader)
    with pytest.raises(PlanError) as error:
        accel.accelerate(model, optimizer, None, plan=["loader", {"compile": {"mode": "bogus"}}, "amp"])
    assert {p.accelerator for p in error.value.problems} == {"loader", "compile"}
    with pytest.raises(PlanError) as error:
        accel.accelerate(model, optimizer, loader, plan=["amp"], device="warp-drive")
    assert error.value.problems[0].accelerator == "device"
    assert before.changes(snapshot(model, optimizer, loader)) == []


def test_conflicts_are_plan_errors():
    model = tiny_model()
    with pytest.raises(PlanError, match="grad scaler is only for fp16"):
        accel.accelerate(model, None, None, plan={"amp": {"dtype": "bfloat16", "grad_scaler": True}})
    with pytest.raises(PlanError, match="either mode or options"):
        accel.accelerate(model, None, None, plan={"compile": {"mode": "default", "options": {"max_autotune": True}}})
    with pytest.raises(PlanError, match="unknown compile backend"):
        accel.accelerate(model, None, None, plan={"compile": {"backend": "nope"}})


def test_a_compile_backend_an_optional_package_registers_is_refused_with_that_package_s_reason():
    """compile's backend 'ipex' exists once IPEX imports; where it cannot, the PlanError says why (ipex_problem), not
    'unknown compile backend'."""
    problem = ipex_problem()
    if problem is None:
        pytest.skip("IPEX imports here: its backend is usable")
    with pytest.raises(PlanError) as raised:
        accel.accelerate(tiny_model(), None, None, plan={"compile": {"backend": "ipex"}})
    assert [(p.field, p.message) for p in raised.value.problems if p.accelerator == "compile"] == [("backend", problem)]


@dataclass(frozen=True, kw_only=True)
class _HalveOptions(Options):
    factor: float = option(0.5, (float,), check=lambda v: None if 0 < v <= 1 else "must be in (0, 1]")


class _Halve(Accelerator[_HalveOptions, State]):
    """A user-written accelerator: halves every weight (model surgery, so it runs before kernels)."""

    name = "halve"
    stage = Stage.SURGERY
    requires = ()

    def apply(self, ctx):
        if self.config.factor == 1.0:
            raise Skip("factor 1.0 changes nothing")
        with torch.no_grad():
            for p in ctx.model.parameters():
                p.mul_(self.config.factor)
        return {"factor": self.config.factor}


@pytest.fixture
def halve():
    accel.register(_Halve)
    yield _Halve
    accel.unregister("halve")


def test_custom_accelerator_is_validated_ordered_and_reported(halve):
    assert Plan(["amp", "halve", "threads"]).names() == ["threads", "halve", "amp"]
    with pytest.raises(PlanError, match=r"halve.factor: 2.0: must be in \(0, 1\]"):
        Plan({"halve": {"factor": 2.0}})
    result = apply_one(halve(factor=0.25))
    assert result.row.status == "applied" and result.row.changes == {"factor": 0.25}
    assert "model.conv1.weight: values changed" in result.changed
    skipped = apply_one(halve(factor=1.0))
    assert skipped.row.status == "skipped" and skipped.row.reason == "factor 1.0 changes nothing"
    assert skipped.changed == []


def test_register_refuses_nameless_and_clashing_accelerators():
    class Nameless(Accelerator):
        stage = Stage.KERNELS

    with pytest.raises(TypeError):
        accel.register(Nameless)

    class Clash(Accelerator):
        name = "amp"
        stage = Stage.PRECISION

    with pytest.raises(ValueError, match="already registered"):
        accel.register(Clash)


def test_missing_package_fails_unless_optional():
    class NeedsGhost(Accelerator):
        name = "ghost"
        stage = Stage.KERNELS
        requires = ("a-package-that-does-not-exist",)

        def apply(self, ctx):
            return {}

    model = tiny_model()
    with pytest.raises(PlanError, match="needs the package 'a-package-that-does-not-exist'"):
        accel.accelerate(model, None, None, plan=[NeedsGhost()])
    run = accel.accelerate(model, None, None, plan=[NeedsGhost(optional=True)])
    row = run.report.row("ghost")
    assert row.status == "skipped" and "optional, and needs the package" in row.reason


def test_decide_works_inside_your_compiled_model_as_accelerate_does():
    """accelerate() peels your torch.compile wrapper and plans inside it; decide() answers the same, not a problem."""
    model = tiny_model()
    decisions = accel.decide(torch.compile(model, backend="eager"), None, None, ["compile"], device="cpu")
    assert decisions.device == torch.device("cpu")
