"""attack9: plan="auto" chose a rebuilt loader by the loop's wait for data, and it could not join at the next epoch
(an IterableDataset that does not shard by worker refuses workers): the warning said so, but the report went on saying
'chose loader: loader joins at the next epoch', with the loader in report.tuning.plan, which was not in place."""
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from virtual_clock import VirtualClock

import accel
import accel.clock
from accel.search import inloop
from accel.testing import tiny_model

CLOCK = VirtualClock()


class SlowStream(IterableDataset):
    """A stream whose items take 4 ms each on the test's clock: the loop waits for data."""

    def __iter__(self):
        for index in range(48):
            CLOCK.advance(0.004)
            yield torch.randn(1, 8, 8, generator=torch.Generator().manual_seed(index)), index % 10


def epoch(run):
    for x, y in run.loader:
        run.backward(nn.functional.cross_entropy(run.model(x), y))
        run.step()


def test_a_chosen_loader_that_cannot_join_is_not_reported_as_chosen(monkeypatch):
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    with accel.clock.use(CLOCK):
        model = tiny_model()
        CLOCK.per_forward(model, 0.01)
        run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.05),
                               DataLoader(SlowStream(), batch_size=4),
                               accel.Auto(cache=False, budget_s=10, candidates=[[{"loader": {"num_workers": 1}}]]),
                               device="cpu")
        while run.phase != "settled":
            epoch(run)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            epoch(run)  # the next epoch: the loader tries to join, and is refused
        tuning, headline, by = run.report.tuning, str(run.report.search).splitlines()[0], run.report.search.by
        in_place = run.plan.names()
        run.close()
    joining = [(w.filename, w.lineno) for w in said if "could not join" in str(w.message)]
    assert joining == [(__file__, epoch.__code__.co_firstlineno + 1)]  # the loop's own line: its for over run.loader
    assert "loader" not in in_place and "loader" not in tuning.plan.names(), tuning.plan
    assert "joins at the next epoch" not in tuning.why and "could not join" in tuning.why, tuning.why
    assert "chose loader" not in headline and "joins at the next epoch" not in headline, headline
    assert "loader" not in by, by  # the report's record of who chose each accelerator (to_dict()["search"])


def test_a_cached_answer_whose_loader_could_not_join_is_replayed_without_it(tmp_path, monkeypatch):
    """The answer was remembered with its rebuilt loader, which could not join at the next epoch: the cache went on
    replaying it to every later run of the setup, each of which tried the loader again at its next epoch and said
    once more that it could not join."""
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    said = []
    with accel.clock.use(CLOCK):
        for time in ("first", "again"):
            model = tiny_model()
            CLOCK.per_forward(model, 0.01)
            run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.05),
                                   DataLoader(SlowStream(), batch_size=4),
                                   accel.Auto(cache=tmp_path, budget_s=10,
                                              candidates=[[{"loader": {"num_workers": 1}}]]), device="cpu")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                while run.phase != "settled":
                    epoch(run)
                epoch(run)  # the next epoch: a loader pending tries to join
            said.append([str(w.message) for w in caught if "could not join" in str(w.message)])
            tuning = run.report.tuning
            run.close()
    assert said[0] and tuning.from_cache, (said, tuning)
    assert not said[1] and "loader" not in tuning.plan.names(), (said[1], tuning.plan)
