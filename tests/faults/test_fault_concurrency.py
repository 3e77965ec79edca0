"""Concurrent processes and threads: on the cache folder (writers of one entry, readers, `accel cache clear` in a
folder shared with your own files) and on accelerate() (two threads at once: their warnings, their filters, the
CPUs your own threads were pinned to)."""
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch
from injectors import in_thread, objects, process_state, warm_up

import accel
import accel.accelerators.compile.cache as compile_cache
import accel.search.cache as plancache
from accel.cli import main
from accel.plan.contract import Accelerator, Stage

FACTS = {"model": "the same setup", "settings": {}}


def store_many(folder, times):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for index in range(times):
            plancache.store(FACTS, {"plan": {"amp": {}}, "why": f"writer {os.getpid()} #{index}" + " pad" * 400},
                            folder)
    return [str(w.message) for w in caught]


def test_processes_writing_one_entry_never_give_a_reader_a_broken_one(tmp_path):
    """They shared one temporary name: readers got broken JSON (about 2,000 reads in the audit) and writers false
    'cannot be written' warnings (about 900)."""
    plancache.store(FACTS, {"plan": {"amp": {}}, "why": "first"}, tmp_path)
    entry = tmp_path / f"{plancache.key_of(FACTS)}.json"
    with multiprocessing.get_context("fork").Pool(3) as pool:
        writing = pool.starmap_async(store_many, [(tmp_path, 150)] * 3)
        broken = reads = 0
        while not writing.ready():
            reads += 1
            try:
                json.loads(entry.read_text())
            except ValueError:
                broken += 1
        warned = [w for part in writing.get(timeout=300) for w in part]
    assert reads and broken == 0 and warned == []
    assert sorted(os.listdir(tmp_path)) == [entry.name]  # no temporary file left behind


def test_accel_cache_clear_removes_only_what_accel_wrote(tmp_path, monkeypatch, capsys):
    """A shared ACCEL_CACHE_DIR: clear deleted every *.json and the whole compile/ folder."""
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    plancache.store(FACTS, {"plan": {"amp": {}}}, tmp_path)
    plancache.remember_warmup(FACTS, {"compile": {}}, 3.0)
    (tmp_path / "settings.json").write_text("{}")  # yours
    (tmp_path / "compile").mkdir()
    (tmp_path / "compile" / "notes.txt").write_text("yours")
    assert main(["cache", "clear"]) == 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["compile", "notes.txt", "settings.json"]
    assert "left" in capsys.readouterr().out
    (tmp_path / "compile" / "notes.txt").unlink()
    # accel's own (compile's apply tags it)
    (tmp_path / "compile" / compile_cache.TAG).write_text(compile_cache.TAG_TEXT)
    (tmp_path / "compile" / "fxgraph").mkdir()
    assert main(["cache", "clear"]) == 0
    assert not (tmp_path / "compile").exists() and (tmp_path / "settings.json").exists()


WRITER = """
import pathlib, sys, time
from accel.files import write_atomically
path, started, go = map(pathlib.Path, sys.argv[1:])
def write(file):
    file.write(b'{"whole": true}')
    started.touch()
    while not go.exists():
        time.sleep(0.01)
write_atomically(path, write)
"""


def test_accel_cache_clear_leaves_a_live_writers_temporary_and_removes_a_dead_ones(tmp_path, monkeypatch):
    """Before: `accel cache clear` removed every temporary file of accel's in the folder, also the one another process
    was writing an entry into at that moment, whose write then failed (the entry it measured was lost)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(cache))
    dead = subprocess.run([sys.executable, "-c", "import pathlib, sys; from accel.files import temporary_name; "
                           "temporary_name(pathlib.Path(sys.argv[1])).write_text('')", str(cache / "old.json")],
                          timeout=60)
    assert dead.returncode == 0
    started, go = tmp_path / "started", tmp_path / "go"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(cache / "entry.json"), str(started), str(go)],
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and writer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert started.exists(), writer.stderr.read() if writer.poll() is not None else "the writer never started"
        assert main(["cache", "clear"]) == 0
        go.touch()
        assert writer.wait(60) == 0, writer.stderr.read()
    finally:
        writer.kill()
    assert sorted(p.name for p in cache.iterdir()) == ["entry.json"]  # the dead writer's temporary went
    assert json.loads((cache / "entry.json").read_text()) == {"whole": True}


class Warns(Accelerator):
    """Warns its own message while applying, once both threads are applying (so their captures overlap); the
    thread that waits warns after the other ended its capture."""

    name, stage = "warns", Stage.KERNELS
    message, waits, barrier, first = "", False, None, None

    def apply(self, ctx):
        self.barrier.wait(timeout=60)
        if self.waits:
            self.first.wait(timeout=60)
        warnings.warn(f"from {self.message}")
        if not self.waits:
            self.first.set()
        return {}


def two_threads_accelerate() -> dict:
    barrier, first = threading.Barrier(2), threading.Event()
    runs = {}

    def accelerate(name):
        kind = type(f"Warns{name}", (Warns,), {"message": name, "waits": name == "b", "barrier": barrier,
                                               "first": first})
        runs[name] = accel.accelerate(*objects(), plan=[kind()], device="cpu")

    threads = [threading.Thread(target=accelerate, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return runs


def test_two_threads_in_accelerate_keep_their_own_warnings_and_leave_no_filter():
    """catch_warnings is process-wide: the first to leave restored the filters, the second left its 'always'
    above the user's for good, and one run's report held the other's warning."""
    for run in two_threads_accelerate().values():  # what the first runs import adds its own filters (sympy's)
        run.close()
    filters = list(warnings.filters)
    runs = two_threads_accelerate()
    assert {n: r.report.row("warns").warnings for n, r in runs.items()} == {"a": ["from a"], "b": ["from b"]}
    for run in runs.values():
        run.close()
    assert warnings.filters == filters


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin a thread to one of them")
@pytest.mark.parametrize("fails", [False, True], ids=["closed", "failed plan"])
def test_your_threads_pinned_elsewhere_return_there(fails):
    """One mask was saved (the caller's) and written back to every thread: yours, pinned to one CPU, ended on all."""
    warm_up()
    before = process_state()
    mine = sorted(os.sched_getaffinity(0))[-1:]
    ready, done = threading.Event(), threading.Event()
    seen = {}

    def yours():
        os.sched_setaffinity(0, mine)
        ready.set()
        done.wait(60)
        seen["after"] = sorted(os.sched_getaffinity(0))

    thread = threading.Thread(target=yours)
    thread.start()
    ready.wait(60)
    model, optimizer, loader = objects()
    plan = ["threads", Broken()] if fails else ["threads"]
    try:
        accel.accelerate(model, optimizer, loader, plan=plan, device="cpu").close()
    except accel.AccelerateError:
        assert fails
    done.set()
    thread.join(60)
    assert seen["after"] == mine
    assert process_state()[:3] == before[:3]


class Broken(Accelerator):
    name, stage = "broken", Stage.STEP

    def apply(self, ctx):
        raise RuntimeError("fails after threads pinned the process")


def test_runs_in_two_threads_leave_the_process_as_it_was():
    warm_up()
    before = process_state()

    def cycles():
        for _ in range(10):
            model, optimizer, loader = objects()
            run = accel.accelerate(model, optimizer, loader, plan=["threads", "channels_last"], device="cpu")
            run.close()

    workers = [threading.Thread(target=cycles) for _ in range(2)]
    for worker in workers:
        worker.start()
    cycles()
    for worker in workers:
        worker.join(120)
    assert process_state() == before and torch.get_num_threads() == before[0]
    assert in_thread(lambda: 1) == 1
