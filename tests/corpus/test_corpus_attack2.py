"""More upstream loops through the corpus's test (tests/corpus/test_corpus.py, its plans and its verdicts): each port
plain and through every plan it admits, held to the cards by accel.testing.check_equivalence; and what the ports
showed beyond the harness (a closure optimizer's idle rows)."""
import importlib
import warnings

import pytest
import torch

from accel.testing import check_equivalence
from corpus import test_corpus as corpus

PORTS = ["examples_time_sequence", "examples_siamese", "examples_super_resolution", "examples_actor_critic"]
KNOWN: dict[tuple[str, str], str] = {}  # what these ports found that is not fixed yet, each a strict xfail


@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.slow) if p in corpus.SLOW else p
                                  for p in [*corpus.PLANS, "stack"]])
@pytest.mark.parametrize("port", PORTS)
def test_more_loops_train_as_upstream_through_every_plan_they_admit(port, plan, request):
    module = importlib.import_module(f"corpus.{port}")
    if plan in getattr(module, "LEAVES_OUT", ()):
        pytest.skip(f"{port}: {plan} is beyond its card on this loop without accel too (the port's docstring)")
    if plan not in getattr(module, "ONLY", (plan,)):
        pytest.skip(f"{port} runs only {module.ONLY} (the port says why)")
    if (port, plan) in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[port, plan], strict=True))
    corpus.test_the_loop_trains_as_upstream_through_every_plan_it_admits(port, plan, request)


@pytest.mark.parametrize("name", ["grad_accumulation", "grad_clipping"])
def test_a_closure_optimizer_stepped_by_the_loop_sets_the_step_accelerators_idle_naming_it(name):
    module = importlib.import_module("corpus.examples_time_sequence")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = check_equivalence(corpus.plan_of(name, module), module.build, steps=2)
    assert result.ok and name in result.idle and module.IDLE[name] in result.idle[name], result
    assert any(name in str(w.message) and "closure" in str(w.message) for w in caught
               if type(w.message).__name__ == "BypassWarning"), [str(w.message) for w in caught]


def test_check_equivalence_takes_a_loader_over_a_tensor():
    from torch.utils.data import DataLoader

    module = importlib.import_module("corpus.examples_actor_critic")

    def build():  # upstream's loop over episodes, its seeds a tensor (DataLoader(torch.arange(n)): a map-style dataset)
        setup = module.build()
        setup.loader = DataLoader(torch.arange(543, 551), batch_size=None)
        return setup

    assert check_equivalence(["threads"], build, steps=2).ok
