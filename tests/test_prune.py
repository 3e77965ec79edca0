"""prune: real NNI pruning and ModelSpeedup surgery on the book's CNN, a tiny CNN and resnet18."""
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.accelerators.prune import config_problems, fx_trace
from accel.errors import PlanError
from accel.testing import BookCNN, cifar_shaped, digits_datasets, snapshot, tiny_loader, tiny_model, tiny_optimizer

pytest.importorskip("nni")

BOOK_CNN_PARAMETERS = 2_122_186
BOOK_CNN_PRUNED = 1_059_306  # conv1 32->16, conv2 64->32 filters, fc1 4096->2048 inputs


def digits_rgb32(samples=256, batch_size=32):
    """sklearn's real digits, upsampled to 3x32x32 (the book's CIFAR-10 input shape)."""
    images, labels = cifar_shaped(digits_datasets()[0]).tensors
    return DataLoader(TensorDataset(images[:samples], labels[:samples]), batch_size=batch_size)


def count(model):
    return sum(p.numel() for p in model.parameters())


def test_book_cnn_l1_half_parameters_and_keeps_training():
    torch.manual_seed(0)
    model, loader = BookCNN(), digits_rgb32(samples=64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    assert count(model) == BOOK_CNN_PARAMETERS
    before = snapshot(model, optimizer)
    run = accel.accelerate(model, optimizer, loader, {"prune": {"pruner": "l1", "config_list": [
        {"op_types": ["Conv2d"], "sparse_ratio": 0.5}]}}, device="cpu")
    row = run.report.row("prune")
    assert row.status == "applied"
    assert count(run.model) == BOOK_CNN_PRUNED == row.changes["parameters_after"]
    assert row.changes["parameters_before"] == BOOK_CNN_PARAMETERS
    assert set(row.changes["layers_changed"]) == {"conv1", "conv2", "fc1"}
    assert run.model.conv1.out_channels == 16 and run.model.conv2.out_channels == 32
    assert "state reset" in row.changes["optimizer"]
    # the user's objects are untouched
    assert snapshot(model, optimizer).changes(before) == []
    # the rebuilt optimizer: same class and hyperparameters, pointing at the new parameters
    assert type(run.optimizer) is torch.optim.SGD and run.optimizer is not optimizer
    group = run.optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.05, 0.9, 1e-4)
    assert [id(p) for p in group["params"]] == [id(p) for p in run.model.parameters()]
    # it keeps training: parameters change after a step and the loss goes down
    start = copy.deepcopy(run.model.state_dict())
    losses = accel.testing.train_steps(run, epochs=15)  # 30 steps over 64 real digits
    assert all(not torch.equal(start[k], v) for k, v in run.model.state_dict().items())
    assert sum(losses[-4:]) < 0.8 * sum(losses[:4])


@pytest.mark.parametrize("pruner", ["l2", "fpgm", "taylor"])
def test_other_pruners_shrink_the_tiny_cnn(pruner):
    train, _ = digits_datasets()
    loader = DataLoader(train, batch_size=32)
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), loader,
                           {"prune": {"pruner": pruner, "taylor_steps": 5}}, device="cpu")
    row = run.report.row("prune")
    assert row.changes["parameters_after"] < row.changes["parameters_before"] == count(model)
    assert run.model.conv1.out_channels == 4 and run.model.conv2.out_channels == 8
    losses = accel.testing.train_steps(run)
    assert all(l == l for l in losses)  # finite: the pruned model trains


def test_resnet18_small_input():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = digits_rgb32(samples=8, batch_size=4)
    run = accel.accelerate(model, optimizer, loader, {"prune": {"config_list": [
        {"op_types": ["Conv2d"], "sparse_ratio": 0.5, "exclude_op_names": ["conv1"]}]}}, device="cpu")
    row = run.report.row("prune")
    assert row.changes["parameters_after"] < 0.6 * row.changes["parameters_before"]
    assert "layer1.0.conv1" in row.changes["layers_changed"]
    assert run.model.conv1.out_channels == 64  # excluded by name
    before = [p.detach().clone() for p in run.model.parameters()]
    accel.testing.train_steps(run)
    assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters()))


def test_warmup_trains_the_copy_before_pruning():
    pruned = []
    for steps in (0, 3):
        model = tiny_model()
        before = snapshot(model)
        run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(),
                               {"prune": {"warmup_steps": steps}}, device="cpu")
        assert snapshot(model).changes(before) == []
        pruned.append(run.model.conv1.weight.detach())
    assert not torch.equal(*pruned)


class Branchy(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x  # data-dependent control flow: torch.fx cannot trace it


def test_untraceable_model_is_refused_naming_the_module_and_left_alone():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), Branchy(), nn.Flatten(), nn.Linear(144, 10))
    before = snapshot(model)
    with pytest.raises(PlanError, match=r"cannot trace module '1' \(Branchy\)"):
        accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["prune"], device="cpu")
    assert snapshot(model).changes(before) == []
    with pytest.raises(ValueError, match="Branchy"):
        fx_trace(model)


def test_needs_an_input_or_a_loader_and_optional_skips():
    model = tiny_model()
    with pytest.raises(PlanError, match="dummy_input"):
        accel.accelerate(model, tiny_optimizer(model), None, ["prune"], device="cpu")
    run = accel.accelerate(model, tiny_optimizer(model), None, {"prune": {"optional": True}}, device="cpu")
    assert run.report.row("prune").status == "skipped" and run.model is model
    run = accel.accelerate(model, None, None, {"prune": {"dummy_input": torch.randn(2, 1, 8, 8)}}, device="cpu")
    assert run.model.conv1.out_channels == 4 and run.optimizer is None


@pytest.mark.parametrize("config, message", [
    ({"op_types": ["Conv2d"], "sparsity": 0.5}, "did you mean 'sparse_ratio'"),
    ({"op_types": ["Conv"], "sparse_ratio": 0.5}, "no module of type"),
    ({"op_names": ["conv9"], "sparse_ratio": 0.5}, "no module named"),
    ({"sparse_ratio": 0.5}, "names no layers"),
    ({"op_types": ["Conv2d"]}, "says how much to prune nowhere"),
    ({"op_types": ["Conv2d"], "sparse_ratio": 0.5, "granularity": "rows"}, "granularity"),
    ({"op_types": "Conv2d", "sparse_ratio": 0.5}, "not a list of strings"),
])
def test_config_list_is_validated_before_anything_is_touched(config, message):
    model = tiny_model()
    with pytest.raises(PlanError, match=message):
        accel.accelerate(model, tiny_optimizer(model), tiny_loader(), {"prune": {"config_list": [config]}},
                         device="cpu")


@settings(max_examples=50, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=10))
def test_sparse_ratio_must_lie_in_unit_interval(ratio):
    found = config_problems([{"op_types": ["Conv2d"], "sparse_ratio": ratio}], tiny_model())
    assert bool(found) == (not 0 <= ratio < 1)


def test_prune_then_fused_optimizer_stack():
    model = BookCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = accel.accelerate(model, optimizer, digits_rgb32(samples=64), ["prune", "fused_optimizer"], device="cpu")
    assert run.report.applied == ["prune", "fused_optimizer"]
    assert run.optimizer.defaults["fused"] is True
    assert [id(p) for p in run.optimizer.param_groups[0]["params"]] == [id(p) for p in run.model.parameters()]
    before = [p.detach().clone() for p in run.model.parameters()]
    accel.testing.train_steps(run)
    assert all(not torch.equal(a, b) for a, b in zip(before, run.model.parameters()))
