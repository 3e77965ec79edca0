"""tune / plan="auto": candidates from the accelerators, stacks searched, interleaved ratios, the plan cache."""
import copy
import dataclasses
import math
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from virtual_clock import VirtualClock

import accel
import accel.clock
from accel.hardware import ISA_FLAGS, probe
from accel.measure import Ratio
from accel.measure.lab import Lab, Trial
from accel.plan.contract import REGISTRY, Accelerator, Capability, Stage, register, unregister
from accel.run.report import Report
from accel.search import TuneResult, generate_candidates
from accel.testing import snapshot, tiny_loader, tiny_model, tiny_optimizer
from accel.testing.trace import process_state

CLOCK = VirtualClock()  # the step times of the tests that judge verdicts: only the test's models move it
BASE_S = 0.01  # a forward of the plain model, on that clock


@pytest.fixture
def virtual():
    """Step times from CLOCK alone: real compute counts for nothing, so no load on the machine flips a verdict."""
    with accel.clock.use(CLOCK):
        yield CLOCK


class Wrapped(torch.nn.Module):
    """A new module around the run's model, so the user's model never carries the test's hook."""

    def __init__(self, inner, scale=1.0):
        super().__init__()
        self.inner, self.scale = inner, scale

    def forward(self, x):
        return self.inner(x) * self.scale


class Slow(Accelerator):
    """Deliberately slow: a forward pre-hook that costs 0.5 s on the test's clock (the plain step costs 10 ms)."""

    name = "slow"
    stage = Stage.KERNELS

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}]

    def apply(self, ctx):
        ctx.model = Wrapped(ctx.model)
        CLOCK.per_forward(ctx.model, 0.5)
        return {"costs": "0.5 s per forward"}


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


class Napping(torch.nn.Module):
    """A user model with a slow part (a 20 ms nap per forward, on the test's clock, beside 10 ms for the rest) that
    an accelerator can remove."""

    def __init__(self):
        super().__init__()
        self.net = tiny_model()
        self.nap = 0.02

    def forward(self, x):
        CLOCK.advance(BASE_S + self.nap)
        return self.net(x)


class Awake(Accelerator):
    """Costly to set up (a 1.5 s first step, like a compile), then faster: the nap is gone on the run's copy."""

    name = "awake"
    stage = Stage.COMPILATION
    provides = (Capability.SETUP_COSTLY,)

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}] if isinstance(model, Napping) else []

    def apply(self, ctx):
        model = ctx.model
        forward, calls = model.forward, []
        ctx.journal.set_item(model.__dict__, "nap", 0.0)  # how the user's model runs, undone by close

        def first_is_slow(x):
            if not calls:
                CLOCK.advance(1.5)
            calls.append(1)
            return forward(x)

        ctx.journal.set_item(model.__dict__, "forward", first_is_slow)
        return {"nap": "removed"}


@pytest.fixture
def custom():
    for cls in (Slow, Wrong, Broken, Awake):
        register(cls)
    yield
    for cls in (Slow, Wrong, Broken, Awake):
        unregister(cls.name)


def objects(model=None, step_s=None):
    """The user's objects; with step_s, every forward of the model costs that much on the test's clock."""
    model = model or tiny_model()
    if step_s is not None:
        CLOCK.per_forward(model, step_s)
    optimizer = tiny_optimizer(model)
    loader = tiny_loader(samples=64, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
    return model, optimizer, loader


def test_a_slow_candidate_is_never_chosen_and_everything_ends_as_it_started(custom, virtual):
    model, optimizer, loader = objects(step_s=BASE_S)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(next(iter(loader))[0]), torch.zeros(16, dtype=torch.long)).backward()
    optimizer.step()  # real optimizer state to keep
    before, generator, rng, process = (snapshot(model, optimizer, loader), loader.generator.get_state(),
                                       torch.get_rng_state(), process_state())
    result = accel.tune(model, optimizer, loader, device="cpu", candidates=[["slow"], ["channels_last"], ["threads"]],
                        budget_s=60)
    assert "slow" not in result.plan.names()
    assert [r.name for r in result.rows] == ["eager", "slow", "channels_last", "threads"]
    slow = result.row("slow")
    assert slow.status == "stopped early" and "over 3x the baseline's" in slow.reason
    assert "took over 0.51 s" in slow.reason and "baseline's 0.010 s" in slow.reason  # exact: the clock's times
    # every candidate starts from the same weights, optimizer state and RNG, and sees the same batches
    assert slow.losses == result.rows[0].losses
    assert before.changes(snapshot(model, optimizer, loader)) == []
    assert torch.equal(loader.generator.get_state(), generator) and torch.equal(torch.get_rng_state(), rng)
    assert process_state() == process


