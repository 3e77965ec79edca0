"""run.save then run.load, on the same run, with torch's own optimizers whose state is not shaped like the parameters:
LBFGS keeps flat vectors of every parameter (``d``, ``prev_flat_grad``, ``old_dirs``) under the first one, and
Adafactor keeps row and column variances of a matrix (``row_var``, ``col_var``). The checkpoint's fit check took
every non-scalar state tensor for a parameter-shaped one and refused the file the run itself wrote
(accel/run/checkpoint_fit.py, optimizer_problems); state broadcast over its parameter, or a flat vector of all of
them, fits."""
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.errors import CheckpointError
from accel.workloads import digits_datasets

OPTIMIZERS = {"LBFGS": lambda params: torch.optim.LBFGS(params, lr=0.5, max_iter=3),
              "Adafactor": lambda params: torch.optim.Adafactor(params, lr=0.01)}


def trained_run(name: str):
    """Two steps of a small MLP on real digits, stepped as the optimizer needs (a closure for LBFGS)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    optimizer = OPTIMIZERS[name](model.parameters())
    images, labels = digits_datasets(seed=0)[0].tensors
    loader = DataLoader(TensorDataset(images[:16], labels[:16]), batch_size=8)
    run = accel.accelerate(model, optimizer, loader, plan=[], device="cpu")
    for x, y in run.loader:
        def closure(x=x, y=y):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(run.model(x), y)
            run.backward(loss)
            return loss
        if name == "LBFGS":
            optimizer.step(closure)
        else:
            closure()
            run.step()
    return run, model, optimizer


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_run_loads_the_checkpoint_it_saved_whatever_shape_its_optimizer_keeps(name, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (LBFGS stepped by the loop: said, as the contract wants)
        run, model, optimizer = trained_run(name)
    path = tmp_path / "run.pt"
    run.save(path)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = optimizer.state_dict()["state"]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    run.load(path)
    run.close()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    loaded = optimizer.state_dict()["state"]
    for index, values in state.items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, loaded[index][key]), (index, key)


def test_optimizer_state_that_fits_no_parameter_is_still_refused(tmp_path):
    """The other side: the same model with its optimizer's parameters listed in another order, so the state saved for
    one parameter would land on another of another shape. run.load refuses, nothing changed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = digits_datasets(seed=0)[0].tensors
    loader = DataLoader(TensorDataset(images[:16], labels[:16]), batch_size=8)
    run = accel.accelerate(model, optimizer, loader, plan=[], device="cpu")
    for x, y in run.loader:
        run.backward(nn.functional.cross_entropy(run.model(x), y))
        run.step()
    run.save(tmp_path / "run.pt")
    run.close()
    reordered = torch.optim.SGD(list(model.parameters())[::-1], lr=0.1, momentum=0.9)
    other = accel.accelerate(model, reordered, loader, plan=[], device="cpu")
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="another shape"):
        other.load(tmp_path / "run.pt")
    other.close()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items()) and not reordered.state
