"""A checkpoint folder (what run.save writes under fsdp, and what run.load takes for any folder) whose ``latest`` is
not a small regular file: a named pipe, a sparse terabyte. accel/run/sharded_checkpoint.py's folder() reads
``latest`` whole (read_text, then [:300]) before it checks anything: the pipe blocks run.load for ever, the terabyte
is one allocation (MemoryError), where the contract promises a CheckpointError naming the file, nothing changed. The
same class as the plan cache's entries (tests/faults/test_cache_special_files.py)."""
import os
import threading

import pytest
import torch

import accel
from accel.errors import CheckpointError
from accel.testing import tiny_setup


def opened_run():
    setup = tiny_setup()
    return accel.accelerate(setup.model, setup.optimizer, setup.loader, plan=[], device="cpu"), setup.model


@pytest.mark.xfail(strict=True, reason="sharded_checkpoint.folder reads a named pipe called latest and blocks for ever")
def test_a_named_pipe_as_latest_is_a_checkpoint_error_at_once(tmp_path):
    os.mkfifo(tmp_path / "latest")
    run, model = opened_run()
    outcome: list = []

    def load():
        try:
            run.load(tmp_path)
        except CheckpointError as error:
            outcome.append(error)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(timeout=2)
    if loader.is_alive():  # set it free: the pipe's other end opened and closed (end of file)
        os.close(os.open(tmp_path / "latest", os.O_WRONLY | os.O_NONBLOCK))
        loader.join(timeout=5)
        run.close()
        pytest.fail("run.load waited on a named pipe")
    run.close()
    assert outcome and "latest" in str(outcome[0])


@pytest.mark.xfail(strict=True, raises=MemoryError, reason="sharded_checkpoint.folder reads latest whole before "
                   "taking its first 300 characters: a sparse terabyte is one allocation")
def test_a_terabyte_latest_is_a_checkpoint_error_and_the_run_as_it_was(tmp_path):
    with open(tmp_path / "latest", "wb") as huge:
        huge.truncate(1 << 40)  # sparse: no room taken
    run, model = opened_run()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with pytest.raises(CheckpointError, match="latest"):
            run.load(tmp_path)
    finally:
        run.close()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
