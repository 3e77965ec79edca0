"""The accelerator lifecycle: decisions before any stage, order from declarations, rollback, hooks, per-run state.
The architecture's own rules are tests/test_layout.py's."""
import dataclasses
import os
from dataclasses import dataclass

import pytest
import torch
from torch.nn.modules.module import _global_forward_pre_hooks as global_pre_hooks

import accel
from accel import Accelerator, Capability, Options, PlanError, Skip, Stage, State, option
from accel.hardware import probe
from accel.plan.contract import register, unregister
from accel.testing import snapshot, tiny_loader, tiny_model, tiny_optimizer, train_steps


def user_accelerator(name, stage, **attributes):
    return type(name.title(), (Accelerator,), {"name": name, "stage": stage, **attributes})


@pytest.fixture
def registered():
    names = []

    def add(cls):
        register(cls)
        names.append(cls.name)
        return cls

    yield add
    for name in names:
        unregister(name)


# --- decisions are made before any stage runs -----------------------------------------------------------------

def test_every_rank_of_a_simulated_multi_gpu_launch_decides_its_own_device_before_any_stage(monkeypatch):
    """Four local ranks on a node with four GPUs: each rank's decisions name its own cuda device, and every
    accelerator already sees it in decide(), before stage 0. Only the probe is mocked (there is no GPU here)."""
    four_gpus = dataclasses.replace(probe(), devices={"cpu": 1, "cuda": 4})
    monkeypatch.setattr(accel.hardware, "probe", lambda: four_gpus)
    monkeypatch.setattr(accel.api, "probe", lambda: four_gpus)
    seen = []

    class Recorder(Accelerator):
        name, stage = "recorder", Stage.ENVIRONMENT

        def decide(self, ctx):
            seen.append((str(ctx.device), ctx.decisions.rank))

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29511")
    for local_rank in range(4):
        for key, value in {"RANK": 4 + local_rank, "WORLD_SIZE": 8, "LOCAL_RANK": local_rank,
                           "LOCAL_WORLD_SIZE": 4}.items():
            monkeypatch.setenv(key, str(value))
        decisions = accel.decide(tiny_model(), tiny_optimizer(tiny_model()), tiny_loader(), [Recorder(), "ddp"],
                                 device="auto")
        assert decisions.device == torch.device("cuda", local_rank)
        assert decisions.by["device"] == "accel" and "local rank" in decisions.why["device"]
    assert seen == [(f"cuda:{r}", 4 + r) for r in range(4)]


def test_the_model_is_on_the_decided_device_before_stage_zero_applies():
    where = []

    class Early(Accelerator):
        name, stage = "early", Stage.ENVIRONMENT

        def apply(self, ctx):
            where.append((next(ctx.model.parameters()).device, ctx.device))
            return {}

    accel.accelerate(tiny_model(), None, None, [Early()], device="cpu")
    assert where == [(torch.device("cpu"), torch.device("cpu"))]


def test_a_device_that_is_not_here_is_a_plan_error_naming_what_was_found():
    model = tiny_model()
    before = snapshot(model)
    if "cuda" in probe().devices:
        pytest.skip("this machine has cuda")
    with pytest.raises(PlanError, match=r"device: 'cuda': there is no cuda device here \(found: cpu\)"):
        accel.accelerate(model, None, None, ["amp"], device="cuda")
    assert before.changes(snapshot(model)) == []


def test_decisions_are_typed_read_by_later_stages_and_conflicting_ones_refused(registered):
    seen = {}

    @registered
    class Reader(Accelerator):  # an early stage reading a later stage's decision
        name, stage = "reader", Stage.ENVIRONMENT

        def check(self, ctx):
            seen["dtype"] = ctx.decisions.compute_dtype
            return []

    decisions = accel.decide(tiny_model(), tiny_optimizer(tiny_model()), tiny_loader(),
                             ["reader", {"amp": {"dtype": "bfloat16"}}], device="cpu")
    assert seen["dtype"] is torch.bfloat16 and decisions.by["compute_dtype"] == "amp"

    @registered
    class Half(Accelerator):
        name, stage = "half", Stage.PRECISION

        def decide(self, ctx):
            ctx.decide("compute_dtype", torch.float16, "my own precision")

    with pytest.raises(PlanError, match="half.compute_dtype: decides compute_dtype=torch.float16, but amp decided"):
        accel.decide(tiny_model(), None, None, ["half", {"amp": {"dtype": "bfloat16"}}], device="cpu")


