"""The preservation contract over the zoo of ordinary user code: every built-in accelerator and every plan of up to
three of them trains what the plain loop trains, beyond only what their cards declare, and never touches the
user's objects or the process. 300 generated plans of up to three per run (ACCEL_ZOO_EXAMPLES), 140 more below."""
import os

import pytest
import torch
import torch._dynamo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripts.launching import one_rank_env
from zoo import BATCHES, EXTRAS, LOADERS, MODELS, OPTIMIZERS, Case
from zoo.loops import LOOPS

import accel
from accel.hardware import ipex_problem, package_version
from accel.plan.contract import REGISTRY
from accel.testing import check_equivalence
from accel.testing.comparison import LEVELS, combined

OPTIONS = {  # a few configurations of each built-in, every one valid for every zoo case
    "threads": [{}, {"threads": 1}, {"affinity": False, "export_env": False}],
    "loader": [{}, {"num_workers": 0}, {"num_workers": 1}],  # 1: a rebuild for every loader but "workers"
    "channels_last": [{}],
    "fused_optimizer": [{}],
    "amp": [{}, {"dtype": "bfloat16"}],
    "activation_checkpointing": [{}, {"modules": ["Conv2d"]}, {"modules": ["Net"]}],  # Net: the whole model, handed
    # the loop's own tensors (which inplace_input changes after the forward)
    "compile": [{"backend": "eager"}, {"backend": "aot_eager"}, {"backend": "eager", "regional": True}],
    "grad_accumulation": [{"steps": 2}, {"steps": 3}],
    "grad_clipping": [{"max_norm": 1.0}, {"value": 0.05}, {"max_norm": 0.5, "norm_type": "inf"}],
    "ddp": [{}],
    "fsdp": [{}, {"reshard_after_forward": False}],
    "prune": [{}],
    "ipex": [{}],
}
COMMON = sorted(set(OPTIONS) - {"prune", "ipex", "ddp", "fsdp"})
SLOW = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                  HealthCheck.function_scoped_fixture])

cases = st.builds(Case, model=st.sampled_from(sorted(MODELS)), batch=st.sampled_from(BATCHES),
                  extra=st.sampled_from(EXTRAS),
                  loader=st.sampled_from([k for k in LOADERS if k != "workers"] * 4 + ["workers"]),
                  optimizer=st.sampled_from(OPTIMIZERS), loop=st.sampled_from(sorted(LOOPS)))
# a copy of a model (prune, IPEX) leaves what the user built before accelerate() stale, as the report says: the
# loops that follow its advice (built after, on run.*) must still train as the plain loop
# (not "again": accelerate() again on the user's objects copies them anew, which the report names stale as well)
after_only = st.sampled_from(sorted(name for name, loop in LOOPS.items()
                                    if not getattr(loop, "holds_from_before", False) and name != "again"))
copying_cases = st.builds(Case, model=st.sampled_from(sorted(MODELS)), batch=st.sampled_from(BATCHES),
                          extra=st.sampled_from(EXTRAS),
                          loader=st.sampled_from([k for k in LOADERS if k != "workers"] * 4 + ["workers"]),
                          optimizer=st.sampled_from(OPTIMIZERS), loop=after_only)


def plans(names, required=()):
    """Plans of up to three accelerators (always holding `required`), each with one of its configurations."""
    others = st.lists(st.sampled_from(names), max_size=3 - len(required), unique=True)
    return others.flatmap(lambda chosen: st.tuples(*[st.sampled_from(OPTIONS[n]).map(lambda o, n=n: {n: o})
                                                     for n in [*required, *chosen]]))


# named refusals of the loader: another number of workers on a stream (an IterableDataset is batched inside each
# worker); a change of persistent workers (or no workers under them) would shift the shuffle from the second epoch;
# and compile's, of the whole model where it checkpoints itself and holds BatchNorm
LOADER_REFUSES = ("batches depend on the number of workers", "does not shard", "shifts the shuffle",
                  "checkpoints its own activations")