def test_only_a_slow_candidate_gives_the_empty_plan_with_the_reason(custom, virtual):
    result = accel.tune(*objects(step_s=BASE_S), device="cpu", candidates=[["slow"]], budget_s=60)
    assert result.plan.names() == [] and "empty plan" in result.why


def test_a_candidate_that_changes_the_loss_is_refused_whatever_its_speed(custom):
    result = accel.tune(*objects(), device="cpu", candidates=[["wrong"]], budget_s=60)
    row = result.row("wrong")
    assert row.loss_ok is False and row.status == "loss off" and "tolerance" in row.reason
    assert result.plan.names() == []
    assert row.losses[0] > result.rows[0].losses[0]


def test_a_candidate_that_fails_is_reported_and_the_search_goes_on(custom, virtual):
    model, optimizer, loader = objects(step_s=BASE_S)
    before = snapshot(model, optimizer, loader)
    result = accel.tune(model, optimizer, loader, device="cpu", candidates=[["broken"], ["channels_last"]],
                        budget_s=60)
    assert result.row("broken").status == "failed" and "cannot handle this model" in result.row("broken").reason
    assert result.row("channels_last").status == "measured"  # measured after the failure
    assert "broken" not in result.plan.names()
    assert before.changes(snapshot(model, optimizer, loader)) == []


def test_the_generated_search_drops_what_does_not_pay_and_a_failing_member_does_not_spoil_it(custom, virtual):
    """The full stack holds 'slow' (and a member that breaks): each alone, then the stack of what helped."""
    register(type("Breaks", (Broken,), {"name": "breaks", "candidates": classmethod(lambda *a, **k: [{}])}))
    try:
        result = accel.tune(*objects(step_s=BASE_S), device="cpu", accelerators=["slow", "breaks", "channels_last"],
                            budget_s=60)
    finally:
        unregister("breaks")
    names = [r.name for r in result.rows]
    assert names[:2] == ["eager", "slow+channels_last+breaks"] or names[1].count("+") == 2
    assert result.row("slow").status == "stopped early" and result.row("breaks").status == "failed"
    assert {"slow", "breaks"}.isdisjoint(result.plan.names())


def test_a_costly_accelerator_is_kept_only_when_its_warmup_pays_back_within_the_run(custom, virtual):
    short = accel.tune(*objects(Napping()), device="cpu", accelerators=["awake"], expected_steps=10, budget_s=60)
    row = short.row("awake")
    assert short.plan.names() == [] and "pays back after" in row.decision and "beyond the run's 10" in row.decision
    long = accel.tune(*objects(Napping()), device="cpu", accelerators=["awake"], expected_steps=100_000, budget_s=60)
    assert long.plan.names() == ["awake"] and "kept" in long.row("awake").decision
    assert long.row("awake").ratio["estimate"] < 0.5
    assert long.row("awake").ratio["estimate"] == pytest.approx(1 / 3, abs=1e-3)  # 10 ms of 30: exact on the clock


def test_the_budget_bounds_the_search_and_says_what_was_not_measured():
    result = accel.tune(*objects(), device="cpu", candidates=[["channels_last"], ["threads"]], budget_s=0)
    assert result.rows[0].status == "measured"  # the baseline is always measured
    assert ({r.status for r in result.rows[1:]} == {"not measured"}
            and all("budget" in r.reason for r in result.rows[1:]))
    assert result.plan.names() == []


def test_the_result_is_data_round_trips_and_prints_in_the_report():
    result = accel.tune(*objects(), device="cpu", candidates=[["channels_last"]], budget_s=30)
    data = result.to_dict()
    assert data["plan"] == result.plan.to_dict() and data["rows"][0]["name"] == "eager"
    again = TuneResult.from_dict(data)
    assert again.plan == result.plan and [r.name for r in again.rows] == [r.name for r in result.rows]
    assert "why:" in str(result) and "time ratio (90%)" in str(result)
    report = Report(device="cpu", hardware="test", tuning=result)
    assert "accel tune: chose" in str(report) and report.to_dict()["tuning"]["why"] == result.why


