"""attack5: the loader's random-draws probe in a forked child, and the epochs run.loader tracks (commit 0d07ed3).

Each case runs in a real subprocess with a timeout (a probe or a worker that never answers fails its own test)."""
import os
import subprocess
import sys
import textwrap

import pytest
from test_attack4_loaders import SETUP as ATTACK4_SETUP  # the model, optimizer and step(run, x, y)

SETUP = ATTACK4_SETUP + """
import signal
from torch.utils.data import Dataset
class Augmented(Dataset):  # draws random numbers per sample (noise augmentation), as torchvision's transforms do
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.full((4,), float(i)) + 0.01 * torch.randn(4), torch.ones(1)
"""


def run_script(body: str, timeout: float = 40, env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-c", SETUP + textwrap.dedent(body)], capture_output=True, text=True,
                              timeout=timeout, env=env or {**os.environ, "PYTHONWARNINGS": "default"})
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the script hung past {timeout} s; it printed: {hung.stdout!r} {hung.stderr!r}")


def test_loader_plan_works_in_a_process_that_ignores_sigchld():
    """A process that reaps its children automatically (SIGCHLD set to SIG_IGN: servers, job runners do) runs the
    plain loop fine (and torch's workers: their iterator chains its own SIGCHLD handler); accelerate() with the loader
    accelerator fails with ChildProcessError: the random-draws probe's os.waitpid finds its forked child already
    reaped by the kernel. A SIGCHLD handler that reaps (`while os.waitpid(-1, WNOHANG)`) races the same way."""
    done = run_script("""
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        loader = DataLoader(Augmented(), batch_size=4)
        for x, y in loader:  # the plain loop
            pass
        run = accel.accelerate(model, optimizer, loader, plan=[{"loader": {"num_workers": 2}}])
        for x, y in run.loader:
            step(run, x, y)
        run.close()
        print("TRAINED")
    """)
    assert done.returncode == 0 and "TRAINED" in done.stdout, done.stderr[-3000:]


def test_text_printed_before_accelerate_is_not_written_twice():
    """stdout to a file or a pipe (a cluster job's log) is block-buffered: text the loop printed before accelerate()
    still sits in Python's buffer when the probe forks, the child inherits it, and a dataset that prints (flush=True,
    'opening shard ...') flushes the parent's text from the child too: it is in the log twice. torch's own workers
    (multiprocessing) flush the standard streams before they fork; the plain loop writes it once."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = run_script("""
        class Logged(Augmented):
            def __getitem__(self, i):
                print("opening shard", flush=True)
                return super().__getitem__(i)
        print("EPOCH-0-BEGINS")
        run = accel.accelerate(model, optimizer, DataLoader(Logged(), batch_size=4),
                               plan=[{"loader": {"num_workers": 2}}])
        run.close()
    """, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("EPOCH-0-BEGINS") == 1, done.stdout


def test_close_in_the_last_step_of_an_epoch_does_not_raise():
    """A loop that closes the run in its last step (`if i == len(run.loader) - 1: run.close()`, training done) and
    lets the for loop end: with the user's own loader it ends; with a loader the run rebuilt, the for loop's final
    next() raises 'the run was closed during this epoch' though no batch is lost: the epoch had none left."""
    done = run_script("""
        run = accel.accelerate(model, optimizer, DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)),
                               batch_size=4), plan=[{"loader": {"num_workers": 2}}])
        assert run.loader.loader.num_workers == 2
        steps = 0
        for i, (x, y) in enumerate(run.loader):
            step(run, x, y)
            steps += 1
            if i == len(run.loader) - 1:
                run.close()
        print("STEPS", steps)
    """)
    assert done.returncode == 0 and "STEPS 4" in done.stdout, done.stderr[-3000:]


AUTO_LOADER_ONLY = """
class Slow(Dataset):  # the loop waits for data most of its step: the rebuilt loader is chosen by the data wait
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.full((4,), float(i)), torch.ones(1)
run = accel.accelerate(model, optimizer, DataLoader(Slow(), batch_size=4),
                       plan=accel.Auto(candidates=[[{"loader": {"num_workers": 2}}]], cache=False))
for epoch in range(3):
    for x, y in run.loader:
        step(run, x, y)