def test_an_accelerator_that_skips_in_decide_takes_its_decisions_back(registered):
    @registered
    class Shy(Accelerator):
        name, stage = "shy", Stage.ENVIRONMENT

        def decide(self, ctx):
            ctx.decide("threads", 1, "would like one")
            raise Skip("changed its mind")

    run = accel.accelerate(tiny_model(), None, None, ["shy"], device="cpu")
    assert run.decisions.threads is None and "threads" not in run.decisions.by
    assert run.report.row("shy").reason == "changed its mind"


# --- order, conflicts ------------------------------------------------------------------------------------------

def test_order_follows_declared_constraints_inside_a_stage_not_names(registered):
    registered(user_accelerator("zeta", Stage.KERNELS, provides=("model.first",)))
    registered(user_accelerator("alpha", Stage.KERNELS, after=("model.first",)))
    registered(user_accelerator("mid", Stage.KERNELS, before=("alpha",), after=("zeta",)))
    assert accel.Plan(["alpha", "mid", "zeta", "amp", "threads"]).names() == ["threads", "zeta", "mid", "alpha", "amp"]
    # the built-ins' own declarations
    assert accel.Plan(["grad_clipping", "grad_accumulation"]).names() == ["grad_accumulation", "grad_clipping"]
    assert accel.Plan(["activation_checkpointing", "channels_last"]).names() == ["channels_last",
                                                                                 "activation_checkpointing"]


def test_cycles_and_constraints_against_the_stages_are_plan_errors(registered):
    registered(user_accelerator("one", Stage.KERNELS, after=("two",)))
    registered(user_accelerator("two", Stage.KERNELS, after=("one",)))
    registered(user_accelerator("late", Stage.ENVIRONMENT, after=("amp",)))
    with pytest.raises(PlanError, match="form a cycle"):
        accel.Plan(["one", "two"])
    with pytest.raises(PlanError, match=r"late.after: declares after='amp'.*stage precision comes after environment"):
        accel.Plan(["late", "amp"])


def test_conflicts_are_declared_by_capability_and_refused_together(registered):
    registered(user_accelerator("my_fused_step", Stage.KERNELS, provides=(Capability.OPTIMIZER_UPDATE,),
                                conflicts=(Capability.OPTIMIZER_UPDATE,)))
    with pytest.raises(PlanError) as error:
        accel.Plan(["my_fused_step", "fused_optimizer"])
    assert len(error.value.problems) == 1 and "conflicts with" in str(error.value)


def test_register_checks_the_declarations():
    with pytest.raises(TypeError, match="must be a tuple of strings"):
        register(user_accelerator("bad", Stage.KERNELS, after="amp"))
    with pytest.raises(TypeError, match="put the example options on its Options class"):
        register(user_accelerator("bad", Stage.KERNELS, example={"steps": 2}))


# --- rollback ----------------------------------------------------------------------------------------------------

class Breaks(Accelerator):
    name, stage = "breaks", Stage.STEP

    def apply(self, ctx):
        raise RuntimeError("no")