def equivalence(plan, case, steps):
    """One zoo case; plans that compile start from an empty dynamo cache.

    A run compiles one model; this test compiles hundreds of instances of one class in one process. On torch 2.8,
    once that class's forward passed dynamo's recompile limit (8), a later compiled instance trained differently
    from eager (the same first loss, 0.3% off by the third step; reproduced, and gone with a larger limit or a
    reset: dynamo then compiles the inner frames one by one, pytorch/pytorch#128954). torch 2.15 never showed it.
    """
    if any("compile" in entry for entry in plan):
        torch._dynamo.reset()
    return check_equivalence(list(plan), case.build, steps=steps)


def expect_kept(result, case, plan):
    assert result.failed is None, f"{case}\n{result}"
    assert not result.objects_changed and not result.process_changed, f"{case}\n{result}"
    assert not result.differences, f"{case}\n{result}"


def test_every_built_in_accelerator_is_in_the_zoo_run():
    assert set(OPTIONS) == set(REGISTRY) - {n for n, c in REGISTRY.items() if c.__module__.startswith("tests")}


@settings(max_examples=int(os.environ.get("ACCEL_ZOO_EXAMPLES", 300)), **SLOW)
@given(case=cases, plan=plans(COMMON))
def test_plans_of_up_to_three_train_what_the_plain_loop_trains(case, plan):
    result = equivalence(plan, case, steps=3)
    assert result.refused is None or any(r in result.refused for r in LOADER_REFUSES), f"{case}\n{result}"
    expect_kept(result, case, plan)


PRUNE_REFUSES = ("dummy_input", "tied", "cannot run", "torch.fx cannot trace", "produce the model's output",
                 "computed from other tensors")


@pytest.mark.skipif(package_version("nni") is None, reason="needs nni (pip install 'accel[prune]')")
@settings(max_examples=40, **SLOW)
@given(case=copying_cases, plan=plans(COMMON, required=("prune",)))
def test_prune_with_up_to_two_others_keeps_every_promise_but_the_structure_it_removes(case, plan):
    result = equivalence(plan, case, steps=2)
    if result.refused:  # refused up front, for a reason it names (prune's, or the loader's), the objects untouched
        assert any(reason in result.refused for reason in (*PRUNE_REFUSES, *LOADER_REFUSES)), result.refused
    else:
        assert result.keeps.weights == "changed" and not result.keeps.structure
    expect_kept(result, case, plan)


NEEDS_OPTIMIZER = ("needs the optimizer",)  # fused_optimizer, grad_accumulation, grad_clipping; amp's loss scaling


@pytest.mark.parametrize("model", ["batchnorm", "spectral"])
def test_a_loop_with_no_optimizer_trains_as_it_does_or_is_refused_up_front(model):
    """word_language_model's loop (weights moved by hand after clip_grad_norm_, no optimizer) through every built-in's
    configurations: kept to the cards, or refused before anything changed. Before: amp with fp16 scaled the loss by
    65536 and nothing unscaled it (the weights became NaN), and run.unscale_gradients() raised AttributeError."""
    case = Case(model, optimizer="none", loop="manual_update")
    for name in COMMON:
        for options in (OPTIONS[name][:1] if name == "compile" else OPTIONS[name]) + (
                [{"dtype": "float16"}] if name == "amp" else []):
            result = equivalence([{name: options}], case, steps=3)
            if result.refused:
                assert any(r in result.refused for r in NEEDS_OPTIMIZER), f"{name} {options}\n{result}"
            expect_kept(result, case, [name])


@pytest.fixture(scope="module")
def one_rank_group():
    """A real gloo process group of one rank, as `torchrun --nproc-per-node 1` gives."""
    import os

    env = one_rank_env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


