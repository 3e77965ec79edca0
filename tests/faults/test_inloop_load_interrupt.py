"""plan="auto"'s run.load switches to the checkpoint's plan, then loads; a load that fails (here the file damaged
as it is read) switches back to the plan that was in place. A Ctrl-C landing on that switch back's call (CPython
handles a pending signal on entering a function) left the checkpoint's plan in place with nothing loaded. A real
file damaged and a real signal, each timed by a profile hook (as tests/faults/test_attack8_clean_up_call.py)."""
import os
import signal

import pytest
from injectors import objects, profiled

import accel
from accel.run import state
from accel.search.inloop import InLoopSearch


def test_a_second_ctrl_c_on_the_switch_back_still_puts_autos_plan_back(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "cache"))
    model, optimizer, loader = objects()
    saved = accel.accelerate(model, optimizer, loader, plan={"grad_clipping": {"max_norm": 1.0}}, device="cpu")
    saved.save(tmp_path / "run.pt")
    saved.close()
    run = accel.accelerate(model, optimizer, loader, plan=accel.Auto(cache=False), device="cpu")
    before = run.current.plan.to_dict()
    steps = []  # the checkpoint damaged as the run's load reads it, then a Ctrl-C on the call switching back

    def profile(frame, event, arg):
        if event != "call":
            return
        if not steps and frame.f_code is state.load_checkpoint.__code__:
            steps.append("damaged")
            (tmp_path / "run.pt").write_bytes(b"damaged")  # a raise here would end the profile
        elif steps == ["damaged"] and frame.f_back.f_code is InLoopSearch.load.__code__:
            steps.append("ctrl-c")
            os.kill(os.getpid(), signal.SIGINT)

    with profiled(profile), pytest.raises(KeyboardInterrupt):
        run.load(tmp_path / "run.pt")
    assert steps == ["damaged", "ctrl-c"]
    assert run.current.plan.to_dict() == before and not run.current.closed, run.current.plan
    run.close()