def test_auto_passes_its_settings_through_accelerate():
    """With a loss_fn, auto searches apart (accel.tune) before accelerate() returns; without, in the loop."""
    model, optimizer, loader = objects()
    run = accel.accelerate(model, optimizer, loader, device="cpu",
                           plan=accel.Auto(candidates=[["channels_last"]], budget_s=20, cache=False, expected_steps=50,
                                           loss_fn=torch.nn.functional.cross_entropy))
    assert not hasattr(run, "phase")  # a plain Run: the search is over
    tuning = run.report.tuning
    assert isinstance(tuning, TuneResult) and tuning.settings["budget_s"] == 20
    assert tuning.settings["expected_steps"] == 50 and run.plan == tuning.plan


class DictSet(torch.utils.data.Dataset):
    """Batches as dicts with an image, a mask beside it and a label: what a segmentation-style loop sees."""

    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.x, self.mask = torch.randn(n, 1, 8, 8, generator=g), torch.rand(n, 1, 8, 8, generator=g) > 0.5
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"image": self.x[i], "mask": self.mask[i], "label": self.y[i]}


def test_tune_takes_any_batch_through_a_step_function_and_explains_what_it_needs():
    model = tiny_model()
    loader = DataLoader(DictSet(), batch_size=16)
    with pytest.raises(accel.MeasureError, match=r"yields a dict with keys \['image', 'mask', 'label'\]; pass step_fn"):
        accel.tune(model, tiny_optimizer(model), loader, device="cpu", budget_s=5)

    def step_fn(run, batch):
        logits = run.model(batch["image"] * batch["mask"])
        return torch.nn.functional.cross_entropy(logits, batch["label"])

    result = accel.tune(model, tiny_optimizer(model), loader, device="cpu", step_fn=step_fn,
                        candidates=[["channels_last"]], budget_s=20)
    assert result.row("channels_last").loss_ok
    split = accel.tune(model, tiny_optimizer(model), loader, device="cpu", split=lambda b: (b["image"], b["label"]),
                       candidates=[["channels_last"]], budget_s=20)
    assert split.rows[0].losses and split.row("channels_last").loss_ok


def test_the_cache_answers_the_same_setup_at_once_and_measures_again_after_any_change(tmp_path, custom, virtual):
    # 'slow' is clearly not faster: a decided answer, kept even on a busy machine
    model, optimizer, loader = objects(step_s=BASE_S)
    kwargs = dict(device="cpu", candidates=[["slow"]], budget_s=20, cache=tmp_path)
    first = accel.tune(model, optimizer, loader, **kwargs)
    assert not first.from_cache and first.key
    second = accel.tune(model, optimizer, loader, **kwargs)
    assert second.from_cache and second.key == first.key and second.plan == first.plan
    assert "from the cache" in str(second) and second.measured_at == first.measured_at
    other_batch = accel.tune(model, optimizer, tiny_loader(batch_size=8), **kwargs)
    assert not other_batch.from_cache and other_batch.key != first.key
    other_optimizer = accel.tune(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, **kwargs)
    assert not other_optimizer.from_cache
    import accel.search.cache as plancache

    assert {e["key"] for e in plancache.entries(tmp_path)} == {first.key, other_batch.key, other_optimizer.key}
    assert plancache.clear(tmp_path, key=first.key[:6]) == 1 and len(plancache.entries(tmp_path)) == 2


def test_a_noisy_or_cut_short_answer_is_not_remembered(tmp_path):
    cut = accel.tune(*objects(), device="cpu", candidates=[["channels_last"]], budget_s=0, cache=tmp_path)
    assert cut.row("channels_last").status == "not measured" and cut.key == ""
    import accel.search.cache as plancache

    assert plancache.entries(tmp_path) == []


def test_accel_cache_lists_and_clears(tmp_path, monkeypatch, capsys, custom, virtual):
    from accel.cli import main

    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    accel.tune(*objects(step_s=BASE_S), device="cpu", candidates=[["slow"]], budget_s=10, cache=True)
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "1 remembered plan(s)" in out and "TinyCNN" in out
    assert main(["cache", "clear"]) == 0 and "removed 1 entry" in capsys.readouterr().out


