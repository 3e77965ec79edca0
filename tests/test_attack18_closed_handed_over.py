"""run.close() of a run that accelerate() again already took over (it is closed: the hand-over closed it) stopped the
workers of the loader it rebuilt under the epoch that goes on: the new run's epoch, where the loop gave the earlier
run's loader to accelerate() again, or the epoch the hand-over lets the loop finish. The epoch raised 'the run was
closed during this epoch ... iterate a new run's' loader, to a loop doing just that (found by ATK18)."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.testing import tiny_model, tiny_optimizer

PLAN = {"loader": {"num_workers": 2}}


def objects():
    model = tiny_model(0)
    data = TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,)))
    return model, tiny_optimizer(model), DataLoader(data, batch_size=16, shuffle=True,
                                                    generator=torch.Generator().manual_seed(3))


@pytest.mark.slow
@pytest.mark.parametrize("given", ["the earlier run's loader", "your loader"])
def test_closing_a_run_already_taken_over_leaves_the_epoch_that_goes_on_whole(given):
    model, optimizer, loader = objects()
    earlier = accel.accelerate(model, optimizer, loader, plan=PLAN, device="cpu")
    assert earlier.loader.loader is not loader  # rebuilt: its workers are the run's
    batches = iter(earlier.loader)
    drawn = [next(batches)]
    if given == "the earlier run's loader":  # the new run reads it (accelerate() again on run.loader, each epoch)
        run = accel.accelerate(model, optimizer, earlier.loader, plan=[], device="cpu")
    else:  # the loop finishes the epoch it is in on the earlier run's loader, as the hand-over lets it
        run = accel.accelerate(model, optimizer, loader, plan=PLAN, device="cpu")
    assert earlier.closed
    if given == "the earlier run's loader":  # the loop iterates the new run's loader
        batches = iter(run.loader)
        drawn = [next(batches)]
    earlier.close()  # tidy: the earlier run, closed already
    drawn += list(batches)
    assert len(drawn) == 4
    run.close()
