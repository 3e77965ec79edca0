"""loader + threads: DataLoader workers run on the CPUs the compute threads leave spare, in real worker processes."""
import os
import pickle
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import accel
from accel.accelerators.loader import PinWorkers, worker_cpus
from accel.hardware import format_cpu_list, probe
from accel.hardware.launcher import CORE_MAP_VARIABLE, Launch
from accel.testing import process_state_restored, tiny_model

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")

INIT = {}  # what the user's worker_init_fn saw, in the worker process


def record_init(worker_id):
    """The user's own worker_init_fn: it runs in the worker, after accel pinned it."""
    INIT["seen"] = (worker_id, tuple(sorted(os.sched_getaffinity(0))))


class WhereAmI(Dataset):
    """Each sample: the CPUs of the process that loads it, and what the worker's worker_init_fn saw."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return {"cpus": tuple(sorted(os.sched_getaffinity(0))), "pid": os.getpid(), "init": INIT.get("seen")}


def keep(sample):  # collate: the sample as it is
    return sample


def user_loader(num_workers=0, context="fork", **kwargs):
    context = context if num_workers else None  # torch refuses a context without workers
    return DataLoader(WhereAmI(), batch_size=None, collate_fn=keep, num_workers=num_workers,
                      multiprocessing_context=context, **kwargs)


def allowed():
    return tuple(sorted(os.sched_getaffinity(0)))


@pytest.mark.parametrize("context", ["fork", "spawn"])  # spawn: PinWorkers is pickled; the child imports torch
def test_workers_run_on_the_spare_cpu_and_the_users_worker_init_fn_still_runs(context):
    cpus = allowed()
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: one to compute on, one spare")
    compute, spare = cpus[:1], cpus[1:]
    model = tiny_model()
    with process_state_restored():
        os.environ[CORE_MAP_VARIABLE] = str(compute[0])  # threads computes on the first CPU only (as accel launch)
        loader = user_loader(num_workers=1, context=context, worker_init_fn=record_init)
        run = accel.accelerate(model, None, loader, ["threads", "loader"], device="cpu")
        try:
            assert run.decisions.cpus == compute and os.sched_getaffinity(0) == set(compute)
            row = run.report.row("loader")
            # the user's loader already had num_workers=1: before, "already has these settings"; pinning is a change
            assert row.status == "applied", row
            assert row.changes["worker_cpus"].startswith(f"{format_cpu_list(spare)} (the spare CPUs: ")
            assert f"minus the compute CPUs {format_cpu_list(compute)}" in row.changes["worker_cpus"]
            assert "then calls yours (record_init)" in row.changes["worker_init_fn"]
            new = run.loader.loader
            assert new is not loader and loader.worker_init_fn is record_init  # the user's loader as it was
            assert isinstance(new.worker_init_fn, PinWorkers) and new.worker_init_fn.user_fn is record_init
            samples = list(run.loader)
        finally:
            run.close()
    assert len(samples) == 4
    for sample in samples:
        assert sample["pid"] != os.getpid()  # loaded in a real worker process
        assert sample["cpus"] == spare  # not the compute CPU it was forked with
        assert sample["init"] == (0, spare)  # the user's worker_init_fn ran, after the pin
    assert "seen" not in INIT  # it ran in the worker, not here


def test_no_spare_cpu_leaves_the_workers_where_they_are_and_says_why():
    cpus = allowed()
    model = tiny_model()
    with process_state_restored():
        os.environ[CORE_MAP_VARIABLE] = format_cpu_list(cpus)  # every allowed CPU computes
        loader = user_loader(num_workers=1, worker_init_fn=record_init)
        run = accel.accelerate(model, None, loader, ["threads", {"loader": {"num_workers": 1}}], device="cpu")
        try:
            row = run.report.row("loader")
            assert row.status == "skipped"  # nothing else to change: the loader is left as it was
            assert f"workers share the compute CPUs {format_cpu_list(cpus)}: no spare CPU" in row.reason
            assert run.loader.loader is loader
            samples = list(run.loader)
        finally:
            run.close()
    assert all(s["cpus"] == cpus and s["init"] == (0, cpus) for s in samples)


def test_no_spare_cpu_with_other_changes_says_why_in_the_row():
    cpus = allowed()
    model = tiny_model()
    with process_state_restored():
        os.environ[CORE_MAP_VARIABLE] = format_cpu_list(cpus)
        run = accel.accelerate(model, None, user_loader(), ["threads", {"loader": {"num_workers": 1}}], device="cpu")
        try:
            row = run.report.row("loader")
            assert row.status == "applied"
            assert row.changes["worker_cpus"].startswith(f"workers share the compute CPUs {format_cpu_list(cpus)}: "
                                                         "no spare CPU")
            assert "worker_init_fn" not in row.changes and run.loader.loader.worker_init_fn is None
        finally:
            run.close()


def test_without_threads_nothing_changes_about_affinity():
    model = tiny_model()
    with process_state_restored():
        before = os.sched_getaffinity(0)
        loader = user_loader(num_workers=1)
        run = accel.accelerate(model, None, loader, [{"loader": {"num_workers": 1}}], device="cpu")
        try:
            row = run.report.row("loader")
            assert row.status == "skipped" and "not pinned" in row.reason and "threads is not in the plan" in row.reason
            assert run.loader.loader is loader and loader.worker_init_fn is None
            samples = list(run.loader)
        finally:
            run.close()
    assert all(set(s["cpus"]) == before for s in samples)


def test_pin_workers_pins_then_calls_the_users_function_and_pickles():
    cpus = allowed()
    calls = []
    record = calls.append
    pin = PinWorkers(cpus[-1:], record)
    assert PinWorkers(cpus[:1], pin).user_fn is record  # re-pinning replaces the CPUs, never nests
    restored = pickle.loads(pickle.dumps(PinWorkers(cpus[-1:], record_init)))  # spawn and forkserver pickle it
    assert restored == PinWorkers(cpus[-1:], record_init)
    with process_state_restored():
        pin(3)
        assert os.sched_getaffinity(0) == set(cpus[-1:])
    assert calls == [3]


def fake_context(allowed_cpus, physical, cpus, launch=None):
    hardware = replace(probe(), cpus_allowed=allowed_cpus, physical_cpus=physical)
    return SimpleNamespace(hardware=hardware, decisions=SimpleNamespace(cpus=cpus, launch=launch))


def test_spare_cpus_include_hyperthreads_and_leave_other_ranks_cores_alone(monkeypatch):
    monkeypatch.delenv(CORE_MAP_VARIABLE, raising=False)
    # 4 cores with 2 hyper-threads each (0-3 and 4-7): one process computing on the 4 cores keeps 4-7 for workers
    spare, why = worker_cpus(fake_context(tuple(range(8)), (0, 1, 2, 3), (0, 1, 2, 3)))
    assert spare == (4, 5, 6, 7) and "0-7 allowed minus the compute CPUs 0-3" in why
    # two local ranks, 2 cores each: neither rank's workers go on the other rank's compute cores
    launch = Launch("torchrun", 1, 2, 1, 2)
    spare, why = worker_cpus(fake_context(tuple(range(8)), (0, 1, 2, 3), (2, 3), launch))
    assert spare == (6, 7) and "local rank's share (1 of 2)" in why
    assert worker_cpus(fake_context((0, 1), (0, 1), None))[0] is None  # no threads in the plan: not pinned
    spare, why = worker_cpus(fake_context((0, 1), (0, 1), (0, 1)))
    assert spare is None and why.startswith("workers share the compute CPUs 0-1: no spare CPU")


class Augmented(Dataset):
    """Digits-sized images flipped at random, as torchvision's RandomHorizontalFlip does (torch's RNG)."""

    def __init__(self, random: bool):
        self.random = random
        self.images = torch.arange(8 * 3 * 4 * 4, dtype=torch.float32).reshape(8, 3, 4, 4)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        if self.random and torch.rand(()) < 0.5:
            image = image.flip(-1)
        return image, i % 2


def test_what_workers_do_to_random_augmentation_is_said_without_reading_a_sample():
    """A worker draws augmentation from a seed of its own: with workers where the loop had none, the same samples
    are augmented with other draws. The row says so where the number of workers changes, without reading a sample
    (a dataset that opens its file on first read would keep a handle opened here); every random state is as it was."""
    class Watched(Augmented):
        read: list[int] = []

        def __getitem__(self, i):
            self.read.append(i)
            return super().__getitem__(i)

    loader = DataLoader(Watched(True), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = tiny_model()
    state, generator = torch.get_rng_state(), loader.generator.get_state()
    run = accel.accelerate(model, None, loader, [{"loader": {"num_workers": 1}}], device="cpu")
    assert torch.equal(torch.get_rng_state(), state) and torch.equal(loader.generator.get_state(), generator)
    assert not Watched.read, Watched.read
    changes = run.report.row("loader").changes
    assert "where your dataset or collate_fn draws random numbers" in changes["random_draws"], changes
    assert "seed of its own" in changes["random_draws"] and "same samples in the same order" in changes["random_draws"]
    run.close()
