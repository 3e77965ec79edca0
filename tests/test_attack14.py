"""Probes of the session's behaviour-preserving cuts (adf186f..be65a2d) from outside, each a test that failed before
its fix.

- A plan cache entry is a file anyone with access to a shared cache folder can write. JSON's integers have no
  bound: a number of a few hundred digits in an entry (a warm-up's ``seconds``, a row's ``median_ms``) passed
  cache._entry and then raised OverflowError out of accelerate(plan="auto") (float(), a '.1f' format), where a
  damaged entry is measured again."""
import json

from faults.test_cache_entry_trust import one_step, planted, searched_result

import accel.search.cache as plancache

HUGE = 10 ** 400  # beyond float's range: float(HUGE) raises OverflowError
FACTS = {"model": "the same setup", "batch": "float32[16, 8]", "device": "cpu", "cpu": "x", "versions": "v"}
COMPILE = {"compile": {}}


def test_a_warmup_entry_with_a_number_beyond_floats_is_no_entry(tmp_path):
    plancache.remember_warmup(FACTS, COMPILE, 12.0, tmp_path)
    entry = next(tmp_path.glob(f"{plancache.WARMUP}*.json"))
    data = json.loads(entry.read_text())
    data["result"]["seconds"] = HUGE
    entry.write_text(json.dumps(data))
    assert plancache.known_warmup(FACTS, COMPILE, tmp_path) is None  # the guess, as for any damaged entry
    assert plancache.entries(tmp_path) == []  # (a warm-up is not listed)


def test_an_answer_with_a_number_beyond_floats_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    result = searched_result({"channels_last": {}})
    result["rows"] = [{"name": "eager", "plan": {}, "status": "measured", "median_ms": HUGE}]
    setup = planted(tmp_path, result)
    one_step(setup)  # it raised OverflowError: now the entry is no answer, and the search measures in the loop
    assert [row["why"] for row in plancache.entries(tmp_path)] == ["unreadable entry"]