def test_tune_needs_an_optimizer_and_a_loader():
    with pytest.raises(ValueError, match="optimizer and a loader"):
        accel.tune(tiny_model(), None, None, device="cpu")


@settings(max_examples=40, deadline=None)
@given(isa=st.sets(st.sampled_from(ISA_FLAGS)), gpu=st.booleans(), conv=st.booleans(),
       optimizer_kind=st.sampled_from([None, "adam", "lbfgs"]))
def test_candidates_come_from_each_accelerator_and_follow_the_hardware(isa, gpu, conv, optimizer_kind):
    devices = {"cpu": 1, **({"cuda": 1} if gpu else {})}
    hardware = dataclasses.replace(probe(), isa=tuple(sorted(isa)), devices=devices)
    model = tiny_model() if conv else torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    optimizer = {None: None, "adam": lambda: tiny_optimizer(model),
                 "lbfgs": lambda: torch.optim.LBFGS(model.parameters())}[optimizer_kind]
    optimizer = optimizer() if optimizer else None
    found = generate_candidates(hardware, model, optimizer, tiny_loader())
    names = [next(iter(c)) for c in found]
    native = bool({"avx512_bf16", "amx_bf16"} & isa)
    assert ("amp" in names) == (gpu or native)
    assert ("channels_last" in names) == conv
    assert ("fused_optimizer" in names) == (optimizer_kind == "adam")
    assert "threads" in names and "prune" not in names and "ddp" not in names  # never a change of what is trained
    stages = [REGISTRY[n].stage for n in names]
    assert stages == sorted(stages)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.2, 5.0), min_size=2, max_size=12))
def test_a_ratio_interval_holds_its_estimate_and_narrows_with_agreeing_rounds(samples):
    ratio = Ratio(samples)
    assert ratio.low <= ratio.estimate <= ratio.high
    assert min(samples) - 1e-9 <= ratio.estimate <= max(samples) + 1e-9
    assert not (ratio.below(ratio.estimate) and ratio.above(ratio.estimate))
    steady = Ratio([samples[0]] * len(samples))
    assert math.isclose(steady.low, steady.high) and not steady.noisy() or math.isclose(samples[0], 1.0)


@settings(max_examples=100, deadline=None)
@given(ties=st.integers(2, 12), spikes=st.lists(st.sampled_from([0.02, 0.05, 20.0, 50.0]), min_size=1, max_size=11))
def test_a_verdict_needs_most_rounds_to_agree(ties, spikes):
    """Rounds of a plan that changes nothing under spiky load: most read 1.0, a few 0.02 or 50 (a spike on one side).
    However the few fall, no verdict is reached while the median round reads 1.0 (the t-interval alone once did)."""
    samples = [1.0] * ties + spikes[:ties - 1]  # more ties than spikes: the median round is 1.0
    ratio = Ratio(samples)
    assert ratio.median == 1.0
    assert not ratio.below(1.0) and not ratio.above(1.0) and ratio.noisy()
    assert not ratio.below(0.98) and not ratio.above(1.02)
    if ratio.high < 1.0 or ratio.low > 1.0:  # the interval alone would have decided: the table says why it did not
        assert str(ratio).endswith("; median round 1.00)"), str(ratio)
    else:
        assert "median" not in str(ratio)
    assert Ratio([0.02] * 4 + [0.021, 0.019]).below(0.5)  # rounds that agree still decide


def test_one_round_decides_nothing():
    assert Ratio([0.5]).noisy() and math.isinf(Ratio([0.5]).high)


class OrderLab(Lab):
    """A Lab whose chunks only record the order they run in (the rotation under test), at fixed speeds."""

    def __init__(self, speeds, fails=()):
        self.order, self.speeds, self.fails, self.settle, self.chunk_steps, self.active = [], speeds, fails, 0, 1, None

    def chunk(self, trial, limit_s=math.inf):
        self.order.append(trial.plan["name"])
        if trial.plan["name"] in self.fails:
            raise RuntimeError("out of memory")
        return self.speeds[trial.plan["name"]]