def test_a_failure_mid_apply_rolls_back_the_process_and_the_users_objects():
    model, optimizer, loader = tiny_model(), None, tiny_loader()
    optimizer = tiny_optimizer(model)
    before = snapshot(model, optimizer, loader)
    process = (torch.get_num_threads(), dict(os.environ), os.sched_getaffinity(0), len(global_pre_hooks))
    cpu = probe().physical_cpus[-1]
    with pytest.raises(accel.AccelerateError, match="breaks failed while being applied.*rolled back"):
        accel.accelerate(model, optimizer, loader, [{"threads": {"threads": 1}}, "channels_last",
                                                    {"activation_checkpointing": {"modules": ["TinyCNN"]}},
                                                    "fused_optimizer", "amp", Breaks()], device="cpu")
    assert (torch.get_num_threads(), dict(os.environ), os.sched_getaffinity(0), len(global_pre_hooks)) == process
    assert before.changes(snapshot(model, optimizer, loader)) == []
    assert not any(m._forward_pre_hooks or "forward" in m.__dict__ for m in model.modules())
    assert cpu in os.sched_getaffinity(0)


def test_run_close_puts_the_process_back():
    process = (torch.get_num_threads(), dict(os.environ), os.sched_getaffinity(0), len(global_pre_hooks))
    run = accel.accelerate(tiny_model(), None, None, [{"threads": {"threads": 1}}], device="cpu")
    assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    run.close()
    assert (torch.get_num_threads(), dict(os.environ), os.sched_getaffinity(0), len(global_pre_hooks)) == process


# --- runtime hooks and state -------------------------------------------------------------------------------------

def test_hooks_chain_in_plan_order_the_earliest_outermost(registered):
    calls = []

    def recording(name, stage):
        class Recording(Accelerator):
            def forward_context(self, run, state):
                calls.append(f"{name}.forward_context")
                return None

            def backward(self, run, state, loss, proceed):
                calls.append(f"{name}.backward>")
                proceed(loss)
                calls.append(f"{name}.backward<")

            def step(self, run, state, optimizer, proceed):
                calls.append(f"{name}.step>")
                stepped = proceed(optimizer)
                calls.append(f"{name}.step<{stepped}")
                return stepped

            def optimizer_step(self, run, state, optimizer, proceed):
                calls.append(f"{name}.optimizer_step")
                return proceed(optimizer)

        return registered(type(name, (Recording,), {"name": name, "stage": stage}))

    recording("outer", Stage.KERNELS), recording("inner", Stage.STEP)
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["inner", "outer"], device="cpu")
    x, y = next(iter(run.loader))
    with run.autocast():
        loss = torch.nn.functional.cross_entropy(run.model(x), y)
    run.backward(loss)
    assert run.step() is False
    assert calls == ["outer.forward_context", "inner.forward_context", "outer.backward>", "inner.backward>",
                     "inner.backward<", "outer.backward<", "outer.step>", "inner.step>", "outer.optimizer_step",
                     "inner.optimizer_step", "inner.step<True", "outer.step<True"]
    assert all(p.grad is None for p in model.parameters())  # the innermost step zeroes the gradients


@dataclass(frozen=True, kw_only=True)
class CounterOptions(Options):
    start: int = option(0)


@dataclass
class CounterState(State):
    count: int

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, saved):
        if not isinstance(saved.get("count"), int):
            raise ValueError(f"no step count in {saved}")
        self.count = saved["count"]


class Counter(Accelerator[CounterOptions, CounterState]):
    """Counts optimizer steps: runtime state kept per run and saved per accelerator by run.save."""

    name, stage = "counter", Stage.STEP

    def apply(self, ctx):
        return CounterState(self.config.start)

    def step(self, run, state, optimizer, proceed):
        stepped = proceed(optimizer)
        state.count += stepped
        return stepped


def test_each_run_has_its_own_accelerator_state_and_run_save_keeps_it(registered, tmp_path):
    registered(Counter)
    plan = accel.Plan(["counter"])
    first = accel.accelerate(tiny_model(), tiny_optimizer(tiny_model()), tiny_loader(), plan, device="cpu")
    second = accel.accelerate(tiny_model(), tiny_optimizer(tiny_model()), tiny_loader(), plan, device="cpu")
    train_steps(first, epochs=2)
    assert first.state("counter").count == 8 and second.state("counter").count == 0
    assert set(vars(plan.get("counter"))) == {"explicit", "config"}  # the plan's object: a configuration, no state
    assert set(vars(first.accelerators[0])) == {"explicit", "config"}  # the run's copy too: its state is apart
    first.save(tmp_path / "ckpt.pt")
    second.load(tmp_path / "ckpt.pt")
    assert second.state("counter").count == 8


