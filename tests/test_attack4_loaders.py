"""attack4: a loader the run rebuilt with worker processes, across accelerate() again, run.close() and Ctrl-C.

Each loop runs in a real subprocess with a timeout, so a worker that never answers fails its own test quickly."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SETUP = """
import multiprocessing, os, sys, time, torch, accel
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
def step(run, x, y):
    run.backward(torch.nn.functional.mse_loss(run.model(x), y))
    run.step()
"""


def run_script(body: str, timeout: float = 40) -> str:
    """The script's output; a hang (a worker that never answers) fails here, with what it printed so far."""
    try:
        done = subprocess.run([sys.executable, "-c", SETUP + textwrap.dedent(body)], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "default"})
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the loop hung past {timeout} s; it printed: {hung.stdout!r} {hung.stderr!r}")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_accelerate_again_mid_epoch_keeps_the_epoch_the_loop_is_iterating():
    """A loop that calls accelerate() again mid-epoch (another plan after a validation, say) and goes on with the
    epoch it is in: with a rebuilt loader of persistent workers, the hand-over stops those workers under the live
    iterator, and the epoch ended after the batches already fetched: 4 of 16, with nothing said. Without the rebuild
    (the user's own loader, same settings) the epoch is whole: 16, and so it is now with it."""
    out = run_script("""
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4, num_workers=1,
                            persistent_workers=True)
        plan = [{"loader": {"num_workers": 2}}]
        run = accel.accelerate(model, optimizer, loader, plan=plan)
        assert run.loader.loader is not loader  # rebuilt: 2 persistent workers
        drawn = 0
        for x, y in run.loader:
            step(run, x, y)
            drawn += 1
            if drawn == 3:
                run = accel.accelerate(model, optimizer, loader, plan=plan)
        print("DRAWN", drawn)
    """)
    drawn = [line for line in out.splitlines() if line.startswith("DRAWN")]
    assert drawn == ["DRAWN 16"], out[-3000:]


def test_close_stops_the_workers_of_a_rebuilt_loader_the_loop_still_iterates():
    """run.close() 'stops the workers of a loader the run rebuilt' (its docstring): not when the loop still holds
    an iterator of run.loader (an early stop that keeps the iterator, `batches = iter(run.loader)` as the harness's
    own loops do): the workers of a non-persistent rebuilt loader live on after close, and the closed run's loader
    goes on serving batches through them."""
    out = run_script("""
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
        run = accel.accelerate(model, optimizer, loader, plan=[{"loader": {"num_workers": 2}}])
        batches = iter(run.loader)
        step(run, *next(batches))
        assert len(multiprocessing.active_children()) == 2
        run.close()
        time.sleep(0.5)
        print("ALIVE", len(multiprocessing.active_children()))
    """)
    assert "ALIVE 0" in out, out[-3000:]


LOOP = """
loader = DataLoader(TensorDataset(torch.randn(4000, 4), torch.randn(4000, 1)), batch_size=4, **LOADER)
run = accel.accelerate(model, optimizer, loader, plan=PLAN)
for epoch in range(100):
    for i, (x, y) in enumerate(run.loader):
        step(run, x, y)
        if epoch == 0 and i == 0:
            print("READY", flush=True)
        time.sleep(0.002)
"""


def test_ctrl_c_mid_epoch_ends_the_process_and_its_workers():
    """Ctrl-C (SIGINT to the whole foreground group) in a loop over rebuilt persistent workers with threads pinned:
    the process ends with KeyboardInterrupt and no worker outlives it. (Holds today.)"""
    loader, plan = {"num_workers": 1, "persistent_workers": True}, ["threads", {"loader": {"num_workers": 2}}]
    code = SETUP + f"LOADER = {loader!r}\nPLAN = {plan!r}\n" + LOOP
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        began = time.monotonic()
        for line in child.stdout:
            if line.startswith("READY") or time.monotonic() - began > 30:
                break
        workers = subprocess.run(["pgrep", "-P", str(child.pid)], capture_output=True, text=True).stdout.split()
        assert workers, "no worker started"
        os.killpg(child.pid, signal.SIGINT)
        out = child.communicate(timeout=20)[0]
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not end on Ctrl-C")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert "KeyboardInterrupt" in out, out[-2000:]
    time.sleep(0.5)
    alive = [pid for pid in workers if os.path.exists(f"/proc/{pid}")
             and open(f"/proc/{pid}/stat").read().split()[2] != "Z"]
    for pid in alive:  # our own leftovers, by their id
        os.kill(int(pid), signal.SIGKILL)
    assert not alive, f"workers outlived Ctrl-C: {alive}"


