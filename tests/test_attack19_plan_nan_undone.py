"""plan="auto" in your loop, a candidate that truly gives a NaN loss (finite under the plain loop): it was dropped
("loss off"), but its NaN step had already updated your weights and your optimizer's state, so every later step of your
training (and of the search: each later fault blamed on "the model") was NaN. The plan's damage is undone now: on a CPU
the weights and the optimizer's state are put back as they were before that step."""
import torch
from torch import nn
from virtual_clock import VirtualClock

import accel
import accel.clock
from accel.plan.contract import Accelerator, Stage, register, unregister
from accel.search import inloop
from accel.testing import tiny_loader, tiny_model

CLOCK = VirtualClock()


class Flaky(Accelerator):
    """A test accelerator whose plan gives one NaN output: the second forward after it is applied."""

    name = "flaky"
    stage = Stage.KERNELS

    def apply(self, ctx):
        model, forwards = ctx.model, [0]

        def poison(module, args, output):
            forwards[0] += 1
            return output * float("nan") if forwards[0] == 2 else output

        ctx.journal.hook("flaky", lambda: model.register_forward_hook(poison))
        return {}


def finite(tensors) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors if isinstance(t, torch.Tensor))


def searched(monkeypatch, make_optimizer, flaky_plan):
    """Your loop under plan="auto" until it settles, then one more epoch: (model, optimizer, the flaky arm, the
    report's search faults, the updates)."""
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    register(Flaky)
    try:
        with accel.clock.use(CLOCK):
            torch.manual_seed(0)
            model = tiny_model()
            CLOCK.per_forward(model, 0.01)
            optimizer = make_optimizer(model.parameters())
            run = accel.accelerate(model, optimizer, tiny_loader(), accel.Auto(
                cache=False, budget_s=10, candidates=[flaky_plan, ["channels_last"]]), device="cpu")
            updates, epochs = 0, 0
            while epochs < 1 and updates < 200:
                for x, y in run.loader:
                    run.backward(nn.functional.cross_entropy(run.model(x), y))
                    updates += not run.step()
                epochs += run.phase == "settled"
            faults = run.report.to_dict()["search"]["faults"]
            run.close()
    finally:
        unregister("flaky")
    flaky = next(a for a in run.arms if "flaky" in a.plan)
    assert flaky.status == "loss off" and "put back" in flaky.reason, flaky
    return model, optimizer, faults, updates


def test_a_plans_nan_step_is_undone_in_your_weights_and_optimizer(monkeypatch):
    model, optimizer, faults, _ = searched(monkeypatch, lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
                                           ["flaky"])
    assert finite(model.parameters()) and finite(model.buffers()), "the plan's NaN step trains on"
    assert finite(t for state in optimizer.state.values() for t in state.values())
    assert not faults, "a later step was blamed on NaN weights"
