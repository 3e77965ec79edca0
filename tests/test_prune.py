"""prune: real NNI pruning and ModelSpeedup surgery on the book's CNN, a tiny CNN and resnet18."""
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.accelerators.prune.selection import config_problems, fx_trace, selected
from accel.accelerators.prune.speedup import retie
from accel.errors import AccelerateError, CheckpointError, PlanError
from accel.hardware import torch_version
from accel.run.state import saved_plan
from accel.testing import snapshot, tiny_loader, tiny_model, tiny_optimizer, train_steps
from accel.workloads import BookCNN, cifar_shaped, digits_datasets

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
    assert all(loss == loss for loss in losses)  # finite: the pruned model trains


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
    ({"op_names_re": ["conv("], "sparse_ratio": 0.5}, "not regular expressions"),
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


# --- what it keeps: frozen layers, ties, BatchNorm statistics, the output's shape, random states, batches -------

def test_frozen_layers_stay_frozen():
    model = tiny_model()
    model.conv1.requires_grad_(False)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    run = accel.accelerate(model, optimizer, tiny_loader(), ["prune"], device="cpu")
    assert run.model.conv1.out_channels == 4  # pruned, and still frozen
    assert ({n: p.requires_grad for n, p in run.model.named_parameters()}
            == {n: p.requires_grad for n, p in model.named_parameters()})
    frozen = run.model.conv1.weight.detach().clone()
    train_steps(run)
    assert torch.equal(run.model.conv1.weight, frozen)


class TiedHead(nn.Module):
    """A conv trunk, then two Linear layers sharing one weight (b.weight = a.weight) that pruning does not reshape."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 16)
        self.a, self.b, self.out = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 10)
        self.b.weight = self.a.weight

    def forward(self, x):
        x = self.fc(torch.relu(self.conv(x)).flatten(1))
        return self.out(self.b(torch.relu(self.a(x))))


def test_tied_weights_pruning_does_not_reshape_stay_one_tensor():
    torch.manual_seed(0)
    model = TiedHead()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["prune"], device="cpu")
    assert run.model.conv.out_channels == 4 and run.model.fc.in_features == 4 * 8 * 8
    assert run.model.a.weight is run.model.b.weight
    assert torch.equal(run.model.a.weight, model.a.weight)
    params = run.optimizer.param_groups[0]["params"]
    assert [id(p) for p in params] == [id(p) for p in run.model.parameters()]
    train_steps(run)
    assert run.model.a.weight is run.model.b.weight


class TiedConvs(nn.Module):
    """c1 and c2 share one weight, and the default config prunes both."""

    def __init__(self):
        super().__init__()
        self.stem, self.c1, self.c2 = (nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1),
                                       nn.Conv2d(8, 8, 3, padding=1))
        self.c2.weight = self.c1.weight
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.c2(torch.relu(self.c1(torch.relu(self.stem(x)))))).flatten(1))


class TiedDownstream(nn.Module):
    """fc's input shrinks when conv is pruned, and fc shares its weight with fc2."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.fc, self.fc2, self.out = nn.Linear(128, 128), nn.Linear(128, 128), nn.Linear(128, 10)
        self.fc2.weight = self.fc.weight

    def forward(self, x):
        return self.out(self.fc2(torch.relu(self.fc(torch.relu(self.conv(x)).flatten(1)))))


@pytest.mark.parametrize("make, message", [
    (TiedConvs, r"\['c1.weight', 'c2.weight'\] are one tensor \(tied\) and pruning may reshape 'c1'"),
    (TiedDownstream, r"\['fc.weight', 'fc2.weight'\] are one tensor \(tied\) and pruning may reshape 'fc' "
                     r"\(fed by the pruned layer 'conv'\); .*add 'conv' to exclude_op_names"),
])
def test_tied_weights_pruning_would_reshape_are_refused_up_front(make, message):
    torch.manual_seed(0)
    model = make()
    before = snapshot(model)
    with pytest.raises(PlanError, match=message):
        accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["prune"], device="cpu")
    assert snapshot(model).changes(before) == []


