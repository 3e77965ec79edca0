"""attack6: checkpoints run.save writes and run.load then refuses, and a StaleWarning on a loop that reads the new
run's loader (commits 0d07ed3..bf49019: unreadable(), the sampler and param group checks, the handed-over loader)."""
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

import accel
from accel.errors import StaleWarning


def setup(optimizer=lambda params: torch.optim.SGD(params, lr=0.1), sampler=None):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
    return model, optimizer(model.parameters()), DataLoader(data, batch_size=4, sampler=sampler)


def epoch(run, scheduler=None):
    for x, y in run.loader:
        nn.functional.mse_loss(run.model(x), y).backward()
        run.step()
    if scheduler is not None:
        scheduler.step()


def test_a_numpy_cosine_schedule_checkpoint_loads(tmp_path):
    """A LambdaLR whose lambda uses numpy (0.5 * (1 + np.cos(...)), as many cosine schedules are written) sets each
    param group's lr to a numpy float64: run.save writes it (unreadable() checks only the plan and accelerators'
    states), and run.load refuses the file as 'not an accel checkpoint': torch.load(weights_only=True) cannot read
    the numpy scalar in the optimizer's state. Either save refuses it up front (as for a plan option) or load reads
    it; writing a checkpoint the same run cannot load is neither."""
    model, optimizer, loader = setup()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 0.5 * (1 + np.cos(np.pi * e / 10)))
    run = accel.accelerate(model, optimizer, loader, plan=[])
    epoch(run, scheduler)
    path = tmp_path / "run.pt"
    try:
        run.save(path)
    except accel.errors.CheckpointError as refused:  # refused up front, naming the optimizer: acceptable
        assert "optimizer" in str(refused) and not path.exists()
        return
    finally:
        run.close()
    model, optimizer, loader = setup()
    again = accel.accelerate(model, optimizer, loader, plan=[])
    again.load(path)  # fails today: CheckpointError 'not an accel checkpoint (... UnpicklingError)'
    assert math.isclose(float(optimizer.param_groups[0]["lr"]), 0.1 * 0.5 * (1 + math.cos(math.pi / 10)))
    again.close()


class OptionalSeedSampler(Sampler):
    """A user's sampler whose seed is optional (None: a fresh shuffle each run), as many codebases write them."""

    def __init__(self, n, seed=None):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.epoch if self.seed is None else self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self):
        return self.n


def test_a_sampler_with_seed_none_checkpoint_loads(tmp_path):
    """The sampler check (ints in [-2**63, 2**64)) runs at run.load only: run.save writes {"seed": None} for a user's
    sampler whose seed is None, and run.load refuses the file run.save just wrote ('its sampler is not what run.save
    writes'), so the user's checkpoints are all unusable. A None seed is restored as None (sampler.seed = None)."""
    model, optimizer, loader = setup(sampler=OptionalSeedSampler(16))
    run = accel.accelerate(model, optimizer, loader, plan=[])
    epoch(run)
    path = tmp_path / "run.pt"
    run.save(path)
    run.close()
    model, optimizer, loader = setup(sampler=OptionalSeedSampler(16))
    again = accel.accelerate(model, optimizer, loader, plan=[])
    again.load(path)  # fails today: CheckpointError 'not a checkpoint run.save wrote (its sampler ...)'
    assert again.steps == 4 and loader.sampler.seed is None
    again.close()


def test_lbfgs_checkpoint_with_a_line_search_loads_into_a_plain_lbfgs(tmp_path):
    """torch's LBFGS keeps line_search_fn as None or 'strong_wolfe' in its param group, and its load_state_dict takes
    the saved group's (either works): _same_kind refuses text where this optimizer has None ('param group settings
    of another kind'), a false refusal of a checkpoint torch itself loads and trains on."""
    model, optimizer, loader = setup(lambda p: torch.optim.LBFGS(p, lr=0.5, line_search_fn="strong_wolfe"))
    run = accel.accelerate(model, optimizer, loader, plan=[])
    path = tmp_path / "run.pt"
    run.save(path)
    run.close()
    model, optimizer, loader = setup(lambda p: torch.optim.LBFGS(p, lr=0.5))
    again = accel.accelerate(model, optimizer, loader, plan=[])
    again.load(path)  # fails today: CheckpointError "group 0's line_search_fn='strong_wolfe' (this optimizer's: None)"
    assert optimizer.param_groups[0]["line_search_fn"] == "strong_wolfe"
    again.close()