@pytest.mark.parametrize("target", [torch.float64, "meta"], ids=["dtype", "meta"])
def test_the_journal_puts_a_moved_model_back_with_its_gradients(target):
    """torch moves a gradient by assigning its .data (and may swap Parameter objects): undo restores all of it."""
    from accel.run.journal import Journal

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    model(torch.randn(4, 3)).sum().backward()
    before = [(p, p.detach().clone(), p.grad, p.grad.clone()) for p in model.parameters()]
    journal = Journal()
    journal.move_module(model, target)
    journal.rollback()
    for (param, data, grad, grad_data), now in zip(before, model.parameters()):
        assert now is param and now.grad is grad
        assert now.dtype == torch.float32 and now.device.type == "cpu" and torch.equal(now.detach(), data)
        assert torch.equal(now.grad, grad_data)
    assert model[1].running_mean.device.type == "cpu"


def test_a_change_that_fails_half_way_is_undone_at_once():
    from accel.run.journal import Journal

    class Breaks(torch.nn.Module):
        def _apply(self, fn, recurse=True):
            raise RuntimeError("out of memory")

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Breaks())
    journal = Journal()
    with pytest.raises(RuntimeError, match="out of memory"):
        journal.move_module(model, torch.float64)
    assert model[0].weight.dtype == torch.float32 and not journal.entries


def test_train_and_eval_on_the_run_reach_the_users_modules():
    """The run's model is the user's model: one model, one mode (dropout, BatchNorm), whichever is switched."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), 0.1), None, ["channels_last"], device="cpu")
    assert run.model is model
    model.eval()
    assert not model.training and not model[1].training
    statistics = model[1].running_mean.clone()
    with torch.no_grad():
        run.unwrap()(torch.randn(4, 1, 5, 5))
    assert torch.equal(model[1].running_mean, statistics)
    run.unwrap().train()
    assert model.training and model[1].training


def test_a_skipped_accelerator_keeps_a_decision_another_made_first(registered):
    @registered
    class SameThreads(Accelerator):
        name = "same_threads"
        stage = Stage.ENVIRONMENT
        after = ("threads",)

        def decide(self, ctx):
            ctx.decide("threads", ctx.decisions.threads, "the same")
            raise Skip("stands aside")

        def apply(self, ctx):
            return {}

    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["threads", "same_threads"], device="cpu")
    assert run.report.row("threads").status == "applied" and run.report.row("same_threads").status == "skipped"
    run.close()


def test_a_load_that_fails_half_way_puts_the_run_back(registered, tmp_path, monkeypatch):
    """The model and optimizer are restored before the accelerators: one failing there is undone, all of it."""
    registered(Counter)
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["counter"], device="cpu")
    train_steps(run)
    run.save(tmp_path / "ckpt.pt")
    train_steps(run)  # the run moves on from the checkpoint
    before, steps, count = snapshot(run.model, run.optimizer), run.steps, run.state("counter").count

    def broken(self, saved, original=CounterState.load_state_dict):  # refuses the checkpoint's, takes the backup
        if saved.get("count") != self.count:
            raise RuntimeError("a state this version cannot read")
        original(self, saved)

    monkeypatch.setattr(CounterState, "load_state_dict", broken)
    with pytest.raises(accel.CheckpointError, match="was put back"):
        run.load(tmp_path / "ckpt.pt")
    monkeypatch.undo()
    assert not before.changes(snapshot(run.model, run.optimizer))
    assert run.steps == steps and run.state("counter").count == count
