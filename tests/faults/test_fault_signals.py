"""Signals at every phase: a real SIGINT (Ctrl-C) at a point of run.save, run.load, accelerate() and run.close()
that hypothesis chooses among all of them, and SIGKILL / SIGTERM to a real process in the middle of a save.

What must hold, wherever the signal lands: a load is all or nothing (never tensors from the checkpoint and counters
from before); a save leaves the previous checkpoint or the new one, whole, and no temporary file once the next save
ran; accelerate() is all or nothing (the process as before, the earlier run on the model open again); a close()
interrupted finishes with the next close()."""
import os
import signal

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from injectors import count_calls, objects, process_state, signal_at, train, warm_up

import accel
from accel.files import PREFIX
from accel.randomness import first_batch, kept
from accel.run import open_run
from accel.testing import tiny_loader

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PLAN = {"threads": {}, "channels_last": {}, "grad_clipping": {"max_norm": 1.0}}  # the process, hooks, state


def fingerprint(run) -> tuple:
    """What a load restores: the weights, the optimizer's state, the counters, the random state; and autograd on
    (torch's own no_grad blocks inside a load, torn by a Ctrl-C, left it off)."""
    state = run.optimizer.state_dict()["state"]
    return ([v.clone() for v in run.unwrap().state_dict().values()],
            [v.clone() for _, s in sorted(state.items()) for _, v in sorted(s.items()) if isinstance(v, torch.Tensor)],
            run.steps, run.optimizer_steps, torch.get_rng_state(), torch.is_grad_enabled())


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def new_run(seed=0):
    model, optimizer, loader = objects(seed)
    return accel.accelerate(model, optimizer, loader, plan=PLAN, device="cpu")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint after 3 steps, what a run holds once it loaded it, and how many points a load has: in all,
    and while it restores (Run.restore_or_put_back, both formats' restore: a small share of them, where a mix is
    made; run.load once restored through Run.load_state_dict, and no longer does, so counting within that left the
    restoring half of the test below without a point to interrupt)."""
    path = tmp_path_factory.mktemp("signals") / "ckpt.pt"
    run = new_run(seed=3)
    train(run, 3)
    run.save(path)
    run.close()
    run = new_run()
    train(run, 1)  # as the runs below: the optimizer's state is part of what a load copies
    points = {None: count_calls(lambda: run.load(path))}
    restoring = type(run).restore_or_put_back
    points[restoring] = count_calls(lambda: run.load(path), within=restoring)
    assert points[restoring] > 0, "run.load no longer restores through Run.restore_or_put_back: count where it does"
    loaded = fingerprint(run)
    run.close()
    return path, loaded, points


@SETTINGS
@given(at=st.floats(0, 1), restoring=st.booleans())
def test_a_load_interrupted_anywhere_is_all_or_nothing(checkpoint, at, restoring):
    """Ctrl-C in the middle of restoring left 7 of 16 parameter tensors from the checkpoint, and the optimizer's
    state and run.steps from before."""
    path, loaded, points = checkpoint
    within = [k for k in points if k is not None][0] if restoring else None
    point = 1 + int(at * (points[within] - 1))
    run = new_run()
    try:
        train(run, 1)
        before = fingerprint(run)
        try:
            with signal_at(point, within=within):
                run.load(path)
        except KeyboardInterrupt:
            pass
        after = fingerprint(run)
        assert same(after, before) or same(after, loaded), f"a mix, interrupted at call {point} of {points[within]}"
    finally:
        run.close()


@pytest.fixture
def saving(tmp_path):
    """A run with a checkpoint of step 0, one step further, and how many points its next save has."""
    run = new_run()
    run.save(tmp_path / "ckpt.pt")
    train(run, 1)
    points = count_calls(lambda: run.save(tmp_path / "count.pt"))
    (tmp_path / "count.pt").unlink()
    yield run, tmp_path / "ckpt.pt", points
    run.close()


def whole_and_cleaned(run, path):
    """The old checkpoint or the new one, whole; and no temporary file once the next save ran."""
    assert run.load(path)["step"] in (0, 1)
    run.save(path)
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(PREFIX)] == []


@SETTINGS
@given(at=st.floats(0, 1))
def test_a_save_interrupted_anywhere_leaves_the_old_checkpoint_or_the_new_one(saving, at):
    run, path, points = saving
    try:
        with signal_at(1 + int(at * (points - 1))):
            run.save(path)
    except KeyboardInterrupt:
        pass
    whole_and_cleaned(run, path)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.floats(0, 1))
def test_a_process_killed_in_the_middle_of_a_save_loses_nothing(saving, signum, at):
    """A real process (forked from this one), killed by a real signal at a point of its save; the next save of the
    same file removes the temporary file it left."""
    run, path, points = saving
    child = os.fork()
    if child == 0:  # the child: save, and die at that point (SIGTERM: no handler, the OS ends it)
        try:
            with signal_at(1 + int(at * (points - 1)), signum):
                run.save(path)
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0
    whole_and_cleaned(run, path)


@SETTINGS
@given(at=st.floats(0, 1))
def test_accelerate_interrupted_anywhere_is_all_or_nothing(at):
    """The earlier run on the model stays open with its changes (the search switches plans this way); once every
    run is closed the process is as it was. A Ctrl-C after the plan was applied lost the new run, and with it the
    only record of its changes (the variables threads exports stayed set)."""
    warm_up()
    before = process_state()
    model, optimizer, loader = objects()
    earlier = accel.accelerate(model, optimizer, loader, plan={"grad_clipping": {"max_norm": 1.0}}, device="cpu")
    runs = []
    points = count_calls(lambda: runs.append(accel.accelerate(model, optimizer, loader, plan=PLAN, device="cpu")),
                         within=accel.accelerate)
    runs[0].close()
    earlier = accel.accelerate(model, optimizer, loader, plan={"grad_clipping": {"max_norm": 1.0}}, device="cpu")
    point = 1 + int(at * (points - 1))
    try:
        with signal_at(point, within=accel.accelerate):
            run = accel.accelerate(model, optimizer, loader, plan=PLAN, device="cpu")
    except KeyboardInterrupt:
        assert open_run(model) is earlier and not earlier.closed
        earlier.close()
    else:
        run.close()
    assert process_state() == before


@SETTINGS
@given(at=st.floats(0, 1))
def test_a_close_interrupted_anywhere_finishes_with_the_next_close(at):
    warm_up()
    before = process_state()
    points = count_calls(lambda: new_run().close())
    run = new_run()
    point = 1 + int(at * (points - 1))
    try:
        with signal_at(point):
            run.close()
    except KeyboardInterrupt:
        run.close()
    assert process_state() == before


def test_a_first_batch_taken_for_you_leaves_every_random_state_wherever_a_ctrl_c_lands():
    """accel.randomness.kept puts the random states back (prune's dummy batch, the search's first batch): a Ctrl-C
    on the call of its restore skipped it, one inside it left the states half put back. Every 4th point of kept's
    own code (taking the states, putting them back), in turn: one inside the batch is caught by its finally."""
    loader = tiny_loader(samples=32, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
    before = (torch.get_rng_state(), loader.generator.get_state())
    points = count_calls(lambda: first_batch(loader), within=kept.__wrapped__)
    for point in range(1, points + 1, 4):
        try:
            with signal_at(point, within=kept.__wrapped__):
                first_batch(loader)
        except KeyboardInterrupt:
            pass
        assert torch.equal(torch.get_rng_state(), before[0]), f"torch's random state, at call {point} of {points}"
        assert torch.equal(loader.generator.get_state(), before[1]), f"the loader's, at call {point} of {points}"
