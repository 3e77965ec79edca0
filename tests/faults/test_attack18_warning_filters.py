"""A filter accel put in place for one block (accelerate()'s capture of each accelerator's warnings) must match
nothing once that block ended, even where your own thread's ``warnings.catch_warnings()`` puts back a list that
still held it: catch_warnings restores the list it saw on entry, so a block that ended inside it comes back."""
import threading
import warnings

import pytest
from injectors import objects

import accel
from accel.plan.contract import Accelerator, Stage


class YourWarning(UserWarning):
    pass


class EntersYourBlock(Accelerator):
    """While it applies (inside accelerate()'s capture), your own thread enters warnings.catch_warnings()."""

    name, stage = "enters_your_block", Stage.KERNELS
    applying, entered = None, None

    def apply(self, ctx):
        self.applying.set()
        self.entered.wait(timeout=60)
        return {}


def test_a_capture_that_ended_inside_your_threads_catch_warnings_stays_ended():
    applying, entered, leave = threading.Event(), threading.Event(), threading.Event()

    def your_thread():  # a thread of yours (a logger, an evaluation) with its own catch_warnings block
        applying.wait(timeout=60)
        with warnings.catch_warnings():
            entered.set()
            leave.wait(timeout=60)

    with warnings.catch_warnings():
        warnings.simplefilter("error", YourWarning)  # your choice: this warning is an error
        thread = threading.Thread(target=your_thread)
        thread.start()
        kind = type("Enters", (EntersYourBlock,), {"applying": applying, "entered": entered})
        try:
            run = accel.accelerate(*objects(), plan=[kind()], device="cpu")
        finally:
            leave.set()  # your block ends after accelerate() returned: it puts back the list it saw
            thread.join(60)
        run.close()
        with pytest.raises(YourWarning):  # accel's capture ('always', this thread) ended long ago
            warnings.warn("yours", YourWarning)