def test_rounds_alternate_which_plan_runs_first():
    """A B, B A, B A, A B: a load that rises or falls during the rounds weighs on both plans alike."""
    lab = OrderLab({"A": 1.0, "B": 1.0})
    challenger = Trial({"name": "B"})
    ratio = lab.rounds([challenger], Trial({"name": "A"}), (0.5,), min_rounds=4, max_rounds=4)[id(challenger)]
    assert "".join(lab.order) == "ABBABAAB" and ratio.estimate == pytest.approx(1.0)
    lab = OrderLab({"A": 1.0, "B": 1.0, "C": 1.0})
    lab.rounds([Trial({"name": "B"}), Trial({"name": "C"})], Trial({"name": "A"}), (0.5,),
               min_rounds=6, max_rounds=6)
    firsts = [lab.order[i] for i in range(0, 18, 3)]
    assert sorted(set(firsts)) == ["A", "B", "C"]  # every plan leads some rounds


def test_rounds_stop_once_every_challenger_failed():
    lab = OrderLab({"A": 1.0, "B": 0.5}, fails=("B",))
    ratios = lab.rounds([Trial({"name": "B"})], Trial({"name": "A"}), (0.9,), max_rounds=8)
    assert lab.order.count("A") == 1 and not ratios[next(iter(ratios))].samples


def test_the_cache_key_holds_the_loaders_workers_but_not_the_device_index():
    import accel.search.cache as plancache
    from accel.measure import TrainStep

    model, optimizer, loader = objects()
    batch = next(iter(loader))

    def key(device="cpu", workers=0):
        data = DataLoader(loader.dataset, batch_size=loader.batch_size, num_workers=workers)
        parts = plancache.setup_key(model, optimizer, data, batch, device, probe(), TrainStep(),
                                    {"device": str(device)})
        return plancache.key_of(parts)

    assert key() == key() and key(workers=2) != key()
    assert key("cpu:0") == key("cpu")  # the index is not in the key: rank 3 takes what rank 0 measured


@settings(max_examples=60, deadline=None)
@given(first=st.sampled_from(["not measured", "noisy", "faster", "slower", "failed"]),
       later=st.sampled_from(["not measured", "one round", "alike", "slower"]))
def test_the_one_search_remembers_only_an_answer_it_established_and_drops_nothing_on_thin_evidence(first, later):
    """The strategy alone, fed outcomes as an executor would: the stack the hardware predicts first; nothing measured
    for lack of time, or rounds that reached no verdict, is a gap (never remembered); an ablation cut to one round,
    or one that says the accelerator pays, keeps it; one alike drops it (what does not pay goes)."""
    from accel.search.results import Arm
    from accel.search.strategy import Search

    samples = {"faster": [0.5, 0.52, 0.49], "slower": [1.5, 1.6, 1.4], "noisy": [0.3, 2.0, 0.9, 1.4],
               "alike": [1.0, 0.99, 1.01], "one round": [0.99]}
    def outcome(kind):
        if kind == "not measured":
            return Arm({}, "not measured", "the budget ran out")
        return Arm({}, "failed", "broke") if kind == "failed" else Arm(ratio=Ratio(samples[kind]))
    search = Search(accel.Auto(margin=0.02), {"stepwise": [{"threads": {}}, {"channels_last": {}}], "costly": [],
                                              "given": False})
    steps = search.comparisons()
    request = next(steps)
    assert request.reference == {} and request.challengers == [{"threads": {}, "channels_last": {}}]
    try:
        request = steps.send([outcome(first)])
        if first == "faster":
            assert request.reference == {"threads": {}, "channels_last": {}} and len(request.challengers) == 2
            steps.send([outcome(later), outcome("slower")])
        else:
            steps.send([outcome(later) for _ in request.challengers])
    except StopIteration:
        pass
    assert search.decided
    if first == "faster":
        kept = {"threads", "channels_last"} if later in ("not measured", "one round", "slower") else {"channels_last"}
        assert set(search.best) == kept and search.established, (later, search.best)
    else:
        assert search.established == (first != "not measured" and first != "noisy"), (first, later)
        assert not search.best or first == "failed" and later == "alike"


def test_tune_decides_the_launch_and_device_as_accelerate_does(monkeypatch):
    monkeypatch.setenv("RANK", "abc")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(accel.PlanError, match="launcher's variables cannot be read"):
        accel.tune(*objects(), device="cpu")


