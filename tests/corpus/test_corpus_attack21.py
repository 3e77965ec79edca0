"""Attack 21: upstream loops that stress other parts of PyTorch, ported from their sources and run plainly and through
accel: DLRM (``nn.EmbeddingBag(sparse=True)``: sparse gradients, SGD or Adagrad), WGAN-GP (a gradient penalty:
``autograd.grad(create_graph=True)``), torch.optim's SWA and EMA (AveragedModel, SWALR, update_bn over run.loader),
quantization-aware training (prepare_qat, observers, freeze_bn_stats, convert each epoch), torch.nn.utils.prune
(weight_orig and a forward pre-hook, pruned again mid-run), MAML with torch.func (functional_call under grad and
vmap), forward-forward (a run per layer, ``Layer.train`` overriding nn.Module.train) and a GCN (sparse features and
adjacency in the batch). Each port is held to the cards by accel.testing.check_equivalence where it fits the harness,
else against its plain loop directly; what breaks the promise is a strict xfail naming the cause."""
from __future__ import annotations

import importlib
import warnings

import pytest
import torch

import accel
from accel.errors import LoopError
from accel.testing import check_equivalence
from corpus import test_corpus as corpus

PORTS = {  # port: (steps, the plans it runs: None for all of test_corpus's and the stack)
    "dlrm_train": (3, None),
    "gan_wgan_gp": (3, None),
    "optim_swa": (3, None),  # the loader's epoch: SWALR and update_parameters past swa_start, then update_bn
    "torch_prune": (4, None),
    "quantization_qat": (3, ("channels_last", "fused_optimizer", "activation_checkpointing", "compile")),
    "functorch_maml": (2, ("channels_last", "fused_optimizer", "compile")),  # (seconds a step under vmap and grad)
}
SLOW_PORTS = ("quantization_qat", "functorch_maml")  # seconds a step: fake quantization; vmap over grad
LEAVES_OUT = {  # beyond the plan without accel too: plain torch.autocast(bfloat16) fails the same loop the same way
    ("quantization_qat", "amp"): "torch.fused_moving_avg_obs_fake_quant has no bfloat16 kernel",
    ("functorch_maml", "amp"): "autocast under torch.func.grad: 'expected scalar type BFloat16 but found Float'",
    ("gan_wgan_gp", "compile"): "a double backward under compile is an accel.LoopError by design (test below)",
    ("optim_swa", "prune"): "prune trains a pruned copy (named stale, a StaleWarning: 'use run.unwrap() for EMA'); "
    "the docs' AveragedModel, built before the loop, keeps the unpruned shapes and cannot average it",
}
KNOWN: dict = {}


def plans_of(port: str) -> list:
    only = PORTS[port][1]
    return [p for p in [*corpus.PLANS, "stack"] if only is None or p in only]


def cases():
    for port in PORTS:
        for plan in plans_of(port):
            marks = [pytest.mark.slow] if plan in corpus.SLOW or port in SLOW_PORTS else []
            if (port, plan) in KNOWN:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[port, plan]))
            yield pytest.param(port, plan, marks=marks, id=f"{port}-{plan}")


@pytest.mark.parametrize("port, plan", list(cases()))
def test_these_loops_train_as_upstream_through_every_plan_they_admit(port, plan):
    if (port, plan) in LEAVES_OUT or (plan == "stack" and (port, "amp") in LEAVES_OUT):
        pytest.skip(f"{port}: {LEAVES_OUT.get((port, plan)) or LEAVES_OUT[port, 'amp']}")
    module = importlib.import_module(f"corpus.{port}")
    if plan == "compile":
        torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_equivalence(corpus.stack_of(module) if plan == "stack" else corpus.plan_of(plan, module),
                                   module.build, steps=PORTS[port][0])
    if result.refused:
        names = [p.split(":")[0].strip(" -").split(".")[0] for p in result.refused.splitlines()[1:]]
        allowed = [reason for name in names for reason in (*module.REFUSES.get(name, ()),
                                                            *(corpus.PRUNE_REFUSES if name == "prune" else ()))]
        assert names and all(any(r in line for r in allowed) for line in result.refused.splitlines()[1:]), result
    assert result.failed is None, result
    assert not result.objects_changed and not result.process_changed, result
    assert not result.differences, result


def test_dlrm_with_adagrad_trains_through_fused_optimizer():
    module = importlib.import_module("corpus.dlrm_train")
    result = check_equivalence([{"fused_optimizer": {}}], module.build_adagrad, steps=2)
    assert result.ok, result


def test_plan_auto_trains_dlrm_as_its_plain_loop():
    module = importlib.import_module("corpus.dlrm_train")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_equivalence(accel.Auto(cache=False, budget_s=10), module.build, steps=6)
    assert result.failed is None and not result.objects_changed and not result.differences, result


