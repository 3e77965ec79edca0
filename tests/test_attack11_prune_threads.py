"""attack11: NNI's prints during ModelSpeedup go to accel's log, and only NNI's: the user's other threads (a
heartbeat, a progress printer) still print on stdout meanwhile. contextlib.redirect_stdout swaps sys.stdout for the
whole process, so a line another thread printed during the surgery went to accel's debug log instead."""
from __future__ import annotations

import sys
import threading

import pytest
import torch

import accel
from accel.testing import tiny_loader, tiny_model

pytest.importorskip("nni")


@pytest.mark.slow
def test_another_threads_print_during_the_surgery_reaches_stdout(capsys):
    model = tiny_model()
    outside, asked, printed = sys.stdout, threading.Event(), threading.Event()

    def meanwhile(module, args):  # runs in accel's thread while NNI works: the other thread prints then
        if sys.stdout is not outside and not asked.is_set():
            asked.set()
            printed.wait(30)

    def heartbeat():
        if asked.wait(60):
            print("heartbeat", flush=True)
        printed.set()

    handle = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d)).register_forward_pre_hook(meanwhile)
    thread = threading.Thread(target=heartbeat)
    thread.start()
    try:
        run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), plan=["prune"],
                               device="cpu")
        run.close()
    finally:
        asked.set()
        thread.join()
        handle.remove()
    assert printed.is_set()
    assert "heartbeat" in capsys.readouterr().out
