"""plan="auto" in your loop is one controller that owns the run of the plan in place (accel/search/inloop.py): no
class spread over mixins, no Run that skips Run.__init__; it reaches the search without accelerate() looking it up;
the search reads what accelerators provide, never their names; and under faults (a refused run.load, a Ctrl-C at any
point of a step) nothing changes that close() cannot put back."""
import ast
import contextlib
import inspect
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from virtual_clock import VirtualClock

import accel
import accel.api
import accel.clock
from accel.plan.contract import REGISTRY, Accelerator, Capability, Stage, register, unregister
from accel.run import Run, open_run
from accel.search import inloop
from accel.search.inloop import InLoopSearch
from accel.testing import tiny_loader, tiny_model
from accel.testing.trace import process_state

CLOCK = VirtualClock()
SEARCH = Path(accel.__file__).parent / "search"


@pytest.fixture(autouse=True)
def short_chunks(monkeypatch):
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)


def auto_run(budget_s=10, model=None, **options):
    model = model or tiny_model()
    CLOCK.per_forward(model, 0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    plan = accel.Auto(cache=options.pop("cache", False), budget_s=budget_s,
                      **{"candidates": [["channels_last"]], **options})
    return model, accel.accelerate(model, optimizer, tiny_loader(), plan, device="cpu")


def train(run, steps):
    done = 0
    while done < steps:
        for x, y in run.loader:
            with run.autocast():
                loss = nn.functional.cross_entropy(run.model(x), y)
            run.backward(loss)
            run.unscale_gradients()
            run.step()
            done += 1
            if done == steps:
                break


def test_auto_is_a_controller_owning_a_run_and_every_name_of_run_answers_with_runs_signature():
    with accel.clock.use(CLOCK):
        model = tiny_model()
        plain = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.05), tiny_loader(), device="cpu")
        names = sorted({n for n in dir(Run) if not n.startswith("_")}
                       | {n for n in vars(plain) if not n.startswith("_")})
        _, run = auto_run()
        assert InLoopSearch.__bases__ == (object,) and not isinstance(run, Run) and isinstance(run.current, Run)
        with pytest.raises(AttributeError):
            run.no_such_attribute
        for name in names:
            mine, theirs = getattr(run, name), getattr(plain, name)
            if inspect.ismethod(theirs) and not isinstance(theirs, (nn.Module, torch.optim.Optimizer)):
                assert list(inspect.signature(mine).parameters) == list(inspect.signature(theirs).parameters), name
        assert run.loader.dataset is run.current.loader.dataset and run.loader.batch_size == 16  # as any run.loader
        run.close()
        plain.close()


@pytest.mark.parametrize("when", ["mid-search", "settled"])
def test_the_methods_of_run_answer_for_the_plan_in_place(when, tmp_path):
    with accel.clock.use(CLOCK):
        model, run = auto_run()
        train(run, 4)
        if when == "settled":
            while run.phase != "settled":
                train(run, 1)
        else:
            while not run.plan.to_dict():
                train(run, 1)
            assert run.phase == "measuring"
        assert run.plan is run.current.plan and run.report is run.current.report
        assert run.steps == run.current.steps and run.optimizer_steps == run.current.optimizer_steps
        assert run.unwrap() is model and run.wrappers()[-1] is model and run.model is run.current.model
        assert run.accelerators == run.current.accelerators and run.states is run.current.states
        assert not run.accumulating and run.scaler is None and not run.sharded and not run.held_gradients()
        for name in run.plan.names():
            assert run.accelerator(name).name == name and run.state(name) is run.current.state(name)
        state = run.state_dict()
        assert state["plan"] == run.plan.to_dict() and state["step"] == run.steps and run.state_problems(state) == []
        run.save(tmp_path / "ckpt.pt")
        steps = run.steps
        train(run, 2)
        info = run.load(tmp_path / "ckpt.pt")
        assert info["step"] == steps == run.steps and run.phase == "settled"
        run.close()
        assert run.closed


def test_plan_auto_reaches_the_search_through_accel_accelerate_and_accelerate_itself_names_it():
    """accel.accelerate (accel.search) resolves "auto"; accel.api.accelerate knows no search: given "auto" it says
    where it is chosen, and the core imports nothing of the search (tests/test_lifecycle.py's import graph)."""
    model = tiny_model()
    with pytest.raises(accel.PlanError, match="is chosen by measuring"):
        accel.api.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), "auto", device="cpu")
    assert "search" not in inspect.getsource(accel.api)


def test_the_search_reads_capabilities_never_accelerator_names():
    """No string in accel/search/ is a registered accelerator's name: what the search needs to know (a costly first
    step, a loader that changes at an epoch, a copy it trains, a wrapper every rank runs) is what an accelerator
    provides."""
    names = set(REGISTRY)
    found = [(path.name, node.value) for path in SEARCH.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]
    assert found == [], found
    mixins = [node.name for path in SEARCH.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.ClassDef) and len(node.bases) > 1]
    assert mixins == [], mixins  # no class spread over mixins