def test_retie_makes_equal_copies_one_tensor_and_refuses_what_differs():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    shapes = {"0.weight": torch.Size([4, 4]), "1.weight": torch.Size([4, 4])}
    with pytest.raises(ValueError, match=r"untied the parameters \['0.weight', '1.weight'\]"):
        retie(model, [["0.weight", "1.weight"]], shapes)  # different values: not the same tensor any more
    with torch.no_grad():
        model[1].weight.copy_(model[0].weight)
    retie(model, [["0.weight", "1.weight"]], shapes)
    assert model[1].weight is model[0].weight
    with pytest.raises(ValueError, match="untied"):
        retie(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), [["0.weight", "1.weight"]], shapes)


class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        return self.fc(torch.relu(self.b2(self.c2(x))).flatten(1))


def test_batchnorm_statistics_and_module_modes_are_kept():
    torch.manual_seed(0)
    model = BatchNormNet()
    for _ in range(3):  # statistics of its own, and a batch count of 3
        model(torch.randn(16, 1, 8, 8) * 3 + 1)
    model.b2.eval()  # a frozen BatchNorm in a model that trains
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), {"prune": {"config_list": [
        {"op_names": ["c1"], "sparse_ratio": 0.5}]}}, device="cpu")
    pruned = run.model
    assert pruned.c1.out_channels == pruned.b1.num_features == 4 and pruned.c2.out_channels == 8
    for key in ("b2.running_mean", "b2.running_var", "b2.num_batches_tracked", "b1.num_batches_tracked"):
        assert torch.equal(pruned.state_dict()[key], before[key]), key  # a layer it did not prune: exactly
    rows = [next(i for i, row in enumerate(before["c1.weight"]) if torch.equal(row, new))
            for new in pruned.c1.weight.detach()]  # the channels kept, found by their weights
    assert torch.equal(pruned.b1.running_mean, before["b1.running_mean"][rows])
    assert torch.equal(pruned.b1.running_var, before["b1.running_var"][rows])
    assert pruned.training and pruned.b1.training and not pruned.b2.training


