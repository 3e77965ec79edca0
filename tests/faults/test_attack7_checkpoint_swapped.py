"""attack7: a checkpoint file replaced between run.load's checks and its read. load_file checked the name (a regular
file, a zip archive) and then opened the name again for torch.load: a named pipe put in its place in between (a
shared folder's other writer) left run.load waiting on the pipe for ever, where a pipe in place from the start is a
CheckpointError at once (test_checkpoint_special_files.py)."""
import os
import sys
import threading
import zipfile

import pytest

import accel
from accel.errors import CheckpointError
from accel.testing import tiny_loader, tiny_model, tiny_optimizer


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_checkpoint_swapped_for_a_pipe_mid_load_is_read_as_opened_or_refused_at_once(tmp_path):
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), [], device="cpu")
    path = tmp_path / "ckpt.pt"
    run.save(path)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)

    def swap(frame, event, arg):  # the file becomes a pipe once the first check has looked at it
        if event == "call" and frame.f_code is zipfile.is_zipfile.__code__ and not path.is_fifo():
            os.replace(pipe, path)

    outcome = []

    def load():
        threading.setprofile(None)
        sys.setprofile(swap)
        try:
            run.load(path)
            outcome.append("loaded")
        except CheckpointError as error:
            outcome.append(error)
        except Exception as error:  # noqa: BLE001 (what it raised, to show)
            outcome.append(error)
        finally:
            sys.setprofile(None)

    loading = threading.Thread(target=load, daemon=True)
    loading.start()
    loading.join(timeout=20)  # a load of this tiny checkpoint takes milliseconds
    waited = loading.is_alive()
    if waited:  # waiting on the pipe: give it a writer, so that the thread ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        loading.join(timeout=20)
    run.close()
    assert not waited, "run.load waited on the pipe put in the checkpoint's place"
    assert outcome == ["loaded"] or isinstance(outcome[0], CheckpointError), outcome  # the file as opened, or refused
