"""grad_accumulation's held gradients, taken back from a checkpoint (run.load) or from another run (accelerate() again,
plan="auto"'s switch): each is checked against the parameter it belongs to before any is taken. A checkpoint of the
same model in another dtype was taken silently (its gradients cast, added into the next update); a gradient without
data (a meta tensor) was found only while the gradients were being set, after the micro-step and the gradients
before it were already the checkpoint's; a value that is not a tensor raised AttributeError out of the state."""
import pytest
import torch
from torch import nn

import accel
from accel.errors import CheckpointError

PLAN = {"grad_accumulation": {"steps": 3}}


def objects(dtype=torch.float32):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)).to(dtype)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def batch(dtype=torch.float32, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(4, 6, generator=generator).to(dtype), torch.randint(0, 2, (4,), generator=generator)


def micro_batch(run, dtype=torch.float32, seed=1, last=False):
    """One micro-batch: its gradients held, the update not made (made: ``last``)."""
    x, y = batch(dtype, seed)
    run.backward(nn.functional.cross_entropy(run.model(x), y))
    assert run.step() is not last


def held(model):
    return {n: (p.detach().clone(), None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def same(before, after):
    def equal(a, b):
        return a is b is None or a is not None and b is not None and torch.equal(a, b)

    return before.keys() == after.keys() and all(equal(w, after[n][0]) and equal(g, after[n][1])
                                                 for n, (w, g) in before.items())


def test_a_checkpoint_of_the_model_in_another_dtype_is_refused_naming_it_and_changes_nothing(tmp_path):
    model64, optimizer64 = objects(torch.float64)
    saved = accel.accelerate(model64, optimizer64, None, PLAN, device="cpu")
    micro_batch(saved, torch.float64)
    saved.save(tmp_path / "float64.pt")
    saved.close()

    model, optimizer = objects()
    run = accel.accelerate(model, optimizer, None, PLAN, device="cpu")
    micro_batch(run, seed=2)  # the run holds gradients of its own
    before = held(model)
    with pytest.raises(CheckpointError, match=r"dtypes differ \(checkpoint vs model\): 0\.weight torch\.float64 vs "
                                              r"torch\.float32"):
        run.load(tmp_path / "float64.pt")
    assert run.state("grad_accumulation").micro == 1 and same(before, held(model))
    run.close()


def test_a_gradient_without_data_is_refused_before_anything_is_taken():
    model, optimizer = objects()
    run = accel.accelerate(model, optimizer, None, PLAN, device="cpu")
    grads = {n: torch.ones_like(p) for n, p in model.named_parameters()}
    grads["2.bias"] = torch.zeros(2, device="meta")  # the last: the others would be set by then
    with pytest.raises(ValueError, match=r"without data: 2\.bias \(a meta tensor\)"):
        run.load_accelerator_state("grad_accumulation", {"micro": 1, "grads": grads})
    assert run.state("grad_accumulation").micro == 0 and all(p.grad is None for p in model.parameters())
    run.close()


@pytest.mark.parametrize("grads, said", [
    ({"0.weight": [[0.0] * 6] * 5}, r"not tensors: 0\.weight \(a list\)"),
    ([torch.zeros(5, 6)], "a list, not gradients by parameter name"),
])
def test_gradients_that_are_not_tensors_by_name_are_a_value_error(grads, said):
    model, optimizer = objects()
    run = accel.accelerate(model, optimizer, None, PLAN, device="cpu")
    with pytest.raises(ValueError, match=said):
        run.load_accelerator_state("grad_accumulation", {"micro": 1, "grads": grads})
    assert run.state("grad_accumulation").micro == 0 and all(p.grad is None for p in model.parameters())
    run.close()


def test_gradients_held_at_an_updates_boundary_are_refused():
    """state_dict() keeps gradients only between micro-batches: ones at micro-step 0 would be added into the next
    update, which holds none in the plain loop."""
    model, optimizer = objects()
    run = accel.accelerate(model, optimizer, None, PLAN, device="cpu")
    with pytest.raises(ValueError, match="gradients held at micro-step 0"):
        run.load_accelerator_state("grad_accumulation", {"micro": 0, "grads": {"0.bias": torch.ones(5)}})
    assert all(p.grad is None for p in model.parameters())
    run.close()


def test_a_checkpoint_of_its_own_dtype_still_resumes_the_accumulation(tmp_path):
    """What fits is taken as before: the same training as one that never stopped."""
    model, optimizer = objects()
    run = accel.accelerate(model, optimizer, None, PLAN, device="cpu")
    micro_batch(run)
    run.save(tmp_path / "mid.pt")
    micro_batch(run, seed=2)
    micro_batch(run, seed=3, last=True)
    straight = {n: p.detach().clone() for n, p in model.named_parameters()}
    run.close()

    again, again_optimizer = objects()
    resumed = accel.accelerate(again, again_optimizer, None, PLAN, device="cpu")
    resumed.load(tmp_path / "mid.pt")
    micro_batch(resumed, seed=2)
    micro_batch(resumed, seed=3, last=True)
    assert all(torch.equal(p, straight[n]) for n, p in again.named_parameters())
    resumed.close()


def test_a_checkpoint_holding_a_tensor_without_data_is_a_checkpoint_error(tmp_path):
    """torch.load(map_location="cpu", weights_only=True) reads a meta tensor back as a meta tensor, so a file anyone
    wrote (its checksum computed the way accel computes it, over the rest) reaches run.load's checksum, which
    cannot read its bytes: NotImplementedError, not accel's error naming the file."""
    from accel.run.checkpoint import checksum

    model, optimizer = objects()
    run = accel.accelerate(model, optimizer, None, PLAN, device="cpu")
    micro_batch(run)
    run.save(tmp_path / "mid.pt")
    state = torch.load(tmp_path / "mid.pt", weights_only=True)
    state["accelerators_per_rank"][0]["grad_accumulation"]["grads"]["2.bias"] = torch.zeros(2, device="meta")
    state["checksum"] = checksum({k: v for k, v in state.items() if k != "accelerators_per_rank"})
    torch.save(state, tmp_path / "meta.pt")
    with pytest.raises(CheckpointError, match="meta.pt"):
        run.load(tmp_path / "meta.pt")
    run.close()
