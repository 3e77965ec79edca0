"""The preservation contract over the zoo of ordinary user code: every built-in accelerator and every plan of up to
three of them trains what the plain loop trains, beyond only what their cards declare, and never touches the
user's objects or the process. At least 1,000 generated cases per run (tests below add up to more)."""
import os
import socket

import pytest
import torch
import torch._dynamo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import accel
from accel.accelerator import REGISTRY
from accel.hardware import ipex_problem, package_version
from accel.testing import check_equivalence
from accel.testing.harness import combined
from accel.testing.zoo import BATCHES, EXTRAS, LOADERS, MODELS, OPTIMIZERS, Case

OPTIONS = {  # a few configurations of each built-in, every one valid for every zoo case
    "threads": [{}, {"threads": 1}, {"affinity": False, "export_env": False}],
    "loader": [{}, {"num_workers": 0}],
    "channels_last": [{}],
    "fused_optimizer": [{}],
    "amp": [{}, {"dtype": "bfloat16"}],
    "activation_checkpointing": [{}, {"modules": ["Conv2d"]}],
    "compile": [{"backend": "eager"}, {"backend": "aot_eager"}],
    "grad_accumulation": [{"steps": 2}, {"steps": 3}],
    "grad_clipping": [{"max_norm": 1.0}, {"value": 0.05}, {"max_norm": 0.5, "norm_type": "inf"}],
    "ddp": [{}],
    "prune": [{}],
    "ipex": [{}],
}
COMMON = sorted(set(OPTIONS) - {"prune", "ipex", "ddp"})
SLOW = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                  HealthCheck.function_scoped_fixture])

cases = st.builds(Case, model=st.sampled_from(sorted(MODELS)), batch=st.sampled_from(BATCHES),
                  extra=st.sampled_from(EXTRAS),
                  loader=st.sampled_from([k for k in LOADERS if k != "workers"] * 4 + ["workers"]),
                  optimizer=st.sampled_from(OPTIMIZERS))


def plans(names, required=()):
    """Plans of up to three accelerators (always holding `required`), each with one of its configurations."""
    others = st.lists(st.sampled_from(names), max_size=3 - len(required), unique=True)
    return others.flatmap(lambda chosen: st.tuples(*[st.sampled_from(OPTIONS[n]).map(lambda o, n=n: {n: o})
                                                     for n in [*required, *chosen]]))


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


@settings(max_examples=int(os.environ.get("ACCEL_ZOO_EXAMPLES", 1000)), **SLOW)
@given(case=cases, plan=plans(COMMON))
def test_plans_of_up_to_three_train_what_the_plain_loop_trains(case, plan):
    result = equivalence(plan, case, steps=3)
    assert result.refused is None, f"{case}\n{result}"
    expect_kept(result, case, plan)


PRUNE_REFUSES = ("dummy_input", "tied", "cannot run", "torch.fx cannot trace", "produce the model's output")


@pytest.mark.skipif(package_version("nni") is None, reason="needs nni (pip install 'accel[prune]')")
@settings(max_examples=40, **SLOW)
@given(case=cases, plan=plans(COMMON, required=("prune",)))
def test_prune_with_up_to_two_others_keeps_every_promise_but_the_structure_it_removes(case, plan):
    result = equivalence(plan, case, steps=2)
    if result.refused:  # refused up front, for a reason it names, the objects untouched
        assert any(reason in result.refused for reason in PRUNE_REFUSES), result.refused
    else:
        assert result.keeps.weights == "changed" and not result.keeps.structure
    expect_kept(result, case, plan)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def one_rank_group():
    """A real gloo process group of one rank, as `torchrun --nproc-per-node 1` gives."""
    import os

    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
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
    assert result.refused is None and "ddp" in result.applied, f"{case}\n{result}"
    expect_kept(result, case, plan)


@pytest.mark.ipex
@pytest.mark.skipif(ipex_problem() is not None, reason=str(ipex_problem()))
@settings(max_examples=20, **SLOW)
@given(case=cases, plan=plans([n for n in COMMON if n not in ("fused_optimizer", "compile")], required=("ipex",)))
def test_ipex_with_up_to_two_others(case, plan):
    result = equivalence(plan, case, steps=2)
    if result.refused:  # e.g. an optimizer that trains a tensor beside the model
        assert "not parameters of the model" in result.refused, result.refused
    expect_kept(result, case, plan)


def test_ipex_refused_here_leaves_everything_as_it_was():
    if ipex_problem() is None:
        pytest.skip("IPEX works here: the ipex session runs it for real")
    result = check_equivalence(["ipex", "channels_last"], Case().build)
    assert result.refused and ipex_problem() in result.refused
    expect_kept(result, Case(), ["ipex"])


@pytest.mark.slow
def test_inductor_compile_keeps_the_same_math():
    result = check_equivalence(["compile", "channels_last"], Case("batchnorm", "dict", "mask", "shuffled", "adam").build)
    assert result.applied == ["channels_last", "compile"]
    expect_kept(result, None, None)


def test_the_harness_finds_what_a_plan_changes_beyond_its_card(monkeypatch):
    """A card that promises too much is caught: grad_clipping declared exact would differ where it clips."""
    from accel.accelerators.grad_clipping import GradClipping

    monkeypatch.setattr(GradClipping, "keeps", accel.Keeps())
    result = check_equivalence([{"grad_clipping": {"max_norm": 1e-3}}], Case(optimizer="sgd").build)
    assert not result.ok and any(d.startswith("weights:") for d in result.differences)
    assert combined([accel.Keeps(), accel.Keeps("float", 1e-4, 1e-5, 1e-4)]).weights == "float"
