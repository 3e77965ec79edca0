"""More upstream loops through the corpus's test (tests/corpus/test_corpus.py, its plans and its verdicts), and
plan="auto" on each: pytorch/examples mnist_rnn (an LSTM over the rows, BatchNorm1d, Dropout2d on features) and
vision_transformer (parameters shaped by the batch size, a patch extractor built in each forward), and transformers'
run_mlm_no_trainer (a BERT, DataCollatorForLanguageModeling masking in the collate_fn with torch's random state)."""
import importlib
import warnings

import pytest

from accel.testing import check_equivalence
from corpus import test_corpus as corpus

PORTS = ["examples_mnist_rnn", "hf_run_mlm", "examples_vision_transformer"]
KNOWN: dict[tuple[str, str], str] = {}  # what these ports found that is not fixed yet, each a strict xfail


@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.slow) if p in corpus.SLOW else p
                                  for p in [*corpus.PLANS, "stack"]])
@pytest.mark.parametrize("port", PORTS)
def test_these_loops_train_as_upstream_through_every_plan_they_admit(port, plan, request):
    if (port, plan) in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[port, plan], strict=True))
    corpus.test_the_loop_trains_as_upstream_through_every_plan_it_admits(port, plan, request)


@pytest.mark.slow
@pytest.mark.parametrize("port", PORTS)
def test_these_loops_train_as_upstream_with_the_plan_auto_chooses(port):
    module = importlib.import_module(f"corpus.{port}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_equivalence("auto", module.build, steps=12)  # turns for the plans it tries
    assert result.failed is None and result.refused is None, result
    assert not result.objects_changed and not result.process_changed, result
    assert not result.differences, result
