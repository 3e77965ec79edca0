"""What a plan cache entry in a shared folder (anyone with access may write one) can set beyond what a search chooses.
The search offers each accelerator's ``candidates()`` only (threads: ``{}``, its own count; amp on a CPU: bfloat16
where the CPU computes it natively, else nothing), and checks the loss of each before it keeps one. An entry was
checked for code (compile.options), for its form and for accelerators that change what is trained (accel/search/
cache.py _entry), not for options no search of this setup could have answered: a file's word set 48 compute threads
on this machine's few CPUs, or trained in float16 on a CPU, with no loss ever checked. Closed: an answer from the
cache is taken only where each accelerator's options are a candidate of the search here (accel/search/results.py
cached_answer), else it is said and the search measures."""
import warnings

import torch
from test_cache_entry_trust import planted, searched_result

import accel
import accel.search.cache as plancache
from accel.measure import TrainStep
from accel.search.settings import generate_candidates, placed
from accel.testing import tiny_setup

CPU = torch.device("cpu")


def first_step(setup):
    """plan="auto" over the setup, one step of the README's loop; the run's threads and decisions then."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan="auto", device="cpu")
    try:
        x, y = next(iter(run.loader))
        with run.autocast():
            loss = torch.nn.functional.cross_entropy(run.model(x), y)
        run.backward(loss)
        run.step()
        return run.report.applied, torch.get_num_threads(), dict(run.report.decisions)
    finally:
        run.close()


def offered(setup) -> list:
    """What a search of this setup may choose from (accel.search.settings)."""
    return generate_candidates(placed("cpu")[2], setup.model, setup.optimizer, setup.loader)


def test_an_entry_of_a_candidate_the_search_offers_is_taken(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    setup = planted(tmp_path, searched_result({"threads": {}}))
    assert {"threads": {}} in offered(setup)
    assert first_step(setup)[0] == ["threads"]


def test_an_entry_cannot_set_a_thread_count_no_search_chooses(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    setup = planted(tmp_path, searched_result({"threads": {"threads": 48, "affinity": False}}))
    assert not any(c.get("threads", {}).get("threads") == 48 for c in offered(setup))
    _, threads, decisions = first_step(setup)
    assert threads != 48 and decisions.get("threads") != "48", "a cache file set 48 compute threads"


def test_an_entry_cannot_make_auto_train_in_float16_on_a_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    setup = planted(tmp_path, searched_result({"amp": {"dtype": "float16"}}))
    assert {"amp": {"dtype": "float16"}} not in offered(setup)
    _, _, decisions = first_step(setup)
    assert decisions.get("compute_dtype") != "float16", "a cache file made plan='auto' train in float16"


def planted_for(folder, plan: dict, settings: accel.Auto):
    """tiny_setup's objects, and an entry of this plan for the facts a search with these settings looks up."""
    setup = tiny_setup()
    facts = plancache.setup_key(setup.model, setup.optimizer, setup.loader, next(iter(setup.loader)), CPU,
                                placed("cpu")[2], TrainStep(), settings.key())
    plancache.store(facts, searched_result(plan), folder)
    return setup


def test_an_entry_not_taken_is_said_and_the_search_measures(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    setup = planted(tmp_path, searched_result({"threads": {"threads": 48, "affinity": False}}))
    run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan="auto", device="cpu")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            next(iter(run.loader))
        said = [str(w.message) for w in caught if "plan cache entry" in str(w.message)]
        assert len(said) == 1 and 'threads {"threads": 48' in said[0] and "not taken" in said[0], said
        assert caught[0].filename == __file__  # the loop's own line
        assert run.phase == "measuring" and run.report.tuning is None
    finally:
        run.close()


def test_an_entry_of_a_candidate_the_user_did_not_give_is_not_taken(tmp_path):
    """threads is a candidate the search generates, but a search given its candidates tries those only."""
    settings = accel.Auto(cache=tmp_path, candidates=[["channels_last"]])
    setup = planted_for(tmp_path, {"threads": {}}, settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan=settings, device="cpu")
    try:
        next(iter(run.loader))
        assert run.phase == "measuring" and "threads" not in run.plan.names()
    finally:
        run.close()


def test_tune_does_not_take_an_entry_of_options_it_does_not_offer(tmp_path):
    """accel.tune (the search apart) reads the same entries."""
    settings = accel.Auto(cache=tmp_path, accelerators=["threads"], budget_s=2)
    setup = planted_for(tmp_path, {"threads": {"threads": 48, "affinity": False}}, settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = accel.tune(setup.model, setup.optimizer, setup.loader, device="cpu", settings=settings)
    assert not result.from_cache and result.plan.to_dict().get("threads", {}).get("threads") != 48, result
    assert any("not taken" in str(w.message) for w in caught)