class FullyConv(nn.Module):
    """Its last conv emits the classes: pruning it would change the output's shape."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Conv2d(16, 10, 1)

    def forward(self, x):
        return self.head(torch.relu(self.c2(torch.relu(self.c1(x))))).mean((2, 3))


def test_layers_producing_the_output_are_kept_and_reported():
    torch.manual_seed(0)
    model = FullyConv()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["prune"], device="cpu")
    row = run.report.row("prune")
    assert row.changes["output_layers_kept"] == ["head"]
    assert (run.model.c1.out_channels, run.model.c2.out_channels, run.model.head.out_channels) == (4, 8, 10)
    assert run.model(torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_an_output_layer_named_in_op_names_is_pruned_only_if_the_output_keeps_its_shape():
    torch.manual_seed(0)
    model = FullyConv()
    before = snapshot(model)
    with pytest.raises(AccelerateError, match=r"changed the model's output shape from \(16, 10\) to \(16, 5\)"):
        accel.accelerate(model, tiny_optimizer(model), tiny_loader(), {"prune": {"config_list": [
            {"op_names": ["head"], "sparse_ratio": 0.5}]}}, device="cpu")
    assert snapshot(model).changes(before) == []
    with pytest.raises(PlanError, match=r"selects only \['head'\], which produce the model's output"):
        accel.accelerate(model, tiny_optimizer(model), tiny_loader(), {"prune": {"config_list": [
            {"op_types": ["Conv2d"], "exclude_op_names": ["c1", "c2"], "sparse_ratio": 0.5}]}}, device="cpu")


@settings(max_examples=6, deadline=None)
@given(widths=st.lists(st.integers(2, 6), min_size=1, max_size=3), norms=st.lists(st.booleans(), min_size=3,
       max_size=3), frozen=st.lists(st.booleans(), min_size=3, max_size=3), classes=st.integers(2, 5))
def test_random_conv_stacks_keep_output_shape_and_frozen_flags(widths, norms, frozen, classes):
    torch.manual_seed(0)
    layers, channels = [], 1
    for i, width in enumerate(widths):
        layers += [nn.Conv2d(channels, width, 3, padding=1), *([nn.BatchNorm2d(width)] if norms[i] else []), nn.ReLU()]
        channels = width
    model = nn.Sequential(*layers, nn.Conv2d(channels, classes, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    for conv, freeze in zip(convs, frozen):
        conv.requires_grad_(not freeze)
    trainable = {n: p.requires_grad for n, p in model.named_parameters()}
    run = accel.accelerate(model, None, None, {"prune": {"dummy_input": torch.randn(4, 1, 8, 8)}}, device="cpu")
    assert run.model(torch.randn(2, 1, 8, 8)).shape == (2, classes)
    assert {n: p.requires_grad for n, p in run.model.named_parameters()} == trainable


def shuffled(own_generator, **kwargs):
    return tiny_loader(shuffle=True, generator=torch.Generator().manual_seed(5) if own_generator else None, **kwargs)


@pytest.mark.parametrize("options, loader_options", [
    ({}, {}), ({"warmup_steps": 2}, {}), ({"pruner": "taylor", "taylor_steps": 2}, {}),
    ({}, {"num_workers": 1, "persistent_workers": True})], ids=["l1", "warmup", "taylor", "persistent-workers"])
@pytest.mark.parametrize("own_generator", [True, False], ids=["loader-generator", "global-rng"])
def test_taking_batches_advances_neither_the_loader_nor_torch(own_generator, options, loader_options):
    model = tiny_model()
    optimizer = tiny_optimizer(model)
    torch.manual_seed(11)
    plain = [y.tolist() for _, y in shuffled(own_generator, **loader_options)]  # the plain loop's first epoch
    torch.manual_seed(11)
    loader = shuffled(own_generator, **loader_options)
    global_state = torch.get_rng_state()
    loader_state = loader.generator.get_state() if own_generator else None
    run = accel.accelerate(model, optimizer, loader, {"prune": options}, device="cpu")
    assert torch.equal(torch.get_rng_state(), global_state)
    if own_generator:
        assert torch.equal(loader.generator.get_state(), loader_state)
    assert [y.tolist() for _, y in run.loader] == plain


class DictBatches(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"image": torch.full((1, 8, 8), float(i)), "label": i % 10}


def test_batches_that_are_not_inputs_and_targets_are_refused_clearly():
    model = tiny_model()
    loader = DataLoader(DictBatches(), batch_size=4)
    with pytest.raises(PlanError, match=r"batches are a dict with keys \['image', 'label'\].*dummy_input=") as error:
        accel.accelerate(model, tiny_optimizer(model), loader, ["prune"], device="cpu")
    assert [p.field for p in error.value.problems] == ["dummy_input"]
    dummy = torch.randn(2, 1, 8, 8)
    run = accel.accelerate(model, tiny_optimizer(model), loader, {"prune": {"dummy_input": dummy}}, device="cpu")
    assert run.model.conv1.out_channels == 4
    for options, field in (({"warmup_steps": 2}, "warmup_steps"), ({"pruner": "taylor"}, "pruner")):
        with pytest.raises(PlanError, match=r"loss_fn\(model\(batch\[0\]\), batch\[1\]\).*a dict with keys") as error:
            accel.accelerate(model, tiny_optimizer(model), loader, {"prune": {"dummy_input": dummy, **options}},
                             device="cpu")
        assert [p.field for p in error.value.problems] == [field]


def test_tensors_trained_beside_the_model_stay_in_the_optimizer_and_warmup_leaves_them_alone():
    model = tiny_model()
    temperature = nn.Parameter(torch.ones(1))  # the user's own, trained beside the model

    def loss_fn(output, target):
        return nn.functional.cross_entropy(output / temperature, target)

    optimizer = torch.optim.Adam([{"params": model.parameters()}, {"params": [temperature], "lr": 0.1}], lr=0.01)
    run = accel.accelerate(model, optimizer, tiny_loader(), {"prune": {"warmup_steps": 3, "loss_fn": loss_fn}},
                           device="cpu")
    assert run.report.row("prune").status == "applied" and run.model.conv1.out_channels == 4
    groups = run.optimizer.param_groups
    assert [id(p) for p in groups[0]["params"]] == [id(p) for p in run.model.parameters()]
    assert len(groups[1]["params"]) == 1 and groups[1]["params"][0] is temperature and groups[1]["lr"] == 0.1
    assert torch.equal(temperature.detach(), torch.ones(1)) and temperature.grad is None  # warm-up trained a copy
    train_steps(run, loss_fn=loss_fn)
    assert not torch.equal(temperature.detach(), torch.ones(1))  # the run trains it, as the plain loop would


# --- checkpoints of plans holding a function and a tensor ------------------------------------------------------

def smoothed_cross_entropy(output, target):
    """A module-level loss: a checkpoint stores it by its import path."""
    return nn.functional.cross_entropy(output, target, label_smoothing=0.1)


def pruned_run(plan, seed=0):
    model = tiny_model(seed)
    return accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan, device="cpu")


def test_a_checkpoint_of_a_plan_with_loss_fn_and_dummy_input_loads(tmp_path):
    path = tmp_path / "ckpt.pt"
    plan = {"prune": {"warmup_steps": 1, "loss_fn": smoothed_cross_entropy,
                      "dummy_input": torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))}}
    run = pruned_run(plan)
    train_steps(run)
    run.save(path)
    restored = saved_plan(path).to_dict()["prune"]
    assert restored["loss_fn"] is smoothed_cross_entropy and torch.equal(restored["dummy_input"],
                                                                         plan["prune"]["dummy_input"])
    for again in (plan, saved_plan(path)):
        other = pruned_run(again, seed=1)
        other.load(path)
        for name, tensor in run.unwrap().state_dict().items():
            assert torch.equal(other.unwrap().state_dict()[name], tensor), name


def test_a_lambda_loss_fn_loads_with_the_same_plan_but_not_from_the_checkpoint_alone(tmp_path):
    path = tmp_path / "ckpt.pt"
    plan = {"prune": {"warmup_steps": 1, "loss_fn": lambda output, target: nn.functional.cross_entropy(output, target)}}
    run = pruned_run(plan)
    run.save(path)
    pruned_run(plan, seed=1).load(path)
    with pytest.raises(CheckpointError, match=r"prune.loss_fn was .*<lambda>, which cannot be imported"):
        saved_plan(path)


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional={
    "op_types": st.lists(st.sampled_from(["Conv2d", "Linear", "MaxPool2d"]), max_size=2),
    "op_names": st.lists(st.sampled_from(["conv1", "conv2", "fc1", "fc2", "pool"]), max_size=2),
    "op_names_re": st.lists(st.sampled_from(["conv", "fc.*", ".*1", "c"]), max_size=2),
    "exclude_op_names": st.lists(st.sampled_from(["conv1", "fc2"]), max_size=2),
    "exclude_op_types": st.lists(st.sampled_from(["Conv2d", "Linear"]), max_size=1),
    "exclude_op_names_re": st.lists(st.sampled_from(["conv2", ".*2"]), max_size=1)}))
def test_selection_follows_nni(config):
    from nni.compression.base.config import select_modules_by_config

    model = tiny_model()
    assert selected(config, model) == set(select_modules_by_config(model, config)[0])


class ImageAndMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(2, 8, 3, padding=1), nn.Linear(8 * 8 * 8, 10)

    def forward(self, image, mask):
        return self.fc(torch.relu(self.conv(torch.cat([image, mask], 1))).flatten(1))


def test_a_model_that_cannot_run_on_the_batches_first_item_is_refused_naming_dummy_input():
    model = ImageAndMask()
    with pytest.raises(PlanError, match=r"prune.dummy_input: the model cannot run on the first item of the loader's "
                                        r"batches \(TypeError: .*pass its inputs as dummy_input"):
        accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["prune"], device="cpu")
    dummy = (torch.randn(2, 1, 8, 8), torch.ones(2, 1, 8, 8))
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), {"prune": {"dummy_input": dummy}},
                           device="cpu")
    assert run.model.conv.out_channels == 4 and run.model(*dummy).shape == (2, 10)


# --- layers NNI would empty: ViT and ConvNeXt with fresh weights ---------------------------------------------------

def tiny_vit(torchvision):
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                hidden_dim=32, mlp_dim=64, num_classes=10)


def tiny_convnext(torchvision):
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)], num_classes=10)


def images32(samples=16, batch_size=8):
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(samples, 3, 32, 32, generator=generator),
                                    torch.randint(0, 10, (samples,), generator=generator)), batch_size=batch_size)


def refusal(model, plan):
    """The one problem a plan is refused with, checked to leave the model and optimizer untouched."""
    optimizer = tiny_optimizer(model)
    before = snapshot(model, optimizer)
    with pytest.raises(PlanError) as refused:
        accel.accelerate(model, optimizer, images32(), plan, device="cpu")
    [problem] = refused.value.problems
    assert snapshot(model, optimizer).changes(before) == []  # refused before anything was touched
    return problem


VIT_MLP = [{"op_names_re": [r"encoder\.layers\.encoder_layer_\d+\.mlp\.0"], "sparse_ratio": 0.5}]


def test_a_vit_whose_head_starts_at_zero_is_refused_naming_the_layers_nni_would_empty():
    """torchvision zero-initializes a ViT's head: NNI's mask inference takes an output that is the same for every
    input for pruned, so the whole output, and going back, the last encoder layer and the head would lose every
    channel."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    problem = refusal(tiny_vit(torchvision), {"prune": {"config_list": VIT_MLP}})
    assert (problem.accelerator, problem.field) == ("prune", "config_list")
    text = str(problem)
    assert text.startswith("prune.config_list: pruning would leave layer 'encoder.layers.encoder_layer_1.ln_2' "
                           "(LayerNorm) with no input channel (0 of 32 kept)")
    assert "'heads.head'" in text and "weight is all zero" in text and "the model's whole output" in text
    assert "warmup_steps" in problem.allowed


