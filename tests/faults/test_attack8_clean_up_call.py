"""attack8: a Ctrl-C that lands on the call of a clean-up (the instant accel starts putting things back after a
failure) must still leave everything put back. accel.run.interrupts.clean_up says it calls the clean-up again "if
a signal lands on the call"; a signal handled as the clean-up function is entered (CPython checks for signals on
entering a function) is raised before clean_up's own ``try``, so neither call runs.

The signal is real (os.kill to this process, handled by Python's own SIGINT handler); a profile hook chooses the
instant: the entry of the named clean-up function, once."""
import contextlib
import os
import signal
import sys

import pytest
import torch
from injectors import objects, process_state, profiled, warm_up

import accel
from accel.plan.contract import Accelerator, Stage, register, unregister
from accel.run import interrupts, open_run, thread_warnings


class FailsWhileApplied(Accelerator):
    """A user accelerator whose apply fails after the threads accelerator changed the process."""
    name = "attack8_fails_while_applied"
    stage = Stage.STEP

    def apply(self, ctx):
        raise RuntimeError("the user's accelerator failed")


@pytest.fixture
def failing():
    register(FailsWhileApplied)
    yield
    unregister(FailsWhileApplied.name)


def deferred_sets_a_handler(frame) -> bool:
    """Whether this frame is signal.signal called by deferred() (holding, or putting Python's handler back)."""
    return frame.f_code is signal.signal.__code__ and frame.f_back is not None and \
        frame.f_back.f_code is interrupts.deferred.__wrapped__.__code__


@contextlib.contextmanager
def ctrl_c_on_entering(code, caller):
    """One real SIGINT to this process as the function of ``code`` is entered from ``caller``'s (its first call)."""
    sent = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code and frame.f_back.f_code is caller and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    with profiled(profile):
        yield sent


CALLERS = {"accelerate's rollback": accel.api.accelerate, "captured's unhook": thread_warnings.captured.__wrapped__,
           "thread_filter's release": thread_warnings.thread_filter.__wrapped__}


@pytest.mark.parametrize("caller", CALLERS)
def test_a_ctrl_c_on_the_call_of_a_clean_up_still_puts_accelerate_back(failing, caller):
    warm_up()
    before = process_state()
    model, optimizer, loader = objects()
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(KeyboardInterrupt), ctrl_c_on_entering(interrupts.clean_up.__code__,
                                                                   CALLERS[caller].__code__) as sent:
        accel.accelerate(model, optimizer, loader, plan={"threads": {"threads": 1}, "channels_last": {},
                                                         FailsWhileApplied.name: {}}, device="cpu")
    assert sent, "the plan never reached its rollback"
    assert process_state() == before  # threads and its variables put back
    assert open_run(model) is None
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_a_second_ctrl_c_on_the_call_of_a_load_s_put_back_leaves_the_run_as_it_was(tmp_path):
    """The first Ctrl-C tears the load once it restored the weights; the second lands as the backup is put back."""
    from accel.run.state import RunState

    model, optimizer, loader = objects(seed=3)
    run = accel.accelerate(model, optimizer, loader, plan={"grad_clipping": {"max_norm": 1.0}}, device="cpu")
    run.save(tmp_path / "ckpt.pt")
    run.close()
    model, optimizer, loader = objects()
    run = accel.accelerate(model, optimizer, loader, plan={"grad_clipping": {"max_norm": 1.0}}, device="cpu")
    weights = [v.clone() for v in run.unwrap().state_dict().values()]
    targets = [RunState.restore_progress.__code__, interrupts.clean_up.__code__]  # the weights already loaded

    def hook(frame, event, arg):  # a hook that raised is unset: the first signal is sent by one, the second by another
        if event == "call" and targets and frame.f_code is targets[0]:
            targets.pop(0)
            os.kill(os.getpid(), signal.SIGINT)

    sys.setprofile(hook)
    sys.settrace(hook)
    try:
        with pytest.raises(KeyboardInterrupt):
            run.load(tmp_path / "ckpt.pt")
    finally:
        sys.setprofile(None)
        sys.settrace(None)
    assert not targets, "the load never reached its put-back"
    assert all(torch.equal(a, b) for a, b in zip(run.unwrap().state_dict().values(), weights))
    assert run.steps == 0 and torch.is_grad_enabled()
    run.close()


def test_a_ctrl_c_as_a_held_section_ends_leaves_no_phantom_ctrl_c_for_the_next():
    """Two Ctrl-Cs on one run.close(): the first while its changes are undone (held), the second just as the
    section puts Python's handler back. One KeyboardInterrupt is right; the first must not stay noted, to be
    delivered at the end of the next held section (the next accelerate(), with no key pressed)."""
    warm_up()
    model, optimizer, loader = objects()
    run = accel.accelerate(model, optimizer, loader, plan={"threads": {"threads": 1}}, device="cpu")
    sent = []

    def profile(frame, event, arg):
        if event == "c_call" and arg is torch.set_num_threads and not sent:  # the threads layer taken off: held
            sent.append("held")
            os.kill(os.getpid(), signal.SIGINT)
        elif event == "c_return" and deferred_sets_a_handler(frame) and sent == ["held"]:  # Python's handler is back
            sent.append("as the section ends")
            os.kill(os.getpid(), signal.SIGINT)

    with profiled(profile), pytest.raises(KeyboardInterrupt):
        run.close()
    assert sent == ["held", "as the section ends"]
    try:  # no key pressed from here on
        run.close()
        accel.accelerate(*objects(1), plan={"threads": {"threads": 1}}, device="cpu").close()
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C handled already was delivered again at the end of a later held section")


def test_a_sigterm_as_a_held_section_begins_leaves_ctrl_c_working():
    """A script's own SIGTERM handler that raises (SystemExit, caught to save and go on), run as a held section
    begins, between holding SIGINT and holding SIGTERM: the section never started, and must not keep SIGINT held
    (every later Ctrl-C noted and never delivered)."""
    warm_up()
    run = accel.accelerate(*objects(), plan={"threads": {"threads": 1}}, device="cpu")
    sent = []

    def terminated(signum, frame):
        raise SystemExit("terminated")

    def profile(frame, event, arg):
        if event == "c_return" and not sent and deferred_sets_a_handler(frame) and \
                signal.getsignal(signal.SIGINT) is not user_int:  # SIGINT held, SIGTERM not yet
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    user_int, user_term = signal.getsignal(signal.SIGINT), signal.signal(signal.SIGTERM, terminated)
    try:
        with profiled(profile), pytest.raises(SystemExit):
            run.close()
    finally:
        signal.signal(signal.SIGTERM, user_term)
    assert sent
    assert signal.getsignal(signal.SIGINT) is user_int
    run.close()
