"""activation_checkpointing, attacked from outside (issue 41): the recomputation must see what the first pass saw
when the batch changes without torch knowing, when a hook inside a block would run again, and when a block keeps
state outside its buffers (a counter, a tensor, its own generator, a list). Each failed before the fix."""
import random
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import accel


class Block(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.norm, self.lin = nn.LayerNorm(width), nn.Linear(width, width)

    def residual(self, x):
        return torch.tanh(self.lin(self.norm(x)))

    def forward(self, x):
        return x + self.residual(x)


class Counting(Block):
    """Its own warm-up: the residual branch fades in over its first forwards, counted in a Python attribute."""

    def forward(self, x):
        self.calls = getattr(self, "calls", 0) + 1
        return x + min(1.0, self.calls / 4) * self.residual(x)


class RunningCenter(Block):
    """A running mean kept as a plain tensor attribute (not a registered buffer), updated in training forwards."""

    def __init__(self):
        super().__init__()
        self.center = torch.zeros(8)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.center.mul_(0.9).add_(0.1 * x.mean(0))
        return x + self.residual(x - self.center)


class OwnNoise(Block):
    """Multiplicative noise from a generator of its own (torch's), and a jitter from Python's random.Random."""

    def __init__(self):
        super().__init__()
        self.generator, self.jitter = torch.Generator().manual_seed(1), random.Random(2)

    def forward(self, x):
        noise = 1 + 0.1 * torch.randn(x.shape, generator=self.generator)
        return x + self.jitter.uniform(0.5, 1.5) * self.residual(x) * noise


class Memory(Block):
    """A memory of the last batches' mean, kept as a list it appends to (a custom cache), read in the same pass."""

    def __init__(self):
        super().__init__()
        self.memory = []

    def forward(self, x):
        self.memory = self.memory[-2:]
        self.memory.append(x.detach().mean(0))
        return x + self.residual(x - torch.stack(self.memory).mean(0))


class Net(nn.Module):
    def __init__(self, block=Block):
        super().__init__()
        self.blocks, self.head = nn.ModuleList([block(), block()]), nn.Linear(8, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).squeeze(-1)


def batches(steps: int):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(4, 8, generator=generator) for _ in range(steps)]


def simple(run, model, steps):
    losses = []
    for x in batches(steps):
        loss = run.model(x).square().mean()
        run.backward(loss)
        run.step()
        losses.append(loss.item())
    return losses


def train(plan, loop, block=Block, steps: int = 3):
    """The loop's losses, the trained state and what was said (warnings), with the plan."""
    torch.manual_seed(0)
    model = Net(block)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None, plan, device="cpu")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        losses = loop(run, model, steps)
    rows = run.report.row("activation_checkpointing") if plan else None
    run.close()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return losses, state, [str(w.message) for w in said], rows


def assert_trains_as_plain(loop, block=Block, plan=("activation_checkpointing",)):
    plain_losses, plain_state, _, _ = train([], loop, block)
    losses, state, said, row = train(list(plan), loop, block)
    assert row.status == "applied", row
    assert losses == plain_losses
    assert all(torch.equal(plain_state[k], state[k]) for k in plain_state), \
        [k for k in plain_state if not torch.equal(plain_state[k], state[k])]
    return said


def test_a_batch_refilled_in_place_without_torch_knowing_is_recomputed_with_its_new_values():
    """A zero-copy buffer (an RL replay buffer, a shared-memory ring): one tensor over a numpy array that the loop
    refills each step, or a kept tensor refilled through .data; neither bumps torch's version counter. Before: the
    recomputation read the copy taken at the first step (cached by tensor and version) and trained on stale data."""
    def numpy_buffer(run, model, steps):
        buffer = np.zeros((4, 8), dtype=np.float32)
        x, losses = torch.from_numpy(buffer), []
        for batch in batches(steps):
            buffer[:] = batch.numpy()
            loss = run.model(x).square().mean()
            run.backward(loss)
            run.step()
            losses.append(loss.item())
        return losses

    def data_refill(run, model, steps):
        x, losses = torch.zeros(4, 8), []
        for batch in batches(steps):
            x.data.copy_(batch)
            loss = run.model(x).square().mean()
            run.backward(loss)
            run.step()
            losses.append(loss.item())
        return losses

    assert_trains_as_plain(numpy_buffer)
    assert_trains_as_plain(data_refill)


