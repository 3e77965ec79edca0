"""Tensors of kinds run.save never writes, in a checkpoint: the checksum reads a dense tensor's bytes, and a meta
tensor holds none, a nested or a sparse one none in a flat order. A file anyone wrote (its checksum computed over the
rest) made run.load raise NotImplementedError or RuntimeError from the checksum, or from the layout check itself (a
sparse tensor has no storage to measure), instead of accel's refusal naming the file and the tensor's place; run.save
of a model holding one said the disk could not be written. A conjugate view (a complex buffer's .conj()) is dense: its
checksum raised at save, and it is now saved and loaded as it is."""
import pytest
import torch
from torch import nn

import accel
from accel.errors import CheckpointError
from accel.run.checkpoint import checksum

KINDS = {
    "meta": (lambda: torch.zeros(2, device="meta"), "a meta tensor"),
    "nested": (lambda: torch.nested.nested_tensor([torch.zeros(2)]), "a nested tensor"),
    "sparse_coo": (lambda: torch.zeros(2).to_sparse(), "a sparse_coo tensor"),
    "sparse_csr": (lambda: torch.zeros(1, 2).to_sparse_csr(), "a sparse_csr tensor"),
}
PLAN = {"grad_accumulation": {"steps": 3}}


def objects():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def micro_batch(run):
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 6, generator=generator), torch.randint(0, 2, (4,), generator=generator)
    run.backward(nn.functional.cross_entropy(run.model(x), y))
    run.step()


def crafted(path, put):
    """A checkpoint run.save wrote, changed by ``put`` and given a checksum over what the checksum can read."""
    state = torch.load(path, weights_only=True)
    put(state)
    state["checksum"] = checksum({k: v for k, v in state.items() if k not in ("model", "accelerators_per_rank")})
    torch.save(state, path.with_name("crafted.pt"))
    return path.with_name("crafted.pt")


PLACES = {
    "model/2.bias": lambda state, t: state["model"].__setitem__("2.bias", t),
    "accelerators_per_rank/0/grad_accumulation/grads/2.bias":
        lambda state, t: state["accelerators_per_rank"][0]["grad_accumulation"]["grads"].__setitem__("2.bias", t),
}


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_checkpoint_holding_a_tensor_the_checksum_cannot_read_is_refused_naming_its_place(tmp_path, kind, place):
    make, words = KINDS[kind]
    model, optimizer = objects()
    run = accel.accelerate(model, optimizer, None, PLAN, device="cpu")
    micro_batch(run)
    run.save(tmp_path / "mid.pt")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    path = crafted(tmp_path / "mid.pt", lambda state: PLACES[place](state, make()))
    try:
        with pytest.raises(CheckpointError) as refused:
            run.load(path)
        assert str(path) in str(refused.value) and f"{place} is {words}" in str(refused.value), refused.value
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
        assert run.state("grad_accumulation").micro == 1
    finally:
        run.close()


@pytest.mark.parametrize("kind", ["nested", "sparse_coo"])
def test_run_save_refuses_a_tensor_the_checksum_cannot_read_naming_it_not_the_disk(tmp_path, kind):
    make, words = KINDS[kind]
    model, optimizer = objects()
    model[2].register_buffer("table", make())
    run = accel.accelerate(model, optimizer, None, {}, device="cpu")
    try:
        with pytest.raises(CheckpointError) as refused:
            run.save(tmp_path / "run.pt")
        assert f"model/2.table ({words}" in str(refused.value) and "disk" not in str(refused.value), refused.value
        assert not (tmp_path / "run.pt").exists()
    finally:
        run.close()


def test_a_conjugate_view_is_saved_and_loaded_as_it_is(tmp_path):
    model, optimizer = objects()
    model[2].register_buffer("phase", torch.tensor([1 + 2j, 3 - 1j]).conj())
    run = accel.accelerate(model, optimizer, None, {}, device="cpu")
    run.save(tmp_path / "run.pt")
    run.close()
    again, again_optimizer = objects()
    again[2].register_buffer("phase", torch.zeros(2, dtype=torch.complex64))
    resumed = accel.accelerate(again, again_optimizer, None, {}, device="cpu")
    resumed.load(tmp_path / "run.pt")
    assert torch.equal(again[2].phase.resolve_conj(), torch.tensor([1 - 2j, 3 + 1j]))
    resumed.close()
