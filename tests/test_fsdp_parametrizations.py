"""fsdp with amp on models whose weights come from torch's parametrizations (spectral_norm, weight_norm, orthogonal,
one of the user's own): the same training as amp alone, their parameters kept float32 as amp keeps them. Before,
FSDP2 handed spectral_norm's power iteration a bfloat16 weight beside its float32 vectors, and the first forward
raised ("addmv input tensors must have the same dtype"); a precompiled model raising there left torch's autograd
switch off for the rest of the process, so the next plain training failed in backward. And a fully_shard that fails
partway (a parametrized block sharded twice did) gives back what it sharded before."""
import pytest
import torch
from scripts.launching import one_rank_env
from torch import nn
from torch.nn.utils import parametrizations, parametrize
from zoo import Case, Net, Residual

import accel
from accel.testing import check_equivalence

AMP = {"amp": {"dtype": "bfloat16"}}  # forced: this CPU may emulate it, the training is the same


@pytest.fixture
def one_rank_group(monkeypatch):
    """A real gloo process group of one rank, as `torchrun --nproc-per-node 1` gives (joined, not ended, by runs)."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


class Positive(nn.Module):
    """A parametrization of the user's own: the tensor the module uses is |original| + 0.5."""

    def forward(self, original):
        return original.abs() + 0.5


def gained(module: nn.Module, shape: tuple[int, ...]) -> nn.Module:
    """The module with a parametrized gain of its own multiplying its output: a parametrization on a block or on
    the root, not on a leaf."""
    module.gain = nn.Parameter(torch.ones(shape))
    parametrize.register_parametrization(module, "gain", Positive())
    module.register_forward_hook(lambda mod, args, out: out * mod.gain)
    return module


def spectral_weight_norm_orthogonal(net: Net) -> None:
    parametrizations.spectral_norm(net.conv2)  # power iteration on float32 buffers in every training forward
    parametrizations.weight_norm(net.conv1)
    parametrizations.orthogonal(net.fc)


def gained_blocks_and_root(net: Net) -> None:
    net.blocks = nn.Sequential(*[gained(Residual(8), (8, 1, 1)) for _ in range(2)])
    gained(net, (10,))


def parametrized(change, model=Net, **net):
    """The zoo's digits training, over a Net changed by `change` before its optimizer is built."""
    def build():
        setup = Case().build()
        torch.manual_seed(0)
        setup.model = model(**net)
        change(setup.model)
        setup.optimizer = torch.optim.SGD(setup.model.parameters(), lr=0.05)
        return setup
    return build


@pytest.mark.parametrize("change, fsdp", [
    (spectral_weight_norm_orthogonal, {}),
    (gained_blocks_and_root, {"blocks": ["ParametrizedResidual"]}),  # parametrize renames the class it changes
])
def test_fsdp_with_amp_trains_parametrized_weights_as_amp_alone(one_rank_group, change, fsdp):
    result = check_equivalence([{"fsdp": fsdp}, AMP], parametrized(change), steps=3)
    assert result.ok and result.applied == ["amp", "fsdp"], result


def test_the_report_names_the_modules_kept_float32(one_rank_group):
    setup = parametrized(spectral_weight_norm_orthogonal, batchnorm=True)()
    run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan=[{"fsdp": {}}, AMP], device="cpu")
    assert run.report.row("fsdp").changes["float32"].startswith("conv1, norm, conv2, fc sharded with float32")
    run.close()


class Centers(nn.Module):
    """center loss's class centers, moved toward each class's features under no_grad in every training forward."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 16)
        self.register_buffer("centers", torch.zeros(10, 16))

    @torch.no_grad()
    def update(self, features, labels):
        self.centers.index_add_(0, labels, 0.1 * (features - self.centers[labels]))

    def forward(self, images, labels):
        features = self.body(images.flatten(1))
        self.update(features, labels)
        return (features - self.centers[labels]).pow(2).sum(1).mean()


@pytest.mark.parametrize("plan", [[], [AMP]])
def test_a_compiled_forward_that_raises_under_no_grad_leaves_autograd_on(plan):
    """dynamo leaves the autograd switch off when its graph raises inside a no_grad region (eager puts it back):
    run.autocast() puts it back as it was, as the eager forward would have."""
    model = torch.compile(Centers(), backend="eager")
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None, plan=plan, device="cpu")
    with pytest.raises(IndexError), run.autocast():  # a label out of range: the user's mistake, at run time
        run.model(torch.randn(4, 1, 8, 8), torch.tensor([1, 2, 10, 3]))
    assert torch.is_grad_enabled()
    with run.autocast():
        loss = run.model(torch.randn(4, 1, 8, 8), torch.tensor([1, 2, 9, 3]))
    run.backward(loss)
    run.close()


class Stack(nn.Module):
    """Layers held in a ModuleList, which has no forward of its own, and a head."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(64, 64) for _ in range(2)])
        self.head = nn.Linear(64, 10)

    def forward(self, images):
        x = images.flatten(1)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def test_a_fully_shard_that_fails_gives_back_the_modules_sharded_before_it(one_rank_group):
    """FSDP2 refuses a ModuleList (no forward) after the head was sharded: before, the head kept FSDP's class, hooks
    and DTensor parameters while the failure said every change was rolled back."""
    result = check_equivalence([{"fsdp": {"blocks": ["ModuleList", "Linear"]}}],
                               parametrized(lambda _: None, model=Stack), steps=2)
    assert "fully_shard does not support containers" in result.failed and not result.objects_changed, result


def tie_two_blocks(net: Net) -> None:
    net.blocks[1].conv.weight = net.blocks[0].conv.weight  # one weight in two blocks (ALBERT-style sharing)


def tie_block_to_head(net: Net) -> None:
    net.blocks[0].norm.weight = net.norm.weight  # a block's parameter tied to one outside every block


@pytest.mark.parametrize("change", [tie_two_blocks, tie_block_to_head])
def test_blocks_with_a_tied_parameter_are_left_to_the_roots_group(one_rank_group, change):
    """FSDP2 raised at the first forward ("shared with a parameter already managed by another FSDP group"), mid
    training: a block with a parameter also held outside it is sharded with the root instead, and the row says so."""
    build = parametrized(change, blocks=2, batchnorm=True)
    result = check_equivalence(["fsdp"], build, steps=3)
    assert result.ok and result.applied == ["fsdp"], result
    setup = build()
    run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan=["fsdp"], device="cpu")
    assert "left to the root's group" in run.report.row("fsdp").changes["tied"], run.report
    run.close()