@pytest.mark.slow
@pytest.mark.parametrize("port", ["gan_wgan_gp", "torch_prune", "optim_swa"])
def test_plan_auto_trains_these_loops_as_upstream(port):
    module = importlib.import_module(f"corpus.{port}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_equivalence(accel.Auto(cache=False, budget_s=10), module.build, steps=12)
    assert result.failed is None and result.refused is None, result
    assert not result.objects_changed and not result.process_changed, result
    assert not result.differences, result


@pytest.mark.slow
def test_a_gradient_penalty_under_compile_is_said_and_leaves_the_weights_as_they_were():
    from corpus import gan_wgan_gp

    torch._dynamo.reset()
    setup = gan_wgan_gp.build()
    setup.loop.prepare(setup.held())
    before = {k: v.clone() for k, v in setup.model.state_dict().items()}
    run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan=[{"compile": {"backend": "aot_eager"}}])
    setup.loop.start(setup.held(), run)
    try:
        with pytest.raises(LoopError, match="create_graph=True"):
            setup.loop.step(0, run, setup.held(), next(iter(run.loader)), None)
        assert all(torch.equal(before[k], v) for k, v in setup.model.state_dict().items())
    finally:
        run.close()
        setup.loop.finish()


def test_swa_as_the_docs_write_it_names_no_stale_object_and_leaves_the_user_model_averaged():
    """update_parameters(model) on the user's model under channels_last and fused_optimizer: the averaged copy is
    the plain loop's (held by the harness above); here, nothing is named stale and the run says nothing."""
    from corpus import optim_swa

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = check_equivalence(["channels_last", "fused_optimizer"], optim_swa.build_ema, steps=3)
    assert result.ok and not result.stale, result
    assert not [w for w in caught if type(w.message).__name__ in ("StaleWarning", "BypassWarning")]


FF_PLANS = {"threads": ["threads"], "fused_optimizer": ["fused_optimizer"], "compile": [{"compile": {
    "backend": "aot_eager"}}], "grad_clipping": [{"grad_clipping": {"max_norm": 1.0}}], "loader": [{"loader": {
        "num_workers": 1}}], "amp": [{"amp": {"dtype": "bfloat16"}}], "auto": "auto"}


def within_card(plan: str, plain: torch.Tensor, other: torch.Tensor) -> bool:
    if plan == "amp":  # tolerance: the model within a relative distance of 40%
        return float((plain - other).norm() / plain.norm().clamp_min(1e-12)) < 0.4
    return torch.allclose(plain, other, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("plan", list(FF_PLANS))
def test_forward_forward_trains_each_layer_through_its_own_run_as_upstream(plan):
    from corpus import examples_forward_forward as ff

    if plan == "compile":
        torch._dynamo.reset()
    net, losses, _, predicted = ff.train_ff(None)
    chosen = accel.Auto(cache=False, budget_s=5) if plan == "auto" else FF_PLANS[plan]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net_run, losses_run, reports, predicted_run = ff.train_ff(chosen)
    assert all(r.rows == [] or any(row.status == "applied" for row in r.rows) for r in reports)
    for layer, layer_run in zip(net.layers, net_run.layers):
        assert within_card(plan, layer.weight.detach(), layer_run.weight.detach()), plan
    if plan != "amp":
        assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in zip(losses, losses_run))
        assert torch.equal(predicted, predicted_run)


@pytest.mark.parametrize("plan", list(FF_PLANS))
def test_gcn_with_sparse_features_and_adjacency_in_the_batch_trains_as_upstream(plan):
    from corpus import examples_gcn

    if plan == "compile":
        torch._dynamo.reset()
    state, losses, val_losses, _ = examples_gcn.train_gcn(None)
    chosen = accel.Auto(cache=False, budget_s=5) if plan == "auto" else FF_PLANS[plan]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state_run, losses_run, val_run, report = examples_gcn.train_gcn(chosen)
    assert report.rows == [] or any(row.status == "applied" for row in report.rows)
    for key in state:
        assert within_card(plan, state[key], state_run[key]), (plan, key)
    if plan != "amp":
        assert torch.allclose(losses, losses_run, rtol=1e-3, atol=1e-4)


@pytest.mark.xfail(strict=True, reason="accel.testing.trace.fingerprint reads every tensor of a batch with "
                   ".contiguous().reshape(-1).view(torch.uint8): a sparse tensor (a GCN's features and adjacency) "
                   "raises 'unsupported memory format option Contiguous', so check_equivalence cannot hold such a "
                   "loop to the cards at all")
def test_check_equivalence_takes_a_batch_holding_sparse_tensors():
    from corpus import examples_gcn

    result = check_equivalence(["threads"], examples_gcn.build, steps=2)
    assert result.ok, result


@pytest.mark.slow
def test_a_qat_run_resumes_from_its_own_checkpoint_as_load_state_dict_does(tmp_path):
    from torch.nn import functional as F

    from corpus import quantization_qat

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        setup = quantization_qat.build()
        run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan=["threads"])
        try:
            x, y = next(iter(run.loader))
            run.backward(F.cross_entropy(run.model(x), y))
            run.step()
            run.save(tmp_path / "qat.pt")
            trained = {k: v.clone() for k, v in setup.model.state_dict().items()}
        finally:
            run.close()
        plain = quantization_qat.build()  # the plain loop's resume: load_state_dict on a fresh QAT model
        plain.model.load_state_dict(trained)
        fresh = quantization_qat.build()
        run = accel.accelerate(fresh.model, fresh.optimizer, fresh.loader, plan=["threads"])
        try:
            run.load(tmp_path / "qat.pt")
        finally:
            run.close()
    assert all(torch.equal(trained[k], v) for k, v in fresh.model.state_dict().items())