def test_accelerate_again_on_the_earlier_runs_loader_warns_no_stale_loader():
    """A loop that keeps `train_loader = run.loader` and passes it to accelerate() again reads the new run's
    run.loader, correctly; the new run's DeviceLoader wraps the earlier run's one (handed_over), whose start_epoch
    then warns StaleWarning on every epoch of the new run: a false alarm (the new run's batches are read)."""
    model, optimizer, loader = setup()
    run = accel.accelerate(model, optimizer, loader, plan=[])
    train_loader = run.loader
    epoch(run)
    again = accel.accelerate(model, optimizer, train_loader, plan=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleWarning)
        epoch(again)  # fails today: StaleWarning 'a new epoch on the loader of a run that accelerate() again took over'
    assert again.steps == 8
    again.close()


def test_close_in_the_last_step_of_a_stream_lets_the_epoch_end():
    """attack5's fix lets a for loop end when run.close() comes in an epoch's last step, for a map-style dataset
    only: for an IterableDataset (a streamed corpus, no __len__) the loader accelerator rebuilt (its workers kept),
    _yielded_all cannot take len() and says False, so the next next() raises 'the run was closed during this epoch'
    though every batch was read. The plain loop, and the same loop on a map-style dataset, end quietly."""
    import os
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent("""
        import torch, accel
        from torch import nn
        from torch.utils.data import DataLoader, IterableDataset
        class Stream(IterableDataset):  # each worker streams its own shard
            def __iter__(self):
                info = torch.utils.data.get_worker_info()
                wid, n = (info.id, info.num_workers) if info else (0, 1)
                for i in range(wid, 16, n):
                    yield torch.full((4,), float(i)), torch.ones(2)
        torch.manual_seed(0)
        model = nn.Linear(4, 2); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        run = accel.accelerate(model, optimizer, DataLoader(Stream(), batch_size=4, num_workers=2),
                               plan=[{"loader": {"prefetch_factor": 4}}])
        seen = 0
        for x, y in run.loader:  # 4 batches: each of the 2 workers batches its 8 samples
            nn.functional.mse_loss(run.model(x), y).backward(); run.step(); seen += 1
            if seen == 4:  # the last step: the loop is done with the run
                run.close()
        print("ENDED", seen)
    """)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=40,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"hung past 40 s: {hung.stdout!r} {hung.stderr!r}")
    assert done.returncode == 0 and "ENDED 4" in done.stdout, done.stderr[-2000:]


def test_a_float_option_the_plan_accepted_is_saved():
    """grad_clipping's max_norm accepts any float, a numpy float64 too (np.float64 subclasses float: a value from a
    numpy computation or a sweep). accelerate() applies it, the run trains, and only the first run.save, hours later,
    refuses it (unreadable(): 'numpy.float64'). The plan is validated before anything is touched (a PlanError then),
    or the checkpoint holds the plain float: either, not a refusal at the first save."""
    import tempfile
    model, optimizer, loader = setup()
    plan = [{"grad_clipping": {"max_norm": np.float64(1.0)}}]
    try:
        run = accel.accelerate(model, optimizer, loader, plan=plan)
    except accel.errors.PlanError:
        return  # refused up front, before training: acceptable
    epoch(run)
    with tempfile.TemporaryDirectory() as folder:
        try:
            run.save(f"{folder}/run.pt")  # fails today: CheckpointError "grad_clipping's options (numpy...)"
        finally:
            run.close()
        model, optimizer, loader = setup()
        again = accel.accelerate(model, optimizer, loader, plan=[{"grad_clipping": {"max_norm": 1.0}}])
        again.load(f"{folder}/run.pt")
        again.close()
