"""A loop that goes on with a run that is closed (accelerate() again took it over, and the loop kept the old name, or
it called run.close() early) trains through a plan that no longer applies (its process changes and hooks undone, the
new run's counters and schedule left behind), and nothing said so; a new epoch on the closed run's loader already
warned (found by ATK18)."""
import warnings

import pytest
import torch

import accel
from accel.testing import tiny_loader, tiny_model, tiny_optimizer

PLAN = {"grad_accumulation": {"steps": 2}}


def step(run, batch):
    images, labels = batch
    with run.autocast():
        loss = torch.nn.functional.cross_entropy(run.model(images), labels)
    run.backward(loss)
    return run.step()


@pytest.mark.filterwarnings("ignore::accel.BypassWarning")  # the new run's grad_accumulation stands aside: said too
@pytest.mark.parametrize("closed_by", ["accelerate() again", "run.close()"])
def test_stepping_a_closed_run_is_said_once(closed_by):
    model, loader = tiny_model(0), tiny_loader()
    run = accel.accelerate(model, tiny_optimizer(model), loader, plan=PLAN, device="cpu")
    batch = next(iter(run.loader))
    step(run, batch)
    if closed_by == "run.close()":
        run.close()
        latest = None
    else:
        latest = accel.accelerate(model, run.optimizer, loader, plan=PLAN, device="cpu")  # the loop forgot `run =`
    with pytest.warns(accel.StaleWarning, match="closed") as said:
        step(run, batch)
        step(run, batch)
    stale = [w for w in said if issubclass(w.category, accel.StaleWarning)]
    assert len(stale) == 1 and stale[0].filename == __file__  # once, at the loop's line
    with warnings.catch_warnings():
        warnings.simplefilter("error", accel.StaleWarning)
        if latest is not None:  # the run accelerate() returned last is open: nothing to say
            step(latest, batch)
            latest.close()
