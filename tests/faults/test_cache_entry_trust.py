"""What a plan cache entry may make plan="auto" do. An entry is a file in a folder that may be shared
(ACCEL_CACHE_DIR) and that anyone with access can write; accel checks its plan for code (compile.options) and its
form, then applies it as the answer of a search. Two gaps, found from outside and closed:

- the plan is applied whatever it holds: an entry naming grad_accumulation, grad_clipping or prune (accelerators
  whose cards change what is trained, which the search never chooses) makes plan="auto" train otherwise, by a file's
  word (accel/search/results.py cached_answer, accel/search/cache.py _entry: only code_problems and Plan.parse);
- an entry of accel's name whose plan is valid but whose result lacks the search's table (``rows``, ``why``, ...)
  passes cache._entry and then raises KeyError out of accelerate(plan="auto") (TuneResult.from_dict), where a
  damaged entry should be measured again."""
import warnings

import pytest
import torch

import accel
import accel.search.cache as plancache
from accel.measure import TrainStep
from accel.search.settings import placed
from accel.testing import tiny_setup

CPU = torch.device("cpu")


def planted(folder, result: dict):
    """tiny_setup's objects, and an entry for exactly the facts plan="auto" will look up for them."""
    setup = tiny_setup()
    facts = plancache.setup_key(setup.model, setup.optimizer, setup.loader, next(iter(setup.loader)), CPU,
                                placed("cpu")[2], TrainStep(), accel.Auto().key())
    plancache.store(facts, result, folder)
    return setup


def searched_result(plan: dict) -> dict:
    """An entry as a settled search writes it (TuneResult.to_dict()), with this plan."""
    return {"plan": plan, "why": "measured", "baseline_ms": 10.0, "elapsed_s": 1.0, "rows": [], "established": True,
            "settings": {"tolerance": 0.05, "margin": 0.02, "expected_steps": None, "accelerators": None,
                         "candidates": "generated", "search": "your loop"}, "measured_at": "2026-11-27T07:45:24"}


def one_step(setup):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan="auto", device="cpu")
    try:
        x, y = next(iter(run.loader))
        run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
        run.step()
        return run.report.applied
    finally:
        run.close()


def test_a_planted_entry_of_what_auto_chooses_is_taken(tmp_path, monkeypatch):
    """The planting reaches the lookup: an entry naming channels_last is applied (the premise of the tests below)."""
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    assert one_step(planted(tmp_path, searched_result({"channels_last": {}}))) == ["channels_last"]


@pytest.mark.parametrize("plan", [
    pytest.param(p, id=next(iter(p)))
    for p in ({"grad_accumulation": {"steps": 4}}, {"grad_clipping": {"max_norm": 1e-6}}, {"prune": {}})])
def test_a_cache_entry_cannot_make_auto_change_what_is_trained(tmp_path, monkeypatch, plan):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    assert not set(one_step(planted(tmp_path, searched_result(plan)))) & set(plan)


def test_a_cache_entry_without_the_search_table_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    assert one_step(planted(tmp_path, {"plan": {"channels_last": {}}})) == []