@settings(max_examples=40, **SLOW)
@given(case=cases, plan=plans(COMMON, required=("ddp",)))
def test_ddp_in_a_launched_job_with_up_to_two_others(one_rank_group, case, plan):
    result = equivalence(plan, case, steps=3)
    if result.refused:
        assert any(r in result.refused for r in LOADER_REFUSES), f"{case}\n{result}"
    else:
        assert "ddp" in result.applied, f"{case}\n{result}"
    expect_kept(result, case, plan)


# under fsdp, a gradient hook on a sharded parameter is named stale, and FSDP2 cannot deep-copy (EMA, SWA): the
# other loops (tests/test_fsdp.py tests those three)
sharded_cases = st.builds(Case, model=st.sampled_from(sorted(MODELS)), batch=st.sampled_from(BATCHES),
                          extra=st.sampled_from(EXTRAS),
                          loader=st.sampled_from([k for k in LOADERS if k != "workers"] * 4 + ["workers"]),
                          optimizer=st.sampled_from(OPTIMIZERS),
                          loop=st.sampled_from(sorted(set(LOOPS) - {"hooks", "ema", "swa"})))


@settings(max_examples=40, **SLOW)
@given(case=sharded_cases, plan=plans(COMMON, required=("fsdp",)))
def test_fsdp_in_a_launched_job_with_up_to_two_others(one_rank_group, case, plan):
    result = equivalence(plan, case, steps=3)
    if result.refused:  # the extra_tensor optimizer trains a tensor outside the model: fsdp cannot shard it
        assert any(r in result.refused for r in (*LOADER_REFUSES, "that are not the model's",
                                                     "in the middle of accumulating gradients under fsdp")), \
            f"{case}\n{result}"
    else:
        assert "fsdp" in result.applied, f"{case}\n{result}"
    expect_kept(result, case, plan)


def ipex_can_follow(case) -> bool:
    """IPEX's model holds prepacked weights: an AveragedModel of it averages other shapes, and in eval() its
    convolutions fail in oneDNN ("could not create a primitive descriptor", IPEX 2.8)."""
    return case.loop not in ("ema", "swa", "validation")


@pytest.mark.ipex
@pytest.mark.skipif(ipex_problem() is not None, reason=str(ipex_problem()))
@settings(max_examples=20, **SLOW)
@given(case=copying_cases.filter(ipex_can_follow),
       plan=plans([n for n in COMMON if n not in ("fused_optimizer", "compile")], required=("ipex",)))
def test_ipex_with_up_to_two_others(case, plan):
    result = equivalence(plan, case, steps=2)
    if result.refused:  # e.g. an optimizer that trains a tensor beside the model, or the loader's named refusals
        assert any(r in result.refused for r in ("not parameters of the model", *LOADER_REFUSES)), result.refused
    expect_kept(result, case, plan)


def test_ipex_refused_here_leaves_everything_as_it_was():
    if ipex_problem() is None:
        pytest.skip("IPEX works here: the ipex session runs it for real")
    result = check_equivalence(["ipex", "channels_last"], Case().build)
    assert result.refused and ipex_problem() in result.refused
    expect_kept(result, Case(), ["ipex"])


@pytest.mark.slow
def test_inductor_compile_keeps_the_same_math():
    result = check_equivalence(["compile", "channels_last"],
                               Case("batchnorm", "dict", "mask", "shuffled", "adam").build)
    assert result.applied == ["channels_last", "compile"]
    expect_kept(result, None, None)


def test_the_harness_finds_what_a_plan_changes_beyond_its_card(monkeypatch):
    """A card that promises too much is caught: grad_clipping declared exact would differ where it clips."""
    from accel.accelerators.grad_clipping import GradClipping

    monkeypatch.setattr(GradClipping, "keeps", accel.Keeps())
    result = check_equivalence([{"grad_clipping": {"max_norm": 1e-3}}], Case(optimizer="sgd").build)
    assert not result.ok and any(d.startswith("weights:") for d in result.differences)
    assert combined([accel.Keeps(), accel.Keeps("float", 1e-4, 1e-5, 1e-4)]).weights == "float"