def test_compile_is_not_started_on_a_budget_its_warm_up_cannot_fit_and_the_why_says_so(tmp_path, monkeypatch):
    """Before: compile started whenever any budget was left (budget_s=30 took 70 s), and the why read "no plan was
    faster ... (0 comparisons)" for candidates never measured. A cache folder of its own: an earlier test that
    compiled this model into the shared one would make it a warm start (guessed at 3 s), which fits 5 s."""
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    model, optimizer, loader = objects()
    result = accel.tune(model, optimizer, loader, device="cpu", accelerators=["compile"], budget_s=5, cache=False)
    rows = [row for row in result.rows if "compile" in row.plan]
    assert len(rows) == 1 and rows[0].status == "not measured" and "does not fit" in rows[0].reason, result.rows
    assert "budget ran out before any candidate was compared" in result.why and "compile" in result.why, result.why
    assert result.plan.names() == []


def test_in_a_long_run_tune_tries_compile_past_its_budget_and_its_row_says_so(tmp_path, monkeypatch):
    """The same budget of 5 s that leaves compile out above, in a run told to be 10 million steps long: its warm-up
    (30 s assumed, cold) is within 2% of the run ahead, so it is measured, and its row says it was tried past the
    budget, whatever its verdict."""
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    model, optimizer, loader = objects()
    result = accel.tune(model, optimizer, loader, device="cpu", accelerators=["compile"], budget_s=5, cache=False,
                        expected_steps=10**7)
    rows = [row for row in result.rows if "compile" in row.plan]
    assert len(rows) == 1 and rows[0].status != "not measured", result.rows
    assert rows[0].first_step_s is not None and "tried past the budget" in rows[0].decision, rows[0]


def test_the_clock_is_swapped_for_a_block_and_restored_even_when_the_block_raises():
    outer, inner = VirtualClock(start=5.0), VirtualClock(start=100.0)
    with accel.clock.use(outer) as installed:
        assert installed is outer and accel.clock.now() == 5.0
        outer.advance(0.25)
        assert accel.clock.now() == 5.25  # it moves only when told
        with pytest.raises(RuntimeError, match="inside"):
            with accel.clock.use(inner):
                assert accel.clock.now() == 100.0
                raise RuntimeError("inside")
        assert accel.clock.now() == 5.25  # the previous clock is back, though the block raised
        with pytest.raises(ValueError):
            outer.advance(-1)
    before = time.perf_counter()
    assert before <= accel.clock.now() <= time.perf_counter()  # the default: perf_counter again


def test_a_virtual_clocks_forward_cost_is_paid_by_every_copy_of_the_model_on_the_same_clock():
    clock = VirtualClock()
    model = tiny_model()
    handle = clock.per_forward(model, 0.01)
    x = torch.zeros(2, 1, 8, 8)
    model(x)
    copy.deepcopy(model)(x)  # a Lab's trial trains a deep copy: its forwards cost the same, on the same clock
    assert clock() == pytest.approx(0.02) and copy.deepcopy(clock) is clock
    handle.remove()
    model(x)
    assert clock() == pytest.approx(0.02)


@given(regional=st.booleans(), left_s=st.floats(-10, 100),
       expected_steps=st.one_of(st.none(), st.integers(0, 10**6)), done=st.integers(0, 5000),
       step_s=st.one_of(st.none(), st.floats(1e-4, 5.0)))
@settings(max_examples=200, deadline=None)
def test_compile_is_tried_when_its_warm_up_fits_the_budget_or_a_small_share_of_a_long_run_ahead(
        regional, left_s, expected_steps, done, step_s):
    """Both searches start compile when its expected warm-up fits the budget left; in a run of known length also
    when it is within 2% of the run still ahead (then past the budget, and said so); never otherwise."""
    from accel.search.results import LONG_RUN_SHARE, run_ahead_s, warmup_fit
    from accel.search.settings import COSTLY_GUESS_S

    candidate = {"compile": {"regional": True} if regional else {}}
    ahead = run_ahead_s(expected_steps, done, step_s)
    assert ahead >= 0 and (ahead == 0 if not expected_steps or step_s is None or done >= expected_steps else ahead > 0)
    guess = COSTLY_GUESS_S  # nothing remembered: the assumed warm-up
    fits, allowance_s, reason = warmup_fit(candidate, None, False, left_s, ahead)
    assert f"about {guess:.0f} s, assumed" in reason or not reason
    assert f"about {guess:.0f} s" in reason or not reason
    assert fits == (guess <= left_s or guess <= LONG_RUN_SHARE * ahead)
    past_budget = allowance_s > 0
    assert past_budget == (fits and guess > left_s)
    if past_budget:
        assert "tried past the budget" in reason and allowance_s >= guess
    elif not fits:
        assert "does not fit" in reason and ("run still ahead" in reason) == (ahead > 0)
    else:
        assert reason == ""  # within the budget: nothing to say


