"""A real Ctrl-C where CPython handles it, at the entry of a Python function (its first instruction checks for
signals), inside accelerate() and accel.tune(): the process, the user's objects and torch's switches must be as
before. torch's ``no_grad`` blocks end in a Python ``__exit__``: a Ctrl-C landing on its call skips it and leaves
autograd off for the whole thread (run.load guards against exactly this: accel.run.interrupts.autograd_kept).

Found: prune's check deep-copies the model (``Tensor.__deepcopy__`` runs under ``no_grad``) and tune measures copies;
a Ctrl-C on the call of one of those ``__exit__`` leaves ``torch.is_grad_enabled()`` False after accelerate() or
tune() raised KeyboardInterrupt: every later forward of the user's builds no graph, and ``loss.backward()`` fails
with "element 0 of tensors does not require grad" (or, in a loop that catches it, trains nothing)."""
import contextlib
import os
import signal
import sys
import warnings

import pytest
import torch
import torch.autograd.grad_mode as grad_mode
from injectors import objects, process_state, warm_up

import accel
from accel.run import open_run
from accel.testing import snapshot, tiny_loader
from accel.workloads import NormCNN

CO_GENERATORS = 0x20 | 0x80 | 0x200  # a generator's, coroutine's or async generator's frame: re-entered to finalize
NO_GRAD_EXIT = grad_mode.no_grad.__exit__.__code__


class Points(list):
    """The points passed; ``at``: the function the Ctrl-C was sent on entering; ``dropped``: what CPython reported as
    unraisable meanwhile (an exception raised in a finalizer or a weakref callback, which the garbage collector may
    run inside any call: CPython drops it, a limitation of its own, as for generators)."""

    at = ""
    dropped: list


@contextlib.contextmanager
def ctrl_c_on_entry(point: int | None = None, code=None, within=None):
    """A real SIGINT to this process on entering the point-th Python function called in the block (of ``code`` only,
    if given; inside ``within`` only, if given): CPython handles it at that function's first instruction, as it
    handles a Ctrl-C typed then. Generators' frames are left out (CPython drops an exception raised while one is
    finalized: a limitation of its own). Yields the points passed (``Points``)."""
    passed, inside, depth = Points(), getattr(within, "__code__", None), [0]
    passed.dropped, unraisable = [], sys.unraisablehook

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        if inside is not None and frame.f_code is inside:
            depth[0] += 1 if event == "call" else -1
        if event == "call" and (inside is None or depth[0] > 0) and not frame.f_code.co_flags & CO_GENERATORS \
                and (code is None or frame.f_code is code):
            passed.append(1)
            if len(passed) == point:
                passed.at = f"{frame.f_code.co_qualname} ({frame.f_code.co_filename}:{frame.f_lineno})"
                os.kill(os.getpid(), signal.SIGINT)

    sys.unraisablehook = lambda report: passed.dropped.append(report.exc_type)
    sys.setprofile(profile)
    try:
        yield passed
    finally:
        sys.setprofile(None)
        sys.unraisablehook = unraisable


@contextlib.contextmanager
def autograd_restored():
    """Autograd back on after the block, whatever it left (the suite goes on)."""
    try:
        yield
    finally:
        torch.set_grad_enabled(True)


def norm_objects():
    torch.manual_seed(0)
    model = NormCNN()
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), tiny_loader(samples=32, batch_size=16)


def torch_switches() -> tuple:
    """torch's process-wide (per-thread) switches a step depends on."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
            torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(),
            torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.backends.cudnn.benchmark)


def handlers() -> tuple:
    return tuple(signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD))


def optimizer_hooks(optimizer) -> dict:
    return {name: len(value) for name, value in vars(optimizer).items()
            if name.startswith("_optimizer_") and isinstance(value, dict)}


def test_a_ctrl_c_while_prune_copies_your_model_leaves_autograd_on():
    model, optimizer, loader = norm_objects()
    before = snapshot(model, optimizer, loader)
    with autograd_restored():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(KeyboardInterrupt), ctrl_c_on_entry(1, NO_GRAD_EXIT, within=accel.accelerate) as passed:
                accel.accelerate(model, optimizer, loader, plan=["prune"], device="cpu")
        assert passed, "prune's check no longer copies under no_grad: find another no_grad inside accelerate()"
        assert before.changes(snapshot(model, optimizer, loader)) == [] and open_run(model) is None
        assert torch.is_grad_enabled(), "accelerate() was interrupted and left autograd off for the whole process"


def test_a_ctrl_c_while_decide_checks_prune_leaves_autograd_on():
    """accel.decide() runs the same checks as accelerate() (prune's copies the model under no_grad)."""
    model, optimizer, loader = norm_objects()
    with autograd_restored():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(KeyboardInterrupt), ctrl_c_on_entry(1, NO_GRAD_EXIT, within=accel.decide) as passed:
                accel.decide(model, optimizer, loader, plan=["prune"], device="cpu")
        assert passed
        assert torch.is_grad_enabled(), "accel.decide() was interrupted and left autograd off for the whole process"


def test_a_ctrl_c_while_tune_measures_leaves_autograd_on():
    model, optimizer, loader = norm_objects()
    with autograd_restored():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(KeyboardInterrupt), ctrl_c_on_entry(1, NO_GRAD_EXIT, within=accel.tune) as passed:
                accel.tune(model, optimizer, loader, device="cpu", cache=False, budget_s=5)
        assert passed
        assert torch.is_grad_enabled(), "accel.tune() was interrupted and left autograd off for the whole process"


def test_a_ctrl_c_on_entering_any_function_of_accelerate_reaches_you_and_leaves_everything_as_it_was():
    """Every third Python call of accelerate() with amp and fused_optimizer (torch's flags, the optimizer's own hooks
    and flags): the Ctrl-C reaches the caller, and the user's objects, the optimizer's hooks, torch's switches, the
    signal handlers and the process are as before."""
    warm_up()
    plan = {"amp": {}, "fused_optimizer": {}, "channels_last": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accel.accelerate(*objects(), plan=plan, device="cpu").close()
        with ctrl_c_on_entry(within=accel.accelerate) as passed:
            accel.accelerate(*objects(), plan=plan, device="cpu").close()
    points = len(passed)
    state, switches, signals = process_state(), torch_switches(), handlers()
    for point in range(1, points + 1, 3):
        model, optimizer, loader = objects()
        before, hooks = snapshot(model, optimizer, loader), optimizer_hooks(optimizer)
        with autograd_restored(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with ctrl_c_on_entry(point, within=accel.accelerate) as passed:
                    run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
            except KeyboardInterrupt:
                pass
            else:
                run.close()
                dropped = KeyboardInterrupt in passed.dropped  # sent inside a finalizer the collector ran
                assert len(passed) < point or dropped, \
                    f"the Ctrl-C at call {point} of {points}, {passed.at}, never reached the caller"
                continue
            where = f"a Ctrl-C at call {point} of {points}"
            assert before.changes(snapshot(model, optimizer, loader)) == [], where
            assert optimizer_hooks(optimizer) == hooks and open_run(model) is None, where
            assert (torch_switches(), handlers()) == (switches, signals), where
        assert process_state() == state, where
