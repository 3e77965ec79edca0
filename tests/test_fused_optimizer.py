"""fused_optimizer and accel.optim.rebuild_optimizer: same hyperparameters, same state, same updates."""
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import accel
from accel.accelerators.fused_optimizer import FusedOptimizer
from accel.errors import PlanError
from accel.optim import rebuild_optimizer
from accel.testing import apply_one, tiny_loader, tiny_model

OPTIMIZERS = {
    "Adam": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=1e-3, amsgrad=True),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01),
}


def steps(model, optimizer, n=2, seed=0):
    for x, y in list(tiny_loader(seed=seed))[:n]:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_keeps_hyperparameters_state_and_updates(name):
    model = tiny_model()
    optimizer = OPTIMIZERS[name](model.parameters())
    steps(model, optimizer)  # build some state to carry over
    reference_model, reference = copy.deepcopy((model, optimizer))  # the same state, unfused

    applied = apply_one(FusedOptimizer(), model=model, optimizer=optimizer)
    assert applied.row.status == "applied", applied.row.reason
    fused = applied.run.optimizer
    assert fused is optimizer and fused.defaults["fused"] is True  # your optimizer, stepping fused: it stays live
    for old, new in zip(reference.param_groups, fused.param_groups):
        assert {k: v for k, v in old.items() if k not in ("params", "fused", "foreach")} == \
               {k: v for k, v in new.items() if k not in ("params", "fused", "foreach")}
    for p, q in zip(model.parameters(), reference_model.parameters()):  # state kept, tensor for tensor
        for key, value in reference.state[q].items():
            assert torch.equal(torch.as_tensor(fused.state[p][key]).float(), torch.as_tensor(value).float()), key
    # the next update equals the unfused one
    steps(model, fused, n=1, seed=1)
    steps(reference_model, reference, n=1, seed=1)
    for a, b in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    applied.run.close()
    assert optimizer.defaults["fused"] is None and all(g["fused"] is None for g in optimizer.param_groups)


def test_unsupported_or_already_fused_is_skipped_with_the_reason():
    model = tiny_model()
    row = apply_one(FusedOptimizer(), model=model,
                    optimizer=torch.optim.RMSprop(model.parameters())).row
    assert row.status == "skipped" and "RMSprop has no fused implementation" in row.reason
    row = apply_one(FusedOptimizer(), model=model,
                    optimizer=torch.optim.Adam(model.parameters(), fused=True)).row
    assert row.status == "skipped" and "already fused" in row.reason
    meta = torch.nn.Parameter(torch.empty(3, device="meta"))  # a device with no fused kernels
    row = apply_one(FusedOptimizer(), model=model,
                    optimizer=torch.optim.SGD([*model.parameters(), meta], lr=0.1)).row
    assert row.status == "skipped" and "meta" in row.reason


def test_foreach_true_is_replaced():
    model = tiny_model()
    applied = apply_one(FusedOptimizer(), model=model,
                        optimizer=torch.optim.AdamW(model.parameters(), foreach=True))
    assert applied.row.status == "applied" and applied.run.optimizer.defaults["foreach"] is None
    # the run keeps your own values (each group's, then the defaults'): what close() and your saves put back
    assert applied.run.state("fused_optimizer").user_settings == [{"fused": None, "foreach": True}] * 2
    accel.testing.train_steps(applied.run)
    assert applied.run.optimizer.state_dict()["param_groups"][0]["foreach"] is True  # what you save: yours
    applied.run.close()
    assert applied.run.optimizer.defaults["foreach"] is True


def test_conflicts_with_ipex_and_needs_an_optimizer():
    model = tiny_model()
    with pytest.raises(PlanError, match=r"conflicts with (ipex|fused_optimizer) \('optimizer.update'\)"):
        accel.accelerate(model, torch.optim.Adam(model.parameters()), tiny_loader(), ["ipex", "fused_optimizer"],
                         device="cpu")
    with pytest.raises(PlanError, match="needs the optimizer"):
        accel.accelerate(model, None, tiny_loader(), ["fused_optimizer"], device="cpu")