def test_the_same_vit_with_a_head_that_varies_prunes_its_mlps():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = tiny_vit(torchvision)
    nn.init.normal_(model.heads.head.weight, std=0.02)  # as trained (or pretrained) weights would be
    run = accel.accelerate(model, tiny_optimizer(model), images32(), {"prune": {"config_list": VIT_MLP}},
                           device="cpu")
    changed = run.report.row("prune").changes["layers_changed"]
    assert changed["encoder.layers.encoder_layer_0.mlp.0"] == "weight (64, 32) -> (32, 32)"
    assert changed["encoder.layers.encoder_layer_1.mlp.3"] == "weight (32, 64) -> (32, 32)"


def test_a_convnext_is_refused_naming_its_stem_and_the_constant_tensors_that_empty_it():
    """ConvNeXt's LayerNorm2d gives its weight (ones) and bias (zeros) to F.layer_norm and its blocks multiply by a
    layer_scale (1e-6 everywhere): NNI takes such tensors (16 values, a multiple of its batch of 8) for batches of
    identical samples, so for pruned, and spreads that back from the output to the stem: NNI's own error,
    "Pruning a Layer to empty is not legal", named no layer."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    problem = refusal(tiny_convnext(torchvision), ["prune"])
    text = str(problem)
    assert text.startswith("prune.config_list: pruning would leave layer 'features.0.0' (Conv2d) with no input "
                           "channel (0 of 3 kept) and no output channel (0 of 8 kept)")
    for cause in ("'features.3.0.layer_scale' (1e-06 everywhere)", "'classifier.0.weight' (1 everywhere)",
                  "'classifier.0.bias' (0 everywhere)"):
        assert cause in text


def test_when_warmup_leaves_the_weights_as_they_were_applying_names_the_layer_and_rolls_back():
    """Warm-up steps train before pruning, so the check cannot know the weights NNI will see: apply() names the
    layer instead of NNI's EmptyLayerError (here the steps change nothing: lr=0)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = tiny_convnext(torchvision)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    before = snapshot(model, optimizer)
    with pytest.raises(AccelerateError, match=r"ValueError: pruning would leave layer 'features\.0\.0' \(Conv2d\) "
                                              r"with no input channel .* 'classifier\.0\.weight' \(1 everywhere\)"):
        accel.accelerate(model, optimizer, images32(), {"prune": {"warmup_steps": 1}}, device="cpu")
    assert snapshot(model, optimizer).changes(before) == []


