"""fix2: a loader rebuilt with another number of workers pulls its sampler at other times than the user's own loader
(torch's worker iterator takes index batches ahead of the loop), and a sampler draws random numbers as it is pulled
(RandomSampler its next permutation once its epoch runs out, with replacement every 32 samples; a sampler of the
user's from torch's global state). An epoch the loop left early (SWA's update_bn reading run.loader after an epoch
left at its last batch) left the generator elsewhere than the plain loader does: the next epoch read another order,
and the random state between batches was not the plain loop's. Now the rebuilt loader's extra pulls are put back
after each batch and made again before the next; a generator drawn from in between is said."""
from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler, TensorDataset

import accel
from accel.errors import LoopWarning
from accel.run.device_loader import DeviceLoader, rebuild_loader, release_workers

SAMPLES = 22  # batches of 4: five, then one of 2


class FromGlobalState(Sampler):
    """A sampler of the user's that draws each index from torch's global random state as it is pulled."""

    def __iter__(self):
        for _ in range(SAMPLES):
            yield int(torch.randint(SAMPLES, ()))

    def __len__(self):
        return SAMPLES


def loader(kind: str, workers: int, persistent: bool = False, samples: int = SAMPLES
           ) -> tuple[DataLoader, torch.Generator]:
    """The user's loader of this kind, and the generator its sampler draws from."""
    data, own = TensorDataset(torch.arange(float(samples))), torch.Generator().manual_seed(0)
    options = {"num_workers": workers, "persistent_workers": persistent}
    if kind == "shuffle, generator=":
        return DataLoader(data, batch_size=4, shuffle=True, generator=own, **options), own
    if kind == "shuffle":
        return DataLoader(data, batch_size=4, shuffle=True, **options), torch.default_generator
    if kind == "a sampler's own generator":
        return DataLoader(data, batch_size=4, sampler=RandomSampler(data, generator=own), **options), own
    if kind == "batch_sampler":
        sampler = BatchSampler(RandomSampler(data, generator=own), 4, drop_last=False)
        return DataLoader(data, batch_sampler=sampler, **options), own
    if kind == "with replacement":
        sampler = RandomSampler(data, replacement=True, num_samples=40, generator=own)
        return DataLoader(data, batch_size=4, sampler=sampler, **options), own
    return DataLoader(data, batch_size=4, sampler=FromGlobalState(), **options), torch.default_generator


KINDS = ["shuffle, generator=", "shuffle", "a sampler's own generator", "batch_sampler", "with replacement",
         "from the global state"]
WORKERS = [(0, 1, False), (1, 0, False), (1, 2, False), (1, 2, True)]  # (the user's, the rebuilt loader's, persistent)


def state(generator: torch.Generator) -> bytes:
    return bytes(generator.get_state().numpy())


def left_then_read(batches, source: torch.Generator, left_at: int, held: bool) -> tuple:
    """An epoch left after ``left_at`` batches (its iterator held, or dropped), then a whole epoch: the batches and
    the random state after each."""
    epoch = iter(batches)
    first = [(b.tolist(), state(source)) for (b,) in itertools.islice(epoch, left_at)]
    if not held:
        del epoch
    after = state(source)
    second = [(b.tolist(), state(source)) for (b,) in batches]
    return first, after, second, state(source)


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), workers=st.sampled_from(WORKERS), left_at=st.integers(0, 10), held=st.booleans())
def test_an_epoch_left_anywhere_leaves_the_random_state_where_the_plain_loader_leaves_it(kind, workers, left_at,
                                                                                         held):
    mine, rebuilt, persistent = workers
    torch.manual_seed(0)
    plain, source = loader(kind, mine, persistent)
    try:
        expected = left_then_read(plain, source, left_at, held)
    finally:
        release_workers(plain)
    torch.manual_seed(0)
    user, source = loader(kind, mine, persistent)
    run_loader = DeviceLoader(rebuild_loader(user, num_workers=rebuilt, persistent_workers=persistent),
                              torch.device("cpu"), False, [], rebuilt=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", LoopWarning)  # nothing drew from the generator in between: nothing said
            assert left_then_read(run_loader, source, left_at, held) == expected
    finally:
        run_loader.stop_workers()


def test_a_generator_drawn_from_while_the_workers_are_ahead_is_said():
    """The loop draws from the loader's generator once the workers have pulled the sampler past the epoch's end
    (its next permutation drawn early): the plain loader would draw that permutation later, on the state the loop
    left, which no rebuilt loader can replay."""
    user, source = loader("shuffle, generator=", 0)
    run_loader = DeviceLoader(rebuild_loader(user, num_workers=1), torch.device("cpu"), False, [], rebuilt=True)
    try:
        epoch = iter(run_loader)
        next(epoch), next(epoch), next(epoch), next(epoch)  # two index batches ahead: the epoch's end pulled
        torch.rand(1, generator=source)
        with pytest.warns(LoopWarning, match="drawn from elsewhere"):
            next(epoch)
    finally:
        run_loader.stop_workers()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(1)

    def forward(self, x):
        return self.norm(x.unsqueeze(1))


def test_update_bn_after_an_epoch_left_at_its_last_batch_reads_the_plain_loaders_order():
    """torch's SWA recipe: the training's last epoch is left at its last batch, then
    torch.optim.swa_utils.update_bn(loader, swa_model) reads a new epoch of the same loader. (Its batches all full:
    the sampler's next permutation is drawn at the pull after the last, where the plain loader never went.)"""
    def trained(batches) -> torch.Tensor:
        epoch = iter(batches)
        for _ in range(6):  # every batch, never StopIteration
            next(epoch)
        swa = torch.optim.swa_utils.AveragedModel(Net())
        torch.optim.swa_utils.update_bn(((x,) for (x,) in batches), swa)
        return torch.stack([swa.module.norm.running_mean, swa.module.norm.running_var])

    plain = trained(loader("shuffle, generator=", 0, samples=24)[0])
    model = nn.Linear(1, 1)
    user = loader("shuffle, generator=", 0, samples=24)[0]
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), user,
                           plan={"loader": {"num_workers": 1}}, device="cpu")
    try:
        assert run.report.row("loader").status == "applied"
        assert torch.equal(trained(run.loader), plain)
    finally:
        run.close()