print("WORKERS", run.loader.num_workers)
print("AUTO", str(run.report).split("auto: ", 1)[1].splitlines()[0])
print(run.report)
run.close()
"""


def test_auto_says_so_when_the_loader_it_chose_cannot_join():
    """plan=Auto with only a rebuilt loader to decide: the data wait chooses it, and it is to join at the next epoch
    (search/words.py SearchLoader.join -> switch). When that accelerate() fails (found with a process ignoring SIGCHLD,
    where a probe of the loader failed; here a loader accelerator of the user's that fails in apply), switch() gave
    None and the loop trained on with the plan in place while the report said 'auto: chose ...', nothing said."""
    done = run_script(textwrap.dedent("""
        from accel import Accelerator, Stage
        from accel.plan.contract import Capability
        class Sharded(Accelerator):
            name, stage, requires, provides = "attack5_sharded", Stage.DATA, ("loader",), (Capability.DATA_LOADER,)
            def apply(self, ctx):
                raise OSError("the shard index moved")
        accel.register(Sharded)
    """) + AUTO_LOADER_ONLY.replace('{"loader": {"num_workers": 2}}', '{"attack5_sharded": {}}'), timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "could not join" in done.stderr and "the shard index moved" in done.stderr, done.stderr[-3000:]
    assert "could not join" in done.stdout, done.stdout[-3000:]  # its row in the table


def test_auto_report_does_not_say_the_plain_loop_is_kept_when_it_chose_the_loader():
    """The same search where the rebuilt loader joins (2 workers from the second epoch on): the report's auto line
    reads 'auto: chose loader: no plan was faster ... the plain loop is kept (the empty plan)', the why of the
    stepwise comparison (there was none), contradicting what was chosen and applied."""
    done = run_script(AUTO_LOADER_ONLY, timeout=60)
    assert done.returncode == 0 and "WORKERS 2" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    auto = next(line for line in done.stdout.splitlines() if line.startswith("AUTO"))
    assert "plain loop is kept" not in auto, auto


def test_a_loop_that_holds_the_earlier_runs_loader_is_told():
    """`train_loader = run.loader` once, then accelerate() again after the first epoch (another plan, each epoch:
    docs/contract.md, every plan): the loop goes on over the earlier, closed run's loader for every later epoch, with
    that run's rebuilt workers (restarted each epoch now that the hand-over stops them when an epoch ends), and the new
    run's loader is never read. The hand-over lets the loop finish the epoch it is in; a whole new epoch on the closed
    run's loader goes around the new run, and nothing says so."""
    done = run_script("""
        import warnings
        data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
        plan = [{"loader": {"num_workers": 2}}]
        run = accel.accelerate(model, optimizer, data, plan=plan)
        train_loader = run.loader
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            for epoch in range(3):
                for x, y in train_loader:
                    step(run, x, y)
                if epoch == 0:
                    run = accel.accelerate(model, optimizer, data, plan=plan)
                    said.clear()
        print("NEW RUN'S LOADER READ", run.loader.epoch > 1)
        print("SAID", [str(w.message)[:120] for w in said if "loader" in str(w.message)])
        run.close()
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NEW RUN'S LOADER READ True" in done.stdout or "SAID []" not in done.stdout, done.stdout[-3000:]


def test_accelerate_reads_no_sample_of_the_dataset(tmp_path):
    """The loader accelerator's random-draws probe read a sample in a forked child (attack4: not in the main process),
    and SIGTERM while a slow first sample was read left that child an orphan under init, reading on. The row now says
    what workers do to random draws without reading a sample: accelerate() reads none, in any process."""
    read = tmp_path / "read.pid"
    done = run_script(f"""
        class Watched(Augmented):
            def __getitem__(self, i):
                open({str(read)!r}, "a").write(str(os.getpid()) + "\\n")
                return super().__getitem__(i)
        run = accel.accelerate(model, optimizer, DataLoader(Watched(), batch_size=4),
                               plan=[{{"loader": {{"num_workers": 2}}}}])
        print("READ", os.path.exists({str(read)!r}))
        run.close()
    """)
    assert done.returncode == 0 and "READ False" in done.stdout, done.stdout + done.stderr[-3000:]


def test_a_dataset_that_draws_from_its_own_generator_is_said_to_draw():
    """A dataset that augments from a generator of its own (`self.rng = np.random.default_rng(seed)`, the reproducible
    way numpy's docs advise) draws random numbers per sample as much as one on the global state: with workers, each
    worker draws from its own copy of that generator, all starting at the same state (workers 0 and 1 augment alike),
    where the plain loop draws one sequence. The probe compares only the process's global random states, so the
    loader's row says nothing of random draws when it moves the dataset to 2 workers."""
    done = run_script("""
        import numpy as np
        class OwnRng(Dataset):
            def __init__(self):
                self.rng = np.random.default_rng(0)
            def __len__(self):
                return 16
            def __getitem__(self, i):
                noise = torch.from_numpy(self.rng.normal(size=4).astype("float32"))
                return torch.full((4,), float(i)) + 0.01 * noise, torch.ones(1)
        run = accel.accelerate(model, optimizer, DataLoader(OwnRng(), batch_size=4),
                               plan=[{"loader": {"num_workers": 2}}])
        print("ROW", run.report.row("loader").status, "random_draws" in str(run.report))
        run.close()
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROW applied True" in done.stdout, done.stdout[-3000:]


def test_a_probe_that_times_out_is_said_not_taken_for_no_random_draws():
    """A dataset whose first sample takes longer than the probe waits: the probe kills its child and answers 'draws no
    random numbers', so an augmenting dataset moved to workers gets no random_draws note, and the stall itself is not
    said either: unknown reads as a clean no."""
    done = run_script("""
        class SlowAugmented(Augmented):
            def __getitem__(self, i):
                if i == 0:
                    time.sleep(3)
                return super().__getitem__(i)
        run = accel.accelerate(model, optimizer, DataLoader(SlowAugmented(), batch_size=4),
                               plan=[{"loader": {"num_workers": 2}}])
        row = run.report.row("loader")
        print("ROW", row.status, "random_draws" in str(run.report) or "probe" in str(run.report).lower())
        run.close()
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROW applied True" in done.stdout, done.stdout[-3000:]