class Swift(Accelerator):
    """An optimizer update of its own (as IPEX's fused step): it conflicts with fused_optimizer, and on a Napping model
    it removes the nap, so a plan with it steps in 10 ms where fused_optimizer's steps in 30."""

    name = "swift"
    stage = Stage.KERNELS
    provides = (Capability.OPTIMIZER_UPDATE,)
    conflicts = (Capability.OPTIMIZER_UPDATE,)

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}] if isinstance(model, Napping) else []

    def apply(self, ctx):
        ctx.journal.set_item(ctx.model.__dict__, "nap", 0.0)
        return {"nap": "removed"}


def test_a_candidate_left_out_of_the_stack_for_a_conflict_is_measured_in_a_rival_stack(virtual):
    """fused_optimizer comes first in the stack, so swift, which conflicts with it, was left out and never measured
    (IPEX beside fused_optimizer on an AMX Xeon). The rival stack, swift in fused_optimizer's place, is measured
    against eager and against the stack, and wins where it is established faster than both."""
    register(Swift)
    try:
        result = accel.tune(*objects(Napping()), device="cpu", accelerators=["fused_optimizer", "swift"], budget_s=60)
    finally:
        unregister("swift")
    assert result.plan.names() == ["swift"], result
    row = result.row("swift")
    assert row.status == "measured" and "a rival stack: fused_optimizer made way for swift" in row.decision, row
    assert row.ratio["estimate"] == pytest.approx(1 / 3, abs=1e-3)  # 10 ms of 30 on the clock
    assert "left out of the stack: swift" in result.why and "a rival stack" in result.why


def test_rival_stacks_put_each_conflicting_candidate_first():
    from accel.search.strategy import rival_stacks, stack_of

    candidates = [{"channels_last": {}}, {"fused_optimizer": {}}, {"ipex": {}}, {"amp": {"dtype": "bfloat16"}}]
    assert stack_of(candidates)[0] == {"channels_last": {}, "fused_optimizer": {}, "amp": {"dtype": "bfloat16"}}
    assert rival_stacks(candidates) == [{"ipex": {}, "channels_last": {}, "amp": {"dtype": "bfloat16"}}]
    assert rival_stacks([{"channels_last": {}}, {"amp": {}}]) == []  # nothing conflicts: no rival


class Rested(Swift):
    """Removes the nap as swift does, with nothing to conflict with, at a cost of its own (1 ms a forward): beside
    swift in the stack, slower than swift alone, and as slow together."""

    name = "rested"
    provides = conflicts = ()

    def apply(self, ctx):
        super().apply(ctx)
        ctx.model = Wrapped(ctx.model)
        CLOCK.per_forward(ctx.model, 0.001)
        return {"nap": "removed", "costs": "1 ms per forward"}


def test_a_retired_reference_is_not_built_again_for_a_comparison_the_budget_refuses(custom, virtual, monkeypatch):
    """Each candidate alone, then the two that helped together (not faster): the best, one alone, was retired for that
    comparison, and tune built it again as the reference of awake's, before admit said awake's warm-up does not fit
    the budget left: a plan built and never measured (its first steps, time only)."""
    built = []
    trial = Lab.trial

    def counted(lab, plan):
        built.append(sorted(plan))
        return trial(lab, plan)

    monkeypatch.setattr(Lab, "trial", counted)
    register(Swift)
    register(Rested)
    try:
        result = accel.tune(*objects(Napping()), device="cpu", accelerators=["slow", "swift", "rested", "awake"],
                            budget_s=20)
    finally:
        unregister("swift")
        unregister("rested")
    awake = next(row for row in result.rows if "awake" in row.plan)
    assert awake.status == "not measured" and result.plan.names() == ["swift"], result
    assert built.count(["swift"]) == 1, (built, str(result))