def features_penalty(run, model, steps):
    """Features collected by a forward hook on a layer inside a block for a regulariser, cleared once used (before
    backward): a recomputation in backward would run the hook again and leave its features for the next step."""
    features, losses = [], []
    handle = model.blocks[0].lin.register_forward_hook(lambda module, args, output: features.append(output))
    for x in batches(steps):
        loss = run.model(x).square().mean() + 0.1 * sum(f.square().mean() for f in features)
        features.clear()
        run.backward(loss)
        run.step()
        losses.append(loss.item())
    handle.remove()
    return losses


def test_a_hook_on_a_layer_inside_a_block_runs_once_and_the_block_runs_without_checkpointing_said():
    """Before: the hook ran again in backward, the next step's loss held a stale feature, and training differed."""
    said = assert_trains_as_plain(features_penalty)
    assert any("hook" in s and "without checkpointing" in s for s in said), said


def test_channels_last_hooks_inside_blocks_are_recomputed_and_the_blocks_still_checkpointed():
    """channels_last's pre-hooks compute only from their input: a recomputation may run them again."""
    class ConvBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

        def forward(self, x):
            return x + torch.relu(self.norm(self.conv(x)))

    torch.manual_seed(0)
    model = nn.Sequential(ConvBlock(), ConvBlock(), nn.Flatten(), nn.Linear(64, 1))
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None,
                           ["channels_last", "activation_checkpointing"], device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs without checkpointing"
        run.backward(run.model(torch.randn(2, 4, 4, 4)).square().mean())
    run.step()
    run.close()
    assert "2 x ConvBlock" in str(run.report)


@pytest.mark.parametrize("block", [Counting, RunningCenter, OwnNoise, Memory], ids=lambda b: b.__name__)
def test_state_a_block_keeps_outside_its_buffers_is_recomputed_as_the_first_pass_saw_it(block):
    """Chosen by "auto" as the repeated block. Before: the recomputation counted a call more, read the running mean
    its own forward had updated, drew the next numbers of the block's generators, read a longer list."""
    assert_trains_as_plain(simple, block)


class SpectralBlock(Block):
    """torch.nn.utils.spectral_norm, the hook-based one: its pre-hook recomputes the weight from weight_orig and the
    power-iteration vectors (buffers it updates in training)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.utils.spectral_norm(self.lin)


def test_torch_weight_hooks_inside_a_block_are_recomputed_and_the_block_still_checkpointed():
    said = assert_trains_as_plain(simple, SpectralBlock)
    assert not any("without checkpointing" in s for s in said), said


class GCNLayer(nn.Module):
    """A graph convolution as a GNN tutorial writes it: a linear map, then the sparse adjacency's product."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x, adj):
        return torch.relu(torch.sparse.mm(adj, self.linear(x)))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_graph_layers_handed_a_sparse_adjacency_are_recomputed_from_it(layout):
    """Before: a CSR adjacency (torch_geometric's to_torch_csr_tensor) raised 'Sparse CSR tensors do not have
    strides' from accel's copy of it, in the first training step."""
    generator = torch.Generator().manual_seed(0)
    edges = torch.randint(0, 10, (2, 30), generator=generator)
    adj = torch.sparse_coo_tensor(edges, torch.rand(30, generator=generator), (10, 10)).coalesce()
    adj = adj if layout == "coo" else adj.to_sparse_csr()
    x, y = torch.randn(10, 8, generator=generator), torch.randint(0, 3, (10,), generator=generator)

    def trained(plan):
        torch.manual_seed(0)
        layers = nn.ModuleList([GCNLayer(), GCNLayer()])
        run = accel.accelerate(layers, torch.optim.Adam(layers.parameters(), lr=0.01), None, plan, device="cpu")
        for _ in range(2):
            h = x
            for layer in run.model:
                h = layer(h, adj)
            run.backward(nn.functional.cross_entropy(h[:, :3], y))
            run.step()
        run.close()
        assert plan == [] or run.report.row("activation_checkpointing").status == "applied"
        return [p.detach().clone() for p in layers.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(trained([]), trained(["activation_checkpointing"])))
