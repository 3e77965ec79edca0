"""plan="auto"'s run.loader zipped with another shuffling loader (CycleGAN, FixMatch, domain adaptation) reads the
plain loop's batches, as the fixed plan's does (tests/test_attack7_loaders.py): iter(run.loader) draws the epoch's
seeds at iter(), as iter(DataLoader) does, also while auto measures and when the rebuilt loader it chose joins."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from virtual_clock import VirtualClock

import accel
import accel.clock
from accel.search import inloop
from accel.workloads import tiny_model

CLOCK = VirtualClock()
EPOCHS = 5  # the search settles in the fourth, the rebuilt loader joins at the fourth


class SlowImages(TensorDataset):
    """16 digits-sized images whose items take 4 ms each on the test's clock: the loop waits for data."""

    def __init__(self):
        super().__init__(torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(0)),
                         torch.arange(16) % 10)

    def __getitem__(self, index):
        CLOCK.advance(0.004)
        return super().__getitem__(index)


def loaders(workers):
    labelled = DataLoader(SlowImages(), batch_size=4, shuffle=True, num_workers=workers)
    unlabelled = DataLoader(TensorDataset(torch.arange(16.)), batch_size=4, shuffle=True)
    return labelled, unlabelled


def epoch(labelled, unlabelled, run_second, run=None):
    """One epoch of the two loaders side by side (zip() takes the labelled second if ``run_second``), stepping the
    run (if any) on each labelled batch."""
    seen = []
    for (x, y), (u,) in (((a, b) for b, a in zip(unlabelled, labelled)) if run_second else zip(labelled, unlabelled)):
        seen.append((y.tolist(), u.tolist()))
        if run is not None:
            run.backward(nn.functional.cross_entropy(run.model(x), y))
            run.step()
    return seen


@pytest.mark.parametrize("workers, run_second, candidates", [
    pytest.param(0, True, [{"loader": {"num_workers": 1}}], id="run-second-rebuilt-loader-joins",
                 marks=pytest.mark.slow),  # (worker processes at each epoch once it joined)
    pytest.param(1, False, [{"channels_last": {}}], id="own-workers-run-first")])
def test_auto_run_loader_zipped_with_another_loader_reads_the_plain_loops_batches(monkeypatch, workers, run_second,
                                                                                   candidates):
    """SearchLoader.__iter__ was a generator: it drew the epoch's seed (and joined a rebuilt loader) only at the first
    batch, after zip() had called iter() on the other loader, so both loaders read other batches than the plain loop."""
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    torch.manual_seed(0)
    labelled, unlabelled = loaders(workers)
    plain = [epoch(labelled, unlabelled, run_second) for _ in range(EPOCHS)]
    with accel.clock.use(CLOCK):
        model = tiny_model()
        CLOCK.per_forward(model, 0.01)
        torch.manual_seed(0)
        labelled, unlabelled = loaders(workers)
        run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.05), labelled,
                               accel.Auto(cache=False, budget_s=10, candidates=[candidates]), device="cpu")
        try:
            seen = [epoch(run.loader, unlabelled, run_second, run) for _ in range(EPOCHS)]
            phase, in_place = run.phase, run.plan.names()
        finally:
            run.close()
    assert phase == "settled"
    if not workers:
        assert "loader" in in_place  # the rebuilt loader joined at an epoch's start, and its batches are the plain's
    assert seen == plain
