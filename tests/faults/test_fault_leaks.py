"""Long runs: the run's bookkeeping stays bounded however many steps it trains, and accelerate()/close() cycles leave
nothing behind (memory, threads, files, filters, settings). benchmarks/bench_step_memory.py measures the first over
100,000 steps."""
import gc
import os
import threading
import tracemalloc
import warnings

import torch
from injectors import objects, process_state, warm_up

import accel
from accel.run.report import StepTimes
from accel.run.shared_settings import _SETTINGS


def test_step_statistics_stay_bounded_and_keep_the_first_step_apart(monkeypatch):
    """report.step_times was a list growing by one float a step, for ever."""
    monkeypatch.setattr(StepTimes, "KEPT", 16)
    model = torch.nn.Linear(4, 2)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None, plan=[], device="cpu")
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    for _ in range(200):
        run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
        run.step()
    times = run.report.step_times
    assert len(times) == times.count == 200 and len(times.latest) == 16 and times.first > 0
    timing = run.report.timing()
    assert timing["steps"] == 200 and timing["first_step_s"] == round(times.first, 4)
    assert "steps: 200, first step" in str(run.report)
    run.close()


def test_the_steady_median_leaves_out_the_first_step_until_it_falls_out_of_the_window():
    times = StepTimes()
    times.append(5.0)
    assert times.steady() == [5.0]
    for _ in range(3):
        times.append(1.0)
    assert times.steady() == [1.0, 1.0, 1.0]


def open_files() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


def layers() -> dict:
    return {key: len(setting.layers) for key, setting in _SETTINGS.items()}


def test_accelerate_and_close_cycles_leave_nothing_behind():
    """The audit ran 500 cycles; 150 here, with every kind of change the journal makes (process, hooks, flags)."""
    warm_up()
    plan = ["threads", "channels_last", "fused_optimizer", {"grad_clipping": {"max_norm": 1.0}}]
    model, optimizer, loader = objects()

    def cycle():
        run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
        next(iter(run.loader))
        run.close()

    for _ in range(20):
        cycle()
    gc.collect()
    before, threads, files, filters = process_state(), threading.active_count(), open_files(), list(warnings.filters)
    layered = layers()  # an earlier test's run never closed keeps its layers: this test counts what cycles leave
    tracemalloc.start()
    start, _ = tracemalloc.get_traced_memory()
    for _ in range(150):
        cycle()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    assert grown < 256 * 1024, f"{grown} bytes more after 150 cycles"
    assert process_state() == before and warnings.filters == filters and layers() == layered
    assert threading.active_count() == threads and open_files() == files
