"""Attack 12: a batch sampler that draws its order when iterated (a bucketing sampler: ``__iter__`` shuffles with
torch.randperm and returns an iterator of its batches) draws it at iter(DataLoader), before the loader's seed, and a
worker iterator iterates it twice (torch's _reset iterates the sampler again) and reads the second order. The loader
plan's rebuilt loader drew the seed and orders in neither loader's sequence (timed_as_plain), so it read other batches
than the plain loop under its exact card: with workers added, and with them removed."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel


class Buckets(torch.utils.data.Sampler):
    """Batches of 4 in an order drawn from torch's random state when iterated, as bucketing samplers do."""

    def __init__(self, samples: int):
        self.samples = samples

    def __iter__(self):
        order = torch.randperm(self.samples).tolist()
        return iter([order[i:i + 4] for i in range(0, self.samples, 4)])

    def __len__(self):
        return self.samples // 4


def loader(workers: int = 0) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(16.)), batch_sampler=Buckets(16), num_workers=workers)


def epochs(batches) -> list[list[float]]:
    return [[b.tolist() for (b,) in batches] for _ in range(2)]


@pytest.mark.parametrize("workers, plan_workers", [(0, 1), (1, 0)], ids=["workers-added", "workers-removed"])
def test_a_sampler_that_draws_its_order_at_iter_keeps_it_under_a_loader_plan(workers, plan_workers):
    torch.manual_seed(0)
    plain = epochs(loader(workers))
    model = nn.Linear(1, 1)
    torch.manual_seed(0)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(workers),
                           plan={"loader": {"num_workers": plan_workers}})
    try:
        assert run.report.row("loader").status == "applied"
        assert epochs(run.loader) == plain
    finally:
        run.close()