@pytest.mark.skipif(torch_version() < (2, 9),
                    reason="on torch 2.8 NNI fails earlier, in a reshape, before the depthwise groups are reached")
def test_a_depthwise_convolution_whose_groups_would_lose_their_channels_apart_is_named():
    """With weights that vary (as trained), ConvNeXt's depthwise convolutions, selected by op_types Conv2d, get their
    input channels from the stem's mask and their output channels from their own: NNI's UnBalancedGroupError (or
    EmptyLayerError) named no layer. Excluding them prunes."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = tiny_convnext(torchvision)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() <= 1 or "layer_scale" in name:
                param.uniform_(0.5, 1.5)
    optimizer = tiny_optimizer(model)
    before = snapshot(model, optimizer)
    with pytest.raises(AccelerateError, match=r"ValueError: pruning would leave layer 'features\.1\.0\.block\.0' "
                                              r"\(Conv2d, groups=8\) with group \d+ keeping 1 input and 0 output "
                                              r"channels .*exclude_op_names=\['features\.1\.0\.block\.0'"):
        accel.accelerate(model, optimizer, images32(), ["prune"], device="cpu")
    assert snapshot(model, optimizer).changes(before) == []
    depthwise = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    run = accel.accelerate(model, optimizer, images32(), {"prune": {"config_list": [
        {"op_types": ["Conv2d"], "sparse_ratio": 0.5, "exclude_op_names": depthwise}]}}, device="cpu")
    assert run.report.row("prune").status == "applied"


# --- issue 41: reparametrized layers, in words, before anything changes -----------------------------------------

class SNDiscriminator(nn.Module):
    """A GAN discriminator whose convolutions are normalized (SNGAN's spectral_norm, or weight_norm), in torch's
    parametrization form or the older forward pre-hook form."""

    def __init__(self, norm):
        super().__init__()
        self.c1, self.c2 = norm(nn.Conv2d(1, 16, 3, padding=1)), norm(nn.Conv2d(16, 16, 3, padding=1))
        self.c3, self.head = norm(nn.Conv2d(16, 16, 3, padding=1)), nn.Linear(16, 10)

    def forward(self, x):
        x = nn.functional.leaky_relu(self.c2(nn.functional.leaky_relu(self.c1(x), 0.1)), 0.1)
        return self.head(self.c3(x).mean((2, 3)))


@pytest.mark.parametrize("norm", ["parametrizations.spectral_norm", "parametrizations.weight_norm", "spectral_norm",
                                  "weight_norm"])
def test_layers_whose_weight_is_computed_are_refused_in_words_a_user_understands(norm):
    """Before: parametrized convolutions were 'no module of type ['Conv2d']' (each is a ParametrizedConv2d); the older
    spectral_norm failed inside NNI after the copy was pruned ("Conv2d has no attribute `weight_orig`"); the older
    weight_norm raised a plain RuntimeError from copy.deepcopy."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.nn.utils.weight_norm is deprecated
        model = SNDiscriminator(eval(f"nn.utils.{norm}"))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(PlanError) as refused:
        accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), ["prune"], device="cpu")
    text = str(refused.value)
    if norm == "weight_norm":  # its weight is a tensor computed in forward, which copy.deepcopy refuses
        assert "copy.deepcopy cannot copy it" in text, text
    else:
        assert "computed from other tensors" in text and "remove_parametrizations" in text, text
    if norm.startswith("parametrizations"):
        assert "are parametrized (ParametrizedConv2d" in text and "exact class name" in text, text
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_a_model_nni_cannot_carry_masks_through_fails_in_words_and_is_rolled_back():
    """DCGAN's discriminator (LeakyReLU(inplace=True) after each convolution, the output .view(-1, 1).squeeze(1))."""
    from corpus.examples_dcgan import Discriminator

    model = Discriminator(0)
    loader = DataLoader(TensorDataset(torch.randn(8, 1, 64, 64), torch.zeros(8)), batch_size=4)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(AccelerateError, match="NNI's ModelSpeedup could not carry the masks through this model"):
        accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, ["prune"], device="cpu")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