def test_the_random_draws_probe_does_not_open_the_users_dataset_in_the_main_process(tmp_path):
    """A dataset that opens its file lazily in __getitem__ (the usual way to give every worker a handle of its own:
    a file offset, an HDF5/LMDB/SQLite handle must not cross a fork) is read once in the main process by the loader
    accelerator's probe for random draws, so the handle is opened there, the user's dataset holds it after
    accelerate(), and every forked worker reads through that one shared handle (one file offset for all)."""
    records = tmp_path / "records.bin"
    records.write_bytes(bytes(range(64)) * 4)
    out = run_script(f"""
        class Records(torch.utils.data.Dataset):
            def __init__(self):
                self.file, self.opened_in = None, None
            def __len__(self):
                return 64
            def __getitem__(self, i):
                if self.file is None:  # opened in the process that reads: each worker its own
                    self.file, self.opened_in = open({str(records)!r}, "rb"), os.getpid()
                self.file.seek(4 * i)
                data = torch.tensor(list(self.file.read(4)), dtype=torch.float32)
                return data, torch.tensor([float(self.opened_in != os.getpid())])
        dataset = Records()
        loader = DataLoader(dataset, batch_size=4)
        run = accel.accelerate(model, optimizer, loader, plan=[{{"loader": {{"num_workers": 2}}}}])
        print("OPENED_BY_ACCELERATE", dataset.file is not None)
        shared = sum(float(flag.sum()) for _, flag in run.loader)
        print("READ_THROUGH_A_FOREIGN_HANDLE", int(shared))
        run.close()
    """)
    assert "OPENED_BY_ACCELERATE False" in out and "READ_THROUGH_A_FOREIGN_HANDLE 0" in out, out[-3000:]


@pytest.mark.slow
def test_accelerate_mid_epoch_leaves_the_epoch_the_loop_iterates_over_persistent_workers():
    """A loop mid-epoch over persistent workers (the user's own loader) calls accelerate() with prune: prune's
    first_batch calls iter() on the loader, and a DataLoader with persistent workers resets its one iterator, the
    one the loop holds: the epoch starts again under the loop and its first batch is eaten. The loop saw samples
    0, 4, 8, then 4, 8, 12, ... again (the 'kept' loader iterator is the same object, now reset)."""
    out = run_script("""
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
                                    torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        samples = torch.arange(64.).view(64, 1, 1, 1).expand(64, 1, 8, 8).contiguous()
        loader = DataLoader(TensorDataset(samples, torch.randn(64, 1)), batch_size=4, num_workers=1,
                            persistent_workers=True)
        for x, y in loader:  # an epoch before (a warm-up, an evaluation): the loader keeps its iterator
            break
        run = accel.accelerate(model, optimizer, loader, plan=[])
        batches, seen = iter(run.loader), []
        for _ in range(3):
            x, y = next(batches)
            seen.append(int(x[0, 0, 0, 0]))
            step(run, x, y)
        try:
            run = accel.accelerate(model, optimizer, loader, plan=[{"prune": {"config_list": [
                {"op_types": ["Conv2d"], "sparse_ratio": 0.5, "exclude_op_names": ["2"]}]}}])
            print("PRUNE", run.report.row("prune").status)
        except accel.AccelerateError as error:  # "your objects and the process are as they were"
            print("PRUNE failed", str(error)[:200])
        seen += [int(x[0, 0, 0, 0]) for x, y in batches]
        print("SEEN", seen)
    """, timeout=60)
    seen = [line for line in out.splitlines() if line.startswith("SEEN")]
    assert seen == [f"SEEN {list(range(0, 64, 4))}"], out[-3000:]


def test_the_search_report_does_not_say_the_loop_never_iterated_run_loader_when_it_did():
    """plan=Auto with a loader candidate only (judged by the loop's wait for data): it settles at step 0, before the
    loop's first batch, and the report read after eight whole epochs over run.loader still says 'your loop never
    iterated run.loader: its data wait is unknown'."""
    out = run_script("""
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
        run = accel.accelerate(model, optimizer, loader,
                               plan=accel.Auto(candidates=[[{"loader": {"num_workers": 2}}]], cache=False))
        drawn = 0
        for epoch in range(8):
            for x, y in run.loader:
                step(run, x, y)
                drawn += 1
        print("DRAWN", drawn)
        print(run.report)
        run.close()
    """)
    assert "DRAWN 128" in out and "never iterated run.loader" not in out, out[-3000:]