def reference_trace():
    from accel.testing.trace import Trace

    return Trace(batches=["b0", "b1"], outputs=["float32[16, 10]", "float32[16, 10]"], losses=[2.3, 2.2],
                 state={"fc.weight": torch.ones(10, 4), "bn.num_batches_tracked": torch.tensor(2)},
                 optimizer={"fc.weight": {"exp_avg": torch.zeros(10, 4), "step": torch.tensor(2.0)}},
                 trainable={"fc.weight": True}, groups=[{"lr": 0.01, "betas": (0.9, 0.999)}],
                 rates=[[0.01], [0.01]], steps_counted=2, user={"your model's fc.weight": torch.ones(10, 4)},
                 observed={"average fc.weight": torch.ones(10, 4)}, closed=((), "[]"))


def changed_batches(t):
    t.batches[1] = "other"


def changed_second_output(t):
    t.outputs[1] = "float32[99]"


def changed_shape(t):
    t.state["fc.weight"] = torch.ones(10, 5)


def changed_flag(t):
    t.trainable["fc.weight"] = False


def changed_frozen(t):
    t.frozen_moved = ["conv1.weight"]


def changed_lr(t):
    t.groups = [{"lr": 0.015, "betas": (0.9, 0.999)}]


def changed_counter(t):
    t.state["bn.num_batches_tracked"] = torch.tensor(4)


def changed_optimizer_keys(t):
    del t.optimizer["fc.weight"]["exp_avg"]


def changed_weights(t):
    t.state["fc.weight"] = torch.full((10, 4), 1.5)


def changed_losses(t):
    t.losses = [2.3, 2.9]


def changed_rates(t):
    t.rates[1] = [0.02]


def changed_counter_of_the_run(t):
    t.steps_counted = 0


def changed_user_objects(t):
    t.user["your model's fc.weight"] = torch.full((10, 4), 1.5)


def changed_what_the_loop_built(t):
    t.observed["average fc.weight"] = torch.full((10, 4), 1.5)


def left_hooks_after_close(t):
    t.closed = (("fc:_forward_pre_hooks:1",), "[]")


# (what the accelerated run changed, the levels at which the harness must say so, the word it starts with)
BRANCHES = [(changed_batches, LEVELS, "batches"), (changed_second_output, LEVELS, "outputs"),
            (changed_shape, LEVELS, "structure"), (changed_flag, LEVELS, "requires_grad"),
            (changed_frozen, LEVELS, "frozen"), (changed_lr, LEVELS, "optimizer hyper-parameters"),
            (changed_counter, ("exact", "float", "tolerance"), "counters"),
            (changed_optimizer_keys, ("exact", "float", "tolerance"), "optimizer state"),
            (changed_weights, ("exact", "float", "tolerance"), "weights"),
            (changed_losses, ("exact", "float", "tolerance"), "losses"),
            (changed_rates, LEVELS, "learning rates"), (changed_counter_of_the_run, LEVELS, "counters"),
            (left_hooks_after_close, LEVELS, "after run.close()"),
            (changed_user_objects, ("exact", "float", "tolerance"), "your objects"),
            (changed_what_the_loop_built, ("exact", "float", "tolerance"), "what the loop built")]


@pytest.mark.parametrize("change,levels,word", BRANCHES, ids=[b[0].__name__ for b in BRANCHES])
@pytest.mark.parametrize("level", LEVELS)
def test_every_comparison_of_the_harness_can_fail(change, levels, word, level):
    import copy

    from accel.testing.comparison import compare

    keeps = accel.Keeps(level, rtol=1e-3, atol=1e-4, loss_rtol=0.05)
    reference = reference_trace()
    assert compare(reference, reference_trace(), keeps) == []
    accelerated = copy.deepcopy(reference)
    change(accelerated)
    found = compare(reference, accelerated, keeps)
    if level in levels:
        assert any(d.startswith(word) for d in found), found


