"""plan="auto" in your loop returns a real accel.Run (issue 24): every method and property of Run, with Run's
signature, answered by the run of the plan in place, mid-search and settled; and compile's expected warm-up
kept apart for a warm and a cold start of inductor's compile cache (accel/accelerators/compile/cache.py)."""
import inspect

import pytest
import torch
from torch import nn

import accel
import accel.clock
import accel.accelerators.compile.cache as compile_cache
from accel.search import config, inloop, remembered
from accel.search.inloop import TuningRun
from accel.search.switch import TuningLoader
from accel.hardware import probe
from accel.run import Run
from accel.testing import VirtualClock, tiny_loader, tiny_model

CLOCK = VirtualClock()


@pytest.fixture(autouse=True)
def short_chunks(monkeypatch):
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)


def auto_run(budget_s=10, **options):
    model = tiny_model()
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


def public_api_of_run():
    """Run's public methods and properties, and the attributes every Run sets (read off a real one)."""
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.05), tiny_loader(), device="cpu")
    names = {n for n in dir(Run) if not n.startswith("_")} | {n for n in vars(run) if not n.startswith("_")}
    return run, sorted(names)


def test_auto_returns_a_run_with_every_public_name_of_run_and_its_signature():
    with accel.clock.use(CLOCK):
        plain, names = public_api_of_run()
        _, run = auto_run()
        assert isinstance(run, accel.Run) and isinstance(run, TuningRun)
        assert "__getattr__" not in {k for c in TuningRun.__mro__ if c is not object for k in vars(c)}
        with pytest.raises(AttributeError):
            run.no_such_attribute
        assert run.loader.dataset is run.loader.loader.dataset  # named; any other name of 0.3 warns
        with pytest.warns(DeprecationWarning, match="run.loader.loader.persistent_workers"):
            assert run.loader.persistent_workers is False
        for name in names:
            mine, theirs = getattr(run, name), getattr(plain, name)
            in_class = inspect.getattr_static(Run, name, None)
            if isinstance(in_class, property):
                assert isinstance(inspect.getattr_static(TuningRun, name), property), name
            if callable(theirs) and not isinstance(theirs, (torch.nn.Module, torch.optim.Optimizer)) and \
                    inspect.ismethod(theirs):
                assert callable(mine), name
                assert list(inspect.signature(mine).parameters) == list(inspect.signature(theirs).parameters), name
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
            assert run.accelerator_state_dict(name) == run.current.accelerator_state_dict(name)
        with pytest.raises(KeyError):
            run.accelerator("no_such_accelerator")
        state = run.state_dict()
        assert state["plan"] == run.plan.to_dict() and state["step"] == run.steps
        assert run.state_problems(state) == []
        run.load_state_dict(state)
        run.save(tmp_path / "ckpt.pt")
        steps = run.steps
        train(run, 2)
        info = run.load(tmp_path / "ckpt.pt")
        assert info["step"] == steps == run.steps and run.phase == "settled"
        assert not run.closed
        run.close()
        assert run.closed


def make_warm(model, options):
    """What an earlier run that compiled this setup leaves in accel's folder: its marker, then graph entries."""
    where = compile_cache.folder()
    facts = compile_cache.model_facts(model, "cpu", probe().cpu_model, remembered.compile_settings(options))
    compile_cache.warm_before(where, facts)
    (where / "aotautograd" / "akey" / "entry").mkdir(parents=True)


@pytest.fixture
def accel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    return tmp_path


def test_whether_compile_would_start_warm_is_read_without_writing_a_marker(accel_cache):
    model, candidate = tiny_model(), {"compile": {}}
    markers = accel_cache / "compile" / compile_cache.MARKERS
    assert not remembered.starts_warm(candidate, model, "cpu", probe().cpu_model)
    assert not markers.exists()  # asking wrote nothing
    make_warm(model, {})
    before = sorted(p.read_text() for p in markers.glob("*.json"))
    assert remembered.starts_warm(candidate, model, "cpu", probe().cpu_model)
    assert sorted(p.read_text() for p in markers.glob("*.json")) == before
    assert not remembered.starts_warm({"compile": {"backend": "eager"}}, model, "cpu", probe().cpu_model)
    assert not remembered.starts_warm({"compile": {"mode": "max-autotune"}}, model, "cpu", probe().cpu_model)


def test_a_warm_and_a_cold_warm_up_are_remembered_apart(accel_cache):
    facts = {"model": "m", "batch": "b", "device": "cpu", "cpu": "c", "versions": "v"}
    candidate = {"compile": {}}
    assert remembered.expected_warmup(candidate, facts, accel_cache, warm=True)[0] == config.WARM_GUESS_S
    assert remembered.expected_warmup(candidate, facts, accel_cache, warm=False)[0] == config.COMPILE_GUESS_S
    remembered.remember_warmup(candidate, facts, accel_cache, 2.0, warm=True)
    remembered.remember_warmup(candidate, facts, accel_cache, 25.0, warm=False)
    warm, how_warm = remembered.expected_warmup(candidate, facts, accel_cache, warm=True)
    cold, how_cold = remembered.expected_warmup(candidate, facts, accel_cache, warm=False)
    assert (warm, cold) == (2.0, 25.0) and "warm start" in how_warm and "cold start" in how_cold
    keys = sorted(remembered.warmup_key(facts, candidate, w)["start"] for w in (True, False))
    assert keys == ["cold", "warm"]


@pytest.mark.parametrize("warm", [True, False])
def test_the_search_expects_a_warm_starts_warm_up_when_the_cache_is_warm(accel_cache, warm):
    """10 s of budget: a cold compile's guess (30 s) does not fit it, a warm one's (3 s) does."""
    with accel.clock.use(CLOCK):
        model = tiny_model()
        if warm:
            make_warm(model, {})
        CLOCK.per_forward(model, 0.01)
        run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.05), tiny_loader(),
                               accel.Auto(cache=False, budget_s=10, candidates=[["channels_last"], ["compile"]]),
                               device="cpu")
        while run.phase == "measuring":
            train(run, 1)
        assert run.compile_warm is warm and run.compile_arm is not None
        if warm:  # compile's rounds began (closed before its first compiled step: no compile on 2 cores here)
            assert run.phase == "compile" and run.compile_arm.status != "not measured", run.compile_arm
        else:
            assert run.compile_arm.status == "not measured" and "does not fit" in run.compile_arm.reason
            assert "a cold start" in run.compile_arm.reason
        run.close()
