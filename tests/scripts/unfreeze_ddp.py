"""2 gloo ranks: a layer unfrozen after DDP wrapped the model is named (StaleWarning), and accelerate() again
wraps the model anew so that the ranks train it together: the weights stay equal on every rank."""
import atexit
import warnings


@atexit.register  # registered before accel (and its drain) is imported, so it runs after the drain: the last word
def parked():    # before the interpreter finalizes
    from accel.distributed.group import gloo_workers_busy

    if not gloo_workers_busy():
        print("gloo workers parked at exit", flush=True)


import torch  # noqa: E402

import accel  # noqa: E402
from accel.errors import StaleWarning  # noqa: E402
from accel.testing import tiny_loader, tiny_model  # noqa: E402


def steps(run, count):
    batches = iter(run.loader)
    for _ in range(count):
        x, y = next(batches)
        loss = torch.nn.functional.cross_entropy(run.model(x), y)
        run.backward(loss)
        run.step()


torch.distributed.init_process_group("gloo")  # the script's own group: accelerate() again keeps it
model = tiny_model()
model.conv2.requires_grad_(False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
run = accel.accelerate(model, optimizer, tiny_loader(shuffle=False), ["ddp"])
steps(run, 1)
model.conv2.requires_grad_(True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    steps(run, 1)
assert any(issubclass(w.category, StaleWarning) and "accelerate() again" in str(w.message) for w in caught), caught
run = accel.accelerate(model, optimizer, tiny_loader(shuffle=False), ["ddp"])
assert "steps=2" in run.report.continued, run.report.continued
weight = model.conv2.weight.detach().clone()
steps(run, 2)
assert not torch.equal(weight, model.conv2.weight)  # it trains
gathered = [torch.empty_like(model.conv2.weight) for _ in range(2)]
torch.distributed.all_gather(gathered, model.conv2.weight.detach())
assert torch.equal(gathered[0], gathered[1]), "ranks trained apart"
run.close()
torch.distributed.barrier()  # no rank tears the group down while the other still uses it (gloo aborts)
torch.distributed.destroy_process_group()
print("OK", flush=True)
