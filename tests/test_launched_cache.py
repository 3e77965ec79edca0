"""One plan-cache key for a setup, whichever search asks: a launched job takes the single process's answer (plus
ddp by memory fit) and says where it came from. And `accel cache clear` clears compile's artifacts too."""
import dataclasses
import json
import sys

import pytest
import torch
from scripts.launching import SCRIPTS, accel_launch, output, run

import accel.accelerators.compile.cache as compile_cache
import accel.search.cache as plancache
from accel.cli import main
from accel.hardware import probe
from accel.hardware.launcher import NODE_CPUS_VARIABLE, node_cores
from accel.measure import TrainStep
from accel.testing import tiny_loader, tiny_model

IN_LOOP = {"search": "your loop", "tolerance": 0.05, "margin": 0.02, "expected_steps": None, "accelerators": None,
           "candidates": "generated"}  # what the in-loop search keys by
APART = {"budget_s": None, "steps": None, "warmup": 2, "tolerance": 0.05, "margin": 0.02, "expected_steps": None,
         "device": "cpu", "accelerators": None, "candidates": "generated"}  # what tune() keys by


def key(settings, hardware, **changed):
    model = tiny_model()
    loader = tiny_loader()
    facts = plancache.setup_key(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, next(iter(loader)), "cpu",
                                hardware, TrainStep(), {**settings, **changed})
    return plancache.key_of(facts), facts


def test_the_search_that_asks_does_not_change_the_key_but_its_answers_settings_do(monkeypatch):
    monkeypatch.delenv(NODE_CPUS_VARIABLE, raising=False)
    hardware = probe()
    assert key(IN_LOOP, hardware)[0] == key(APART, hardware)[0]
    assert key(APART, hardware, warmup=5, budget_s=30, steps=7)[0] == key(APART, hardware)[0]
    for changed in ({"margin": 0.05}, {"tolerance": 0.1}, {"expected_steps": 1000}, {"accelerators": ["amp"]},
                    {"candidates": [{"amp": {}}]}):
        assert key(APART, hardware, **changed)[0] != key(APART, hardware)[0], changed


def test_a_rank_pinned_to_its_share_counts_the_nodes_cores(monkeypatch):
    monkeypatch.delenv(NODE_CPUS_VARIABLE, raising=False)
    single = probe()
    rank = dataclasses.replace(single, physical_cores=1)  # what a rank of `accel launch` sees: its share
    assert key(APART, rank)[0] != key(APART, single)[0]  # before: 1 core where the single process said its own
    monkeypatch.setenv(NODE_CPUS_VARIABLE, ",".join(map(str, range(single.physical_cores))))
    assert node_cores(1) == single.physical_cores
    assert key(APART, rank)[0] == key(IN_LOOP, single)[0]
    assert f"{single.physical_cores} cores" in key(APART, rank)[1]["cpu"]


def test_accel_launch_tells_the_ranks_the_nodes_cores(capsys):
    physical = probe().physical_cpus
    assert main(["launch", "--nproc-per-node", "1", "--cores-per-proc", "1", "--dry-run", "x.py"]) == 0
    from accel.hardware import format_cpu_list

    assert f"{NODE_CPUS_VARIABLE}={format_cpu_list(physical)}" in capsys.readouterr().out


def test_cache_clear_removes_compiles_artifacts_and_says_how_many(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    compiled = tmp_path / "compile"
    for name in ("fxgraph/ab/entry", "aotautograd/x/entry", "accel-setups/marker.json"):
        (compiled / name).parent.mkdir(parents=True, exist_ok=True)
        (compiled / name).write_bytes(b"x" * 1024)
    plancache.store({"setup": 1}, {"plan": {}, "measured_at": "now"}, tmp_path)
    assert main(["cache", "list"]) == 0
    assert "compile's artifacts: 3 files" in capsys.readouterr().out
    assert main(["cache", "clear", "--key", plancache.key_of({"setup": 1})[:6]]) == 0  # one entry: compile stays
    assert "removed 1 entry" in capsys.readouterr().out and compiled.exists()
    assert main(["cache", "clear"]) == 0
    said = capsys.readouterr().out
    assert "removed 0 entries" in said and "removed compile's artifacts: 3 files (3.0 KiB)" in said, said
    assert not compiled.exists()
    assert compile_cache.clear_compile(tmp_path) == (0, 0)  # nothing left, nothing to say


@pytest.mark.slow
@pytest.mark.skipif(len(probe().physical_cpus) < 2, reason="needs 2 physical cores")
def test_a_launched_job_takes_the_single_process_answer_plus_ddp_and_says_so(tmp_path):
    cache = tmp_path / "cache"
    single = run([sys.executable, str(SCRIPTS / "launched_cache.py"), "single", str(cache)], timeout=240)
    assert single.returncode == 0, output(single)
    measured = json.loads(single.stdout.strip().splitlines()[-1])
    assert measured["plan"] == ["brisk"] and measured["key"], measured
    result = accel_launch("launched_cache.py", "ranks", cache, tmp_path, launch_args=["--nproc-per-node", "2"],
                          timeout=240)
    assert result.returncode == 0, output(result)
    for rank in range(2):
        info = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert info["plan"] == ["brisk", "ddp"] and info["brisk"] == "applied", info
        assert info["from_cache"] and info["key"] == measured["key"], info
        assert info["why"].startswith("ddp: "), info["why"]
        assert ("the answer a single process measured on this setup (your loop, measured " in info["why"]
                and f"cache key {measured['key'][:12]}" in info["why"]), info["why"]
        assert info["same"], "the ranks train the same weights"
