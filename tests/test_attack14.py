"""Probes of the session's behaviour-preserving cuts (adf186f..be65a2d) from outside, each a test that failed before
its fix.

- A plan cache entry is a file anyone with access to a shared cache folder can write. JSON's integers have no
  bound: a number of a few hundred digits in an entry (a warm-up's ``seconds``, a row's ``median_ms``) passed
  cache._entry and then raised OverflowError out of accelerate(plan="auto") (float(), a '.1f' format), where a
  damaged entry is measured again.
- prune's NNI import moved into nni_quiet() (the _masks cut): NNI's import sets its own logger to INFO, so in a
  process that had not imported NNI yet the quiet block was not quiet: every layer's "replace module" line went to
  the user's stdout.
- An answer's values were checked only by printing its table (cached_answer: str(result)): a row whose ``tests`` is
  a list, or ``settings`` that is a list, passed, and raised TypeError out of the user's first batch (the verdict's
  words, the settled step).
- compile's marker of a setup (in the same shared cache folder) with a ``first_run`` of a few hundred digits raised
  OverflowError out of compile's apply: the compile plan failed where a damaged marker means a cold start."""
import json
import os
import subprocess
import sys

import pytest
from faults.test_cache_entry_trust import one_step, planted, searched_result

import accel.accelerators.compile.cache as compile_cache
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


@pytest.mark.parametrize("row, top", [({"tests": ["channels_last"]}, {}), ({}, {"settings": []})])
def test_an_answer_with_values_of_another_kind_is_measured_again(tmp_path, monkeypatch, row, top):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    result = {**searched_result({"channels_last": {}}), **top}
    result["rows"] = [{"name": "channels_last", "plan": {"channels_last": {}}, "status": "measured",
                       "decision": "chosen", "median_ms": 5.0, **row}]
    one_step(planted(tmp_path, result))  # it raised TypeError from the user's first batch


def test_a_compile_marker_with_a_number_beyond_floats_is_a_cold_start(tmp_path):
    facts = {"model": "Net 0123", "compile": {"backend": "inductor"}}
    assert compile_cache.warm_before(tmp_path, facts) == (False, 0)  # writes this setup's marker
    marker = next((tmp_path / compile_cache.MARKERS).iterdir())
    marker.write_text(json.dumps({"setup": facts, "first_run": HUGE, "last_run": 0}))
    assert compile_cache.warm_before(tmp_path, facts) == (False, 0)  # it raised OverflowError
    assert json.loads(marker.read_text())["first_run"] < float("inf")  # this run's marker replaces it


PRUNE_IN_A_FRESH_PROCESS = """
import logging, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from sklearn.datasets import load_digits
import accel

digits = load_digits()
x, y = torch.tensor(digits.data[:128], dtype=torch.float32) / 16, torch.tensor(digits.target[:128])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(x, y), batch_size=32)
assert "nni" not in sys.modules
print("BEGIN", flush=True)
run = accel.accelerate(model, optimizer, loader, device="cpu",
                       plan={"prune": {"config_list": [{"op_types": ["Linear"], "sparse_ratio": 0.5}]}})
print("END", run.report.applied, flush=True)
run.close()
"""


@pytest.mark.slow
def test_prune_in_a_process_that_never_imported_nni_keeps_nni_quiet():
    """prune's _masks imported NNI inside nni_quiet(): NNI's import sets its logger to INFO, over the WARNING the block
    had just set, and NNI's 'replace module ...' line for every layer went to the user's stdout; NNI's handler also
    wrote its 'no multi-dimension masks found' warnings there."""
    done = subprocess.run([sys.executable, "-c", PRUNE_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    during = done.stdout.split("BEGIN", 1)[1].split("END", 1)[0]
    assert "replace module" not in during and "replace linear" not in during, during
    assert during.strip() == "", during  # nor NNI's warnings on its own mask bookkeeping (they go to accel's log)
    assert "['prune']" in done.stdout
