"""attack23 on run.save / run.load with tensors of odd kinds in a real model's state (sklearn's digits, trained a few
steps): a view of one element is contiguous at any stride, and contiguous() returns it as it is: with its negative
bit (a complex buffer's .conj().imag), or a stride other than one (a column of one row, w[:1, 0]), the checksum's
byte view raised and run.save said the disk could not be written. A
tensor of the user's own torch.Tensor subclass (a buffer, or a Parameter) was written, and run.load then refused the
file as "not an accel checkpoint": run.save must refuse what run.load cannot read back, naming it, and write it
where the program allowed the class (torch.serialization.add_safe_globals)."""
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.errors import CheckpointError

DIGITS = load_digits()


class Tagged(torch.Tensor):
    """A user's tensor subclass (a tag on a weight, as libraries add them)."""


def trained(extra) -> tuple[nn.Module, "accel.Run"]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    extra(model)
    data = TensorDataset(torch.tensor(DIGITS.data[:64], dtype=torch.float32) / 16, torch.tensor(DIGITS.target[:64]))
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=16),
                           plan=[], device="cpu")
    for x, y in run.loader:
        run.backward(nn.functional.cross_entropy(run.model(x), y))
        run.step()
    return model, run


VIEWS = {  # one element: contiguous whatever its stride, which the checksum's byte view refused
    "negative": (lambda: torch.tensor(1 + 2j).conj().imag, torch.tensor(-2.0)),  # its negative bit on
    "strided": (lambda: torch.arange(6.0).view(2, 3)[:1, 0], torch.tensor([0.0])),  # a column of one row: stride 3
}


@pytest.mark.parametrize("view", list(VIEWS))
def test_a_one_element_view_is_saved_and_loaded(tmp_path, view):
    make, value = VIEWS[view]
    assert make().is_contiguous() and make().numel() == 1
    model, run = trained(lambda m: m[2].register_buffer("phase", make()))
    try:
        run.save(tmp_path / "run.pt")
        model[2].phase.fill_(5)
        run.load(tmp_path / "run.pt")
        assert torch.equal(model[2].phase.resolve_neg(), value)
    finally:
        run.close()


@pytest.mark.parametrize("where", ["buffer", "parameter"])
def test_a_tensor_subclass_run_load_cannot_read_is_refused_by_run_save_naming_it(tmp_path, where):
    def tag(model):
        if where == "buffer":
            model[0].register_buffer("scale", torch.ones(32).as_subclass(Tagged))
        else:
            model[2].bias = nn.Parameter(model[2].bias.detach().as_subclass(Tagged))
    model, run = trained(tag)
    try:
        with pytest.raises(CheckpointError) as refused:
            run.save(tmp_path / "run.pt")
        place = "model/0.scale" if where == "buffer" else "model/2.bias"
        assert place in str(refused.value) and "Tagged" in str(refused.value), refused.value
        assert not (tmp_path / "run.pt").exists()
        with torch.serialization.safe_globals([Tagged]):  # the program allows the class: written, and read back
            run.save(tmp_path / "run.pt")
            saved = {k: v.as_subclass(torch.Tensor).clone() for k, v in model.state_dict().items()}
            for value in model.state_dict().values():
                value.zero_()
            run.load(tmp_path / "run.pt")
        assert all(torch.equal(v.as_subclass(torch.Tensor), saved[k]) for k, v in model.state_dict().items())
    finally:
        run.close()


class Vocabulary(nn.Module):
    """A module whose extra state keeps a set holding a tensor (its special tokens' embeddings, say)."""

    def __init__(self):
        super().__init__()
        self.special = torch.full((3,), 7.0)

    def get_extra_state(self):
        return {"special": {self.special}}

    def set_extra_state(self, state):
        self.special = next(iter(state["special"]))


def test_a_tensor_in_a_set_is_not_written_past_the_checksum(tmp_path):
    """The checksum walks dicts, lists and tuples: a tensor in a set (torch.load(weights_only) reads sets) was
    written, and a file whose bytes there changed (its checksum matching the rest) was loaded, unchecked."""
    model, run = trained(lambda m: m[0].add_module("vocabulary", Vocabulary()))
    try:
        try:
            run.save(tmp_path / "run.pt")
        except CheckpointError as refused:  # refused, naming it: nothing written
            assert "model/0.vocabulary._extra_state/special" in str(refused) and "set" in str(refused), refused
            assert not (tmp_path / "run.pt").exists()
            return
        state = torch.load(tmp_path / "run.pt", weights_only=True)
        next(iter(state["model"]["0.vocabulary._extra_state"]["special"])).fill_(-1.0)  # the bytes on disk changed
        torch.save(state, tmp_path / "changed.pt")
        with pytest.raises(CheckpointError):
            run.load(tmp_path / "changed.pt")
    finally:
        run.close()
