"""A DataLoader worker forked after an earlier test left garbage does not run that garbage's finalizers.

A closed run is cyclic garbage until this process collects it; a ddp run held gloo's process group (through
DistributedDataParallel's reducer) until close let go of it, and gloo's worker threads wait on a condition variable.
A forked worker inherits that garbage but not those threads; when its own collector frees the group, gloo's
destructor wakes and joins threads that do not exist in it: the worker hangs, aborts or segfaults ("DataLoader
worker (pid N) is killed by signal"), in whatever later test forks first. run.close() ends the group accel
started, and tests/conftest.py freezes the collector's objects across each fork (for any other garbage that a child
should not finalize).
"""
import gc
import subprocess
import sys

import torch
from scripts.closed_run_then_workers import Collecting
from scripts.launching import SCRIPTS, clean_env, one_rank_env
from torch.utils.data import DataLoader
from zoo import MODELS, Net

import accel
from accel.testing import tiny_loader, tiny_optimizer


def test_a_worker_forked_after_a_closed_ddp_run_became_garbage_loads_its_batches(one_rank):
    gc.disable()  # what the suite's long-lived process meets: the closed run not collected yet when a worker forks
    try:
        model = Net(**MODELS["blocks"])
        run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=["ddp"], device="cpu")
        for x, y in run.loader:
            run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
            run.step()
        run.close()
        del run
        loader = DataLoader(Collecting(), num_workers=1, timeout=60)  # a hung worker fails the test, not the suite
        assert [int(batch) for batch in loader] == [0, 1]
        assert gc.get_freeze_count() == 0  # thawed in this process after each fork: its garbage is collected here
    finally:
        gc.enable()


def test_a_users_script_loads_with_workers_after_closed_ddp_and_fsdp_runs_without_the_suites_freeze():
    """The user's script has no gc.freeze() around its forks: close itself must leave nothing of the group."""
    result = subprocess.run([sys.executable, str(SCRIPTS / "closed_run_then_workers.py"), "ddp", "fsdp"],
                            env={**clean_env(), **one_rank_env()}, capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() if not line.startswith("[Gloo]")]  # torch 2.8's own lines
    assert said == ["ddp [0, 1]", "fsdp [0, 1]"], result.stderr[-3000:]