@settings(max_examples=25, deadline=None)
@given(lrs=st.lists(st.floats(1e-5, 1.0), min_size=1, max_size=3), decay=st.floats(0, 0.1),
       beta1=st.floats(0.5, 0.99), keep_state=st.booleans())
def test_rebuild_keeps_every_group(lrs, decay, beta1, keep_state):
    model = tiny_model()
    params = list(model.parameters())
    groups = [{"params": params[i::len(lrs)], "lr": lr} for i, lr in enumerate(lrs)]
    optimizer = torch.optim.Adam(groups, weight_decay=decay, betas=(beta1, 0.999))
    steps(model, optimizer, n=1)
    new = rebuild_optimizer(optimizer, keep_state=keep_state, fused=True)
    assert [g["lr"] for g in new.param_groups] == lrs
    assert all(g["weight_decay"] == decay and g["betas"] == (beta1, 0.999) and g["fused"] for g in new.param_groups)
    assert [[id(p) for p in g["params"]] for g in new.param_groups] == \
           [[id(p) for p in g["params"]] for g in optimizer.param_groups]
    assert bool(new.state) == keep_state


class OwnSparseLookup(torch.nn.Module):
    """A table looked up with F.embedding(sparse=True) in its own forward (no nn.Embedding to see): sparse
    gradients only the step itself can find."""

    def __init__(self, sparse_module: bool = False):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(10, 4, mode="sum", sparse=True) if sparse_module else None
        self.table = torch.nn.Parameter(torch.randn(10, 4))
        self.head = torch.nn.Linear(4, 1)

    def forward(self, ids):
        pooled = torch.nn.functional.embedding(ids, self.table, sparse=True).sum(1)
        return self.head(pooled + (self.bag(ids) if self.bag is not None else 0))


@pytest.mark.parametrize("kind", ["SGD", "Adagrad"])
def test_a_model_whose_modules_give_sparse_gradients_is_skipped_with_the_reason(kind):
    torch.manual_seed(0)
    model = OwnSparseLookup(sparse_module=True)
    optimizer = getattr(torch.optim, kind)(model.parameters(), lr=0.1)
    assert FusedOptimizer.candidates(None, model, optimizer) == []
    row = apply_one(FusedOptimizer(), model=model, optimizer=optimizer).row
    assert row.status == "skipped" and "sparse gradients from bag" in row.reason, row.reason
    frozen = OwnSparseLookup(sparse_module=True)  # a sparse table the optimizer does not step: fused as ever
    assert FusedOptimizer.candidates(None, frozen, torch.optim.SGD(frozen.head.parameters(), lr=0.1)) == [{}]


@pytest.mark.parametrize("kind", ["SGD", "Adagrad"])
def test_sparse_gradients_from_your_own_code_step_unfused_that_step_as_the_plain_loop(kind):
    torch.manual_seed(0)
    model = OwnSparseLookup()
    reference = copy.deepcopy(model)

    def optimizer_of(m):  # the table in a group of its own: the head's group stays fused
        return getattr(torch.optim, kind)([{"params": [m.table]}, {"params": m.head.parameters()}], lr=0.1)

    plain = optimizer_of(reference)
    batches = [(torch.randint(0, 10, (4, 3)), torch.randn(4, 1)) for _ in range(3)]
    run = accel.accelerate(model, optimizer_of(model), batches, plan=["fused_optimizer"], device="cpu")
    assert run.report.row("fused_optimizer").status == "applied"
    try:
        for ids, target in batches:
            run.backward(torch.nn.functional.mse_loss(run.model(ids), target))
            run.step()
            plain.zero_grad()
            torch.nn.functional.mse_loss(reference(ids), target).backward()
            plain.step()
        assert [g["fused"] for g in run.optimizer.param_groups] == [True, True]  # unfused for the step alone
    finally:
        run.close()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