@pytest.mark.parametrize("step_accelerator",
                         [{"grad_clipping": {"max_norm": 1e9}}, {"grad_accumulation": {"steps": 2}}],
                         ids=["grad_clipping", "grad_accumulation"])
def test_a_step_accelerator_in_the_plan_does_not_hide_what_another_changes(step_accelerator):
    """grad_clipping and grad_accumulation change the training by their cards; they run in the reference too, so
    an accelerator beside them that promises exactness and scales the gradients is still caught."""
    from accel.plan.contract import Stage, register, unregister

    @register
    class Louder(accel.Accelerator):
        name, stage = "louder", Stage.PRECISION

        def apply(self, ctx):
            return {}

        def backward(self, run, state, loss, proceed):
            return proceed(loss * 1.5)

    try:
        result = check_equivalence([step_accelerator, "louder"], Case(optimizer="sgd").build, steps=4)
    finally:
        unregister("louder")
    assert result.keeps.weights == "exact" and any(d.startswith("weights:") for d in result.differences), result
    alone = check_equivalence([step_accelerator], Case(optimizer="sgd").build, steps=4)
    assert not alone.differences, alone


def test_a_loop_that_amplifies_last_bits_is_judged_against_its_own_reach():
    """AdamW at lr 0.01 on the dense model: a last-bit nudge of its weights can send it across a ReLU's kink, after
    which it ends 3% away (on one CPU the nudge down does, on another the nudge up): fused AdamW, bit for bit the same
    on one CPU, ends beyond the float card on another. A plan that makes each of the four last-bit nudges the harness
    tries on the plain loop (weights once or every gradient, up or down) is judged against the loop's own reach, so
    each passes, and on every CPU one of them goes beyond the card and is named amplified; a calm loop is held to the
    card as before."""
    import itertools
    from dataclasses import dataclass

    from accel.plan.contract import SAME_MATH, Stage, register, unregister

    @dataclass
    class Nudges(accel.State):
        every_gradient: bool = False
        toward: float = 0.0
        nudged: bool = False

    @register
    class LastBit(accel.Accelerator):
        name, stage, keeps = "last_bit", Stage.PRECISION, SAME_MATH

        def apply(self, ctx):
            return Nudges()

        def forward_context(self, run, state):
            if not state.every_gradient and not state.nudged:
                with torch.no_grad():
                    for p in run.model.parameters():
                        p.copy_(torch.nextafter(p, p.new_tensor(state.toward)))
            state.nudged = True
            return None

        def backward(self, run, state, loss, proceed):
            proceed(loss)
            with torch.no_grad():
                for p in run.model.parameters() if state.every_gradient else ():
                    if p.grad is not None:
                        p.grad.copy_(torch.nextafter(p.grad, p.grad.new_tensor(state.toward)))

    chaotic = Case(model="dense", batch="tuple", extra="none", loader="plain", optimizer="adamw", loop="ema")
    amplified = []
    try:
        for every_gradient, toward in itertools.product((False, True), (float("inf"), float("-inf"))):
            LastBit.apply = lambda self, ctx, e=every_gradient, t=toward: Nudges(every_gradient=e, toward=t)
            result = check_equivalence(["last_bit"], chaotic.build, steps=40)
            assert result.ok and not result.differences, result
            amplified.append(result.amplified)
    finally:
        unregister("last_bit")
    assert max(amplified) > 1e-3, amplified
    calm = Case(model="cnn", batch="tuple", extra="none", loader="plain", optimizer="momentum", loop="add_group")
    result = check_equivalence([{"fused_optimizer": {}}], calm.build, steps=3)
    assert result.ok and result.amplified == 0.0, result
