"""plan="auto"'s run.load switches to the checkpoint's plan, then loads; a load that fails there (here the
checkpoint holds the state of an accelerator its plan does not apply, which only the switched run can tell) switches
back to the plan that was in place. A Ctrl-C landing on that switch back's call (CPython handles a pending signal on
entering a function) left the checkpoint's plan in place with nothing loaded. A real signal, timed by a profile hook
(as tests/faults/test_attack8_clean_up_call.py)."""
import os
import signal

import pytest
import torch
from injectors import objects, profiled

import accel
from accel.run import state as state_module
from accel.run.checkpoint import checksum
from accel.search.inloop import InLoopSearch


def test_a_second_ctrl_c_on_the_switch_back_still_puts_autos_plan_back(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "cache"))
    model, optimizer, loader = objects()
    saved = accel.accelerate(model, optimizer, loader, plan={"grad_clipping": {"max_norm": 1.0}}, device="cpu")
    saved.save(tmp_path / "run.pt")
    saved.close()
    state = torch.load(tmp_path / "run.pt", weights_only=True)
    state["accelerators"]["amp"] = {}  # not in its plan: refused by the switched run's load
    state["checksum"] = checksum(state)
    torch.save(state, tmp_path / "run.pt")
    run = accel.accelerate(model, optimizer, loader, plan=accel.Auto(cache=False), device="cpu")
    before = run.current.plan.to_dict()
    steps = []  # the switched run's load begins (and refuses the file), then a Ctrl-C on the call switching back

    def profile(frame, event, arg):
        if event != "call":
            return
        if not steps and frame.f_code is state_module.load_saved.__code__:
            steps.append("loading")
        elif steps == ["loading"] and frame.f_back.f_code is InLoopSearch.load.__code__:
            steps.append("ctrl-c")
            os.kill(os.getpid(), signal.SIGINT)

    with profiled(profile), pytest.raises(KeyboardInterrupt):
        run.load(tmp_path / "run.pt")
    assert steps == ["loading", "ctrl-c"]
    assert run.current.plan.to_dict() == before and not run.current.closed, run.current.plan
    run.close()
