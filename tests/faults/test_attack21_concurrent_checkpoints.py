"""A checkpoint written by one real process while another loads it (an evaluation process following a training
one, a resumed job started before the old one ended), and the file descriptors run out: a load is whole or a
CheckpointError, the previous checkpoint stays loadable, and a refused save, load or accelerate() changes nothing."""
import os
import resource
import subprocess
import sys
import warnings

import pytest
from injectors import objects, process_state, train, warm_up

import accel
from accel.errors import AccelerateError, CheckpointError

PLAN = {"grad_clipping": {"max_norm": 1.0}}
WRITER = """
import sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, sys.argv[3])
from injectors import objects, train
import accel
run = accel.accelerate(*objects(), plan={"grad_clipping": {"max_norm": 1.0}}, device="cpu")
print("ready", flush=True)
for _ in range(int(sys.argv[2])):
    train(run, 1)
    run.save(sys.argv[1])
run.close()
"""


@pytest.mark.slow
def test_a_checkpoint_saved_again_and_again_by_another_process_loads_whole_each_time(tmp_path):
    path = tmp_path / "ckpt.pt"
    run = accel.accelerate(*objects(), plan=PLAN, device="cpu")
    train(run, 1)
    run.save(path)  # step 1: there is always a whole file to read
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "15", os.path.dirname(__file__)], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        steps = []
        while writer.poll() is None:
            steps.append(run.load(path)["step"])
        assert writer.wait() == 0
        steps.append(run.load(path)["step"])
        assert steps[-1] == 15 and len(set(steps)) > 2 and all(1 <= s <= 15 for s in steps), steps
        assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary left by the writer
    finally:
        writer.kill()
        run.close()


def test_no_file_descriptor_left_refuses_save_load_and_accelerate_and_changes_nothing(tmp_path):
    warm_up()
    state = process_state()
    run = accel.accelerate(*objects(), plan=PLAN, device="cpu")
    try:
        train(run, 1)
        run.save(tmp_path / "ckpt.pt")
        train(run, 1)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        held = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 4096), hard))
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        try:
            with pytest.raises(CheckpointError, match="could not be written"):
                run.save(tmp_path / "ckpt.pt")
            with pytest.raises(CheckpointError, match="cannot be opened"):
                run.load(tmp_path / "ckpt.pt")
            model, optimizer, loader = objects()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    accel.accelerate(model, optimizer, loader, plan=["threads"], device="cpu").close()
                except AccelerateError:
                    pass
        finally:
            for handle in held:
                os.close(handle)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert run.steps == 2 and run.load(tmp_path / "ckpt.pt")["step"] == 1 and run.steps == 1
        assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    finally:
        run.close()
    assert process_state() == state