def test_a_refused_load_changes_nothing_and_the_search_goes_on(tmp_path):
    """The fit check comes first: a checkpoint of another model is refused with the search, the plan in place, the
    steps and the weights as they were (before, the search ended and switched plans, then the load was refused)."""
    with accel.clock.use(CLOCK):
        other = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        saved = accel.accelerate(other, torch.optim.SGD(other.parameters(), lr=0.1), None, ["channels_last"],
                                 device="cpu")
        saved.save(tmp_path / "other.pt")
        saved.close()
        model, run = auto_run()
        train(run, 5)
        before = (run.phase, run.plan.to_dict(), run.steps, [a.status for a in run.arms], run.report.tuning,
                  {k: v.clone() for k, v in model.state_dict().items()})
        with pytest.raises(accel.CheckpointError, match="does not fit this run; nothing was loaded"):
            run.load(tmp_path / "other.pt")
        after = (run.phase, run.plan.to_dict(), run.steps, [a.status for a in run.arms], run.report.tuning)
        assert after == before[:5] and all(torch.equal(v, before[5][k]) for k, v in model.state_dict().items())
        while run.phase != "settled":
            train(run, 1)
        assert run.search.how == "settled"
        run.close()


class Warming(Accelerator):
    """A costly candidate like compile: a long first step, and a process setting (an environment variable) through
    its journal that close() must take back, however the search was interrupted."""

    name = "warming"
    stage = Stage.COMPILATION
    provides = (Capability.SETUP_COSTLY,)

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}]

    def apply(self, ctx):
        ctx.journal.setenv("ACCEL_TEST_WARMING", "on")
        return {"warming": "on"}


class Interrupt:
    """A real Ctrl-C (SIGINT to this process) at the ``at``-th line accel runs once armed (sys.settrace), once: in
    the loader, the forward, run.backward, run.step, the search's turns or a switch of plans, wherever it falls;
    with ``switching``, only lines run while the search switches plans count."""

    def __init__(self, at: int, switching=None):
        self.at, self.switching, self.lines, self.fired = at, switching, 0, False
        self.root = str(Path(accel.__file__).parent)

    def __enter__(self):
        self.previous = sys.gettrace()
        sys.settrace(self._frame)
        return self

    def __exit__(self, *exc):
        sys.settrace(self.previous)

    def _frame(self, frame, event, arg):
        if self.fired or not frame.f_code.co_filename.startswith(self.root):
            return None
        return self._line

    def _line(self, frame, event, arg):
        if self.fired:
            return None
        if event == "line" and (self.switching is None or self.switching()):
            self.lines += 1
            if self.lines >= self.at:
                self.fired = True
                os.kill(os.getpid(), signal.SIGINT)
        return self._line


def interrupted(step=-1, at=1, in_switch=False) -> tuple[list[int], bool]:
    """Threads (its threads, affinity and the variables it exports for children) against the plain loop, then a
    costly candidate that sets an environment variable on top, a switch every few steps, a Ctrl-C at ``at`` in
    ``step``, then close(): the steps a plan switch ended, and whether the process, your model's hooks and your
    optimizer are as they were with no run left open on your model."""
    register(Warming)
    try:
        with accel.clock.use(CLOCK):
            before = process_state()
            model = tiny_model()
            cost = CLOCK.per_forward(model, 0.01)
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            flags = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
            run = accel.accelerate(model, optimizer, tiny_loader(), accel.Auto(
                cache=False, budget_s=600, candidates=[["threads"], [{"warming": {}}]]), device="cpu")
            interrupt = Interrupt(at, (lambda: run.__dict__.get("switching")) if in_switch else None)
            batches, switched = iter(()), []
            try:
                for i in range(34):
                    current = run.current
                    with interrupt if i == step else contextlib.nullcontext():
                        batch = next(batches, None)
                        if batch is None:
                            batches = iter(run.loader)
                            batch = next(batches)
                        with run.autocast():
                            loss = nn.functional.cross_entropy(run.model(batch[0]), batch[1])
                        run.backward(loss)
                        run.step()
                    switched += [i] if run.current is not current else []
            except KeyboardInterrupt:
                assert interrupt.fired
            held_let_go = signal.getsignal(signal.SIGINT) is signal.default_int_handler
            run.close()
            cost.remove()
            whole = (process_state() == before and open_run(model) is None and not model._forward_pre_hooks
                     and not model._forward_hooks and not optimizer._optimizer_step_pre_hooks and held_let_go
                     and [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] == flags)
            os.environ.pop("ACCEL_TEST_WARMING", None)
            return switched, whole
    finally:
        unregister("warming")


SWITCHES: list[int] = []  # the steps a switch ends, found once by a run without a Ctrl-C


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("ACCEL_INTERRUPT_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(["in a switch", "anywhere"]), index=st.integers(0, 40), at=st.integers(1, 700))
def test_a_ctrl_c_at_any_point_of_a_step_leaves_close_to_put_everything_back(where, index, at):
    """A real Ctrl-C (SIGINT) at a generated line of a step: in a plan switch (accelerate() on your objects, the
    earlier run undone, the new one made) or anywhere in a step; then close(). Before, a Ctrl-C while compile's
    candidate switched in left its environment variables set (1 of 51 random interrupts in an audit; 4 of 97 here
    inside switches): a Ctrl-C now waits until the switch is whole (accel.run.interrupts.deferred)."""
    if not SWITCHES:
        SWITCHES.extend(interrupted()[0])
    step = SWITCHES[index % len(SWITCHES)] if where == "in a switch" else index % 34
    assert interrupted(step, at if where == "in a switch" else at * 8, where == "in a switch")[1], (where, step, at)
