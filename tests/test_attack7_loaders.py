"""attack7: run.loader and the loop's own sampler epochs, workers, streams (accel/run/device_loader.py)."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import accel


def sharded(seed=0):
    data = TensorDataset(torch.arange(16.).unsqueeze(1))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=seed)
    return sampler, DataLoader(data, batch_size=4, sampler=sampler)


def orders(loader, sampler, epochs):
    """The loop of pytorch/examples' imagenet and most launched scripts: the sampler told each epoch's number."""
    seen = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        seen.append([batch[0].flatten().tolist() for batch in loader])
    return seen


def test_a_loop_that_numbers_its_epochs_from_one_keeps_its_shuffle():
    """``for epoch in range(1, epochs + 1): train_sampler.set_epoch(epoch)`` (or from a resumed start_epoch): run.loader
    called set_epoch again with its own count from 0, overriding the loop's, so with plan=[] every epoch read other
    batches than the plain loop, without a word. A loop that tells its sampler the epoch keeps its own numbering."""
    sampler, loader = sharded()
    plain = orders(loader, sampler, range(1, 4))
    sampler, loader = sharded()
    model = nn.Linear(1, 1)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, plan=[])
    try:
        assert orders(run.loader, sampler, range(1, 4)) == plain
    finally:
        run.close()


def test_a_loop_that_never_tells_the_sampler_still_gets_a_new_order_each_epoch():
    """The run's counter still drives a sampler the loop leaves alone (tests/test_run.py pins it)."""
    sampler, loader = sharded()
    model = nn.Linear(1, 1)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, plan=[])
    try:
        first, second = ([batch[0].flatten().tolist() for batch in run.loader] for _ in range(2))
    finally:
        run.close()
    reference = [orders(loader, sampler, [epoch])[0] for epoch in (0, 1)]
    assert [first, second] == reference


def shuffled(n, workers=0):
    return DataLoader(TensorDataset(torch.arange(float(n)).unsqueeze(1)), batch_size=4, shuffle=True,
                      num_workers=workers)


def paired(first, second):
    """The loop of CycleGAN, FixMatch and domain adaptation: two loaders read side by side."""
    return [(a[0].flatten().tolist(), b[0].flatten().tolist()) for a, b in zip(first, second)]


@pytest.mark.parametrize("workers, run_first", [(0, False), (2, True)], ids=["run-second", "workers-run-first"])
def test_run_loader_zipped_with_another_loader_reads_the_plain_loops_batches(workers, run_first):
    """iter(DataLoader) draws the epoch's seeds from torch's random state at once; iter(run.loader) drew them only at
    its first batch, after zip() had called iter() on the other loader (or drawn its first batch), so under plan=[]
    (exact) both loaders read other batches than the plain loop's, silently."""
    def side_by_side(labelled, unlabelled):
        return paired(labelled, unlabelled) if run_first else paired(unlabelled, labelled)

    model = nn.Linear(1, 1)
    torch.manual_seed(0)
    labelled, unlabelled = shuffled(16, workers), shuffled(16)
    plain = [side_by_side(labelled, unlabelled) for _ in range(2)]
    torch.manual_seed(0)
    labelled, unlabelled = shuffled(16, workers), shuffled(16)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), labelled, plan=[])
    try:
        assert [side_by_side(run.loader, unlabelled) for _ in range(2)] == plain
    finally:
        run.close()


@pytest.mark.parametrize("workers, plan_workers", [(0, 1), (1, 0)], ids=["workers-added", "workers-removed"])
def test_the_loader_plan_zipped_with_another_loader_reads_the_plain_loops_batches(workers, plan_workers):
    """Workers prefetch at iter(): their sampler draws its order from torch's random state there, where a 0-worker
    iterator draws it at the first batch. Before: a loader rebuilt with another number of workers, zipped with
    another loader drawing from the same state in between, read other batches than the plain loop (card: exact)."""
    assert_zipped_as_plain(lambda: (shuffled(16, workers), shuffled(16)), plan_workers)


def own_generators():
    data = TensorDataset(torch.arange(16.).unsqueeze(1))
    return tuple(DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed))
                 for seed in (1, 2))


def test_the_loader_plan_zipped_with_another_loader_each_of_its_own_generator_reads_the_plain_loops_batches():
    """Both loaders given their own generator= keep both orders too (the rebuilt loader draws its seed and its order
    from the user's generator when the user's own loader would)."""
    assert_zipped_as_plain(own_generators)


def assert_zipped_as_plain(loaders, workers=1):
    """zip(run.loader, other) under a loader plan of this many workers reads what zip(loader, other) reads."""
    torch.manual_seed(0)
    labelled, unlabelled = loaders()
    plain = [paired(labelled, unlabelled) for _ in range(2)]
    model = nn.Linear(1, 1)  # before the seed: its initialization draws from torch's random state
    torch.manual_seed(0)
    labelled, unlabelled = loaders()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), labelled,
                           plan={"loader": {"num_workers": workers}})
    try:
        assert [paired(run.loader, unlabelled) for _ in range(2)] == plain
    finally:
        run.close()


def test_a_loop_that_tells_its_sampler_before_accelerate_each_epoch_keeps_its_shuffle():
    """A new run's loader took the sampler's epoch as it found it (the loop's 1) for the one it had set itself, and
    overrode it with the run's count."""
    sampler, loader = sharded()
    plain = orders(loader, sampler, range(1, 4))
    sampler, loader = sharded()
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for epoch in range(1, 4):
        sampler.set_epoch(epoch)
        run = accel.accelerate(model, optimizer, loader, plan=[])  # accelerate() again each epoch (docs/contract.md)
        seen.append([batch[0].flatten().tolist() for batch in run.loader])
    run.close()
    assert seen == plain
