"""loader, amp, channels_last and compile, each constructed, checked and applied alone on tiny real objects."""
import gc
import warnings
import weakref

import pytest
import torch
from torch.nn.modules.module import _global_forward_pre_hooks as global_pre_hooks
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.accelerators.amp import Amp, auto_dtype
from accel.accelerators.channels_last import ChannelsLast
from accel.accelerators.compile import Compile
from accel.accelerators.loader import Loader, rebuild_loader
from accel.hardware import probe
from accel.testing import apply_one, tiny_loader, tiny_model, tiny_optimizer, train_steps


def test_loader_rebuilds_with_workers_and_keeps_everything_else():
    generator = torch.Generator().manual_seed(3)
    seen = []

    def collate(batch):
        seen.append(len(batch))
        return torch.utils.data.default_collate(batch)

    user = tiny_loader(samples=40, batch_size=8, shuffle=True, generator=generator, drop_last=True, collate_fn=collate)
    result = apply_one(Loader(num_workers=1, prefetch_factor=3), loader=user)
    new = result.run.loader.loader
    assert result.row.status == "applied"
    assert new is not user and user.num_workers == 0  # the user's loader is left as it was
    # persistent_workers kept as the user had it: turning it on would shift the shuffle from the second epoch
    assert (new.num_workers, new.prefetch_factor, new.persistent_workers, new.pin_memory) == (1, 3, False, False)
    assert (new.dataset, new.sampler, new.batch_size, new.drop_last, new.generator) == (
        user.dataset, user.sampler, user.batch_size, user.drop_last, user.generator)
    assert "loader.num_workers: 0 -> 1" in result.changed
    assert len(list(result.run.loader)) == 5


def test_loader_auto_counts_cores_left_after_compute_threads():
    torch.set_num_threads(1)
    result = apply_one(Loader())
    spare = len(probe().cpus_allowed) - 1
    assert result.row.changes["num_workers"].startswith(f"{spare} ")
    if spare == 0:
        assert result.row.status == "skipped"


def test_loader_refuses_to_pin_for_the_cpu_and_says_so():
    with pytest.warns(UserWarning, match="pin_memory=True ignored"):
        result = apply_one(Loader(num_workers=1, pin_memory=True))
    assert result.run.loader.loader.pin_memory is False
    assert any("pin_memory=True ignored" in w for w in result.row.warnings)


def test_loader_skips_when_nothing_would_change():
    result = apply_one(Loader(num_workers=0, pin_memory=False))
    assert result.row.status == "skipped" and "already has these settings" in result.row.reason
    assert result.changed == []


def test_rebuild_keeps_a_custom_batch_sampler():
    dataset = TensorDataset(torch.arange(10.0))
    batches = [[0, 1, 2], [3, 4], [5, 6, 7, 8, 9]]
    rebuilt = rebuild_loader(DataLoader(dataset, batch_sampler=batches), num_workers=1)
    assert [b[0].tolist() for b in rebuilt] == [[0.0, 1.0, 2.0], [3.0, 4.0], [5.0, 6.0, 7.0, 8.0, 9.0]]


def test_amp_auto_follows_the_hardware():
    hardware = probe()
    result = apply_one(Amp())
    if hardware.native_bf16:
        assert result.row.status == "applied" and result.row.changes["dtype"] == "bfloat16"
        assert result.run.scaler is None
    else:
        assert result.row.status == "skipped" and "no native bf16" in result.row.reason
        assert result.run.autocast_dtype is None


def test_amp_auto_dtype_rules_by_device_and_isa():
    from dataclasses import replace

    plain = replace(probe(), isa=("avx2", "fma"))
    assert auto_dtype(torch.device("cpu"), plain)[0] is None
    assert auto_dtype(torch.device("cpu"), replace(plain, isa=("avx2", "amx_bf16")))[0] is torch.bfloat16
    assert auto_dtype(torch.device("xpu"), plain)[0] is torch.bfloat16
    assert auto_dtype(torch.device("privateuseone"), plain)[0] is None


def test_amp_fp16_on_cpu_is_honoured_with_a_scaler_never_ignored():
    result = apply_one(Amp(dtype="fp16"))
    run = result.run
    assert result.row.status == "applied" and run.autocast_dtype is torch.float16
    assert isinstance(run.scaler, torch.amp.GradScaler)
    if not probe().native_fp16:
        assert any("emulated" in w for w in result.row.warnings)
    losses = train_steps(run)
    assert all(loss == loss for loss in losses)  # no NaN


def test_step_reports_a_skipped_step_when_gradients_overflow():
    result = apply_one(Amp(dtype="fp16"))
    run = result.run
    before = [p.detach().clone() for p in run.model.parameters()]
    x, y = next(iter(run.loader))
    with run.autocast():
        loss = torch.nn.functional.cross_entropy(run.model(x), y) * float("inf")
    run.backward(loss)
    assert run.step() is True
    assert all(torch.equal(a, b) for a, b in zip(before, run.model.parameters()))
    with run.autocast():
        loss = torch.nn.functional.cross_entropy(run.model(x), y)
    run.backward(loss)
    assert run.step() is False


def test_channels_last_converts_what_enters_each_conv_and_nothing_of_the_users():
    model, hooks = tiny_model(), len(global_pre_hooks)
    result = apply_one(ChannelsLast(), model=model)
    assert result.row.status == "applied" and result.row.changes["conv2d_layers"] == 2
    # your model itself runs, unchanged: one process-wide pre-hook converts its convs' inputs (run.close() removes it)
    assert result.changed == [] and len(global_pre_hooks) == hooks + 1
    assert result.run.model is model and result.run.unwrap() is model
    seen = []
    for conv in (m for m in result.run.model.modules() if isinstance(m, torch.nn.Conv2d)):
        conv.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    x, _ = next(iter(result.run.loader))
    assert x.is_contiguous()  # the batch itself is not converted
    result.run.model(x.expand(-1, 1, -1, -1))
    assert len(seen) == 2 and all(i.is_contiguous(memory_format=torch.channels_last) for i, _ in seen[1:])
    losses = train_steps(result.run)
    assert all(loss == loss for loss in losses)
    result.run.close()
    assert len(global_pre_hooks) == hooks


def test_channels_last_skips_models_without_conv2d():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    result = apply_one(ChannelsLast(), model=model)
    assert result.row.status == "skipped" and "no Conv2d" in result.row.reason
    assert result.changed == []


def test_channels_last_of_a_run_dropped_unclosed_goes_with_its_model():
    """The hook is process-wide but holds nothing of yours: a model dropped with a run never closed is freed, and
    the hook with it (no module call in the process pays for it after)."""
    hooks, model = len(global_pre_hooks), tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["channels_last"], device="cpu")
    assert len(global_pre_hooks) == hooks + 1
    freed = weakref.ref(model)
    del run, model
    gc.collect()
    assert freed() is None and len(global_pre_hooks) == hooks


@pytest.mark.slow  # (dynamo's first compile in the process)
def test_channels_last_under_a_compiled_wrapper_draws_no_warning_from_torch_and_no_graph_break():
    """channels_last's hook is process-wide (pickle and deepcopy leave it out of your model), and torch warns at each
    call of a torch.compile(module) wrapper while a global hook is registered: the run passes its own hook by."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["channels_last", {"compile": {
        "backend": "eager"}}], device="cpu")
    with warnings.catch_warnings(record=True) as seen:
        train_steps(run)
    assert not [w for w in seen if "global hooks" in str(w.message)], [str(w.message) for w in seen]
    assert not torch._dynamo.utils.counters["graph_break"]  # the hook traced into the graph
    run.close()
    other = register_module_forward_pre_hook(lambda *_: None)
    with warnings.catch_warnings(record=True) as seen:
        torch.compile(model, backend="eager")(next(iter(tiny_loader()))[0])
    other.remove()
    assert [w for w in seen if "global hooks" in str(w.message)]  # the filter gone with the run


def test_an_accelerator_that_cannot_serve_the_device_is_skipped_with_the_reason():
    """An out-of-tree device (privateuseone): amp has no autocast for it and says so instead of crashing."""
    from accel.run.context import Context, Decisions

    device = torch.device("privateuseone", 0)
    assert accel.hardware.resolve_device("privateuseone:0") == device
    ctx = Context(tiny_model(), None, None, probe(), accel.Plan(["amp"]), Decisions(device))
    if torch.amp.is_autocast_available("privateuseone"):
        with pytest.raises(accel.Skip, match="no autocast dtype is known for device type 'privateuseone'"):
            Amp().decide(ctx)
    else:
        with pytest.raises(accel.Skip, match="no autocast for device type 'privateuseone'"):
            Amp().decide(ctx)
    assert ctx.decisions.compute_dtype is None
    with pytest.raises(accel.PlanError, match="there is no privateuseone device here"):
        accel.accelerate(tiny_model(), None, None, ["amp"], device="privateuseone:0")


@pytest.mark.slow
def test_compile_wraps_last_unwraps_to_the_user_module_and_reports_warmup_apart():
    model = tiny_model()
    result = apply_one(Compile(mode="default"), model=model)
    run = result.run
    assert result.row.status == "applied" and result.row.changes["mode"] == "default"
    assert run.model is not model and run.unwrap() is model
    train_steps(run)
    timing = run.report.timing()
    assert timing["steps"] == 4 and timing["warmup_s"] >= 0
    assert "first step" in str(run.report)


# --- issue 41: the patterns of real code ---------------------------------------------------------------------------

def test_amp_loss_scaling_without_an_optimizer_is_refused_up_front_and_the_rest_works_without_one():
    """pytorch/examples' word_language_model moves its weights by hand after clip_grad_norm_: no optimizer. Before:
    fp16's GradScaler scaled the loss by 65536, nothing unscaled it, and the weights became NaN, silently;
    run.unscale_gradients() raised AttributeError from inside accel; run.step() a plain RuntimeError."""
    from corpus.examples_word_language_model import RNNModel

    model = RNNModel("LSTM", 50, 16, 16, 2, dropout=0.2)
    with pytest.raises(accel.PlanError, match=r"amp.grad_scaler: 'auto': loss scaling .* needs the optimizer"):
        accel.accelerate(model, None, None, [{"amp": {"dtype": "float16"}}], device="cpu")
    run = accel.accelerate(model, None, None, [{"amp": {"dtype": "bfloat16"}}], device="cpu")
    data = torch.randint(0, 50, (6, 4))
    hidden = model.init_hidden(4)
    with run.autocast():
        output, hidden = run.model(data, hidden)
    run.backward(torch.nn.functional.nll_loss(output.float(), data.view(-1)))
    run.unscale_gradients()  # what amp's card tells readers of gradients to call: a no-op without a scaler
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    with pytest.raises(accel.LoopError, match="run.step\\(\\) needs an optimizer"):
        run.step()
    run.close()


def test_channels_last_keeps_the_dropout_masks_after_a_convolution():
    """pytorch/examples' MNIST drops out the output of a convolution: in NHWC, dropout drew its mask in another
    order, and training left the float card (3% on the mean loss of three steps)."""
    from corpus.examples_mnist import Net

    torch.manual_seed(0)
    model = Net()
    x = torch.rand(2, 1, 28, 28)
    torch.manual_seed(1)
    expected = model(x)
    run = accel.accelerate(model, None, None, ["channels_last"], device="cpu")
    torch.manual_seed(1)
    assert torch.allclose(run.model(x), expected, rtol=1e-4, atol=1e-5)
    run.close()


def test_compile_counts_recompiles_as_compile_time_not_step_time():
    """Per-batch sequence lengths: dynamo compiles again at a new length. Before: the report counted only the first
    step as warm-up, and a recompile (45 s on GPT-2 here) hid in the step time."""
    import torch._dynamo

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Tanh(), torch.nn.Linear(16, 50))
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None,
                           [{"compile": {"backend": "aot_eager"}}], device="cpu")
    for length in (8, 8, 12, 12, 12):
        x = torch.randint(0, 50, (2, length))
        run.backward(torch.nn.functional.cross_entropy(run.model(x).flatten(0, 1), x.flatten()))
        run.step()
    state, timing = run.state("compile"), run.report.timing()
    assert [step for step, _ in state.compiles][:2] == [1, 3] and state.recompile_s > 0, state.compiles
    assert list(timing["recompiles"]) == [3], timing
    text = str(run.report)
    assert "recompiled at step 3" in text and "dynamic=True" in run.report.row("compile").changes["compiles"], text
    run.close()


def test_compile_draws_the_plain_loops_random_numbers_and_refuses_a_model_recomputing_its_batchnorm():
    """Inductor draws its own random numbers (dropout's masks: a GPT-2's first loss 2e-3 off the plain loop's):
    compile sets inductor's fallback_random through the run's journal, and close() puts it back. A model that
    checkpoints itself and holds BatchNorm, compiled whole, counted its batches otherwise (or failed in backward)."""
    import torch._inductor.config as inductor

    timm = pytest.importorskip("timm")
    before = inductor.fallback_random
    run = accel.accelerate(tiny_model(), None, None, ["compile"], device="cpu")
    assert inductor.fallback_random is True and "fallback_random" in run.report.row("compile").changes["random"]
    run.close()
    assert inductor.fallback_random is before
    model = timm.create_model("test_resnet", num_classes=10)
    model.set_grad_checkpointing(True)  # timm's train.py --grad-checkpointing
    with pytest.raises(accel.PlanError, match="checkpoints its own activations.*regional=True"):
        accel.accelerate(model, None, None, [{"compile": {"backend": "eager"}}], device="cpu")
    assert Compile.candidates(probe(), model) in ([{"regional": True}], [])  # never the whole model
    accel.accelerate(model, None, None, [{"compile": {"backend": "eager", "regional": True}}], device="cpu").close()


@pytest.mark.slow
def test_dropout_under_inductor_draws_the_plain_loops_masks():
    """nanoGPT with dropout 0.1 under inductor: the first losses as the plain loop's (before: inductor's own
    random numbers, 2e-3 off)."""
    import torch._dynamo
    from corpus.nanogpt_train import GPT, GPTConfig

    torch._dynamo.reset()
    losses = []
    for plan in ([], ["compile"]):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=1, n_embd=16, dropout=0.1))
        run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None, plan, device="cpu")
        torch.manual_seed(1)
        x = torch.randint(0, 96, (2, 16))
        losses.append([])
        for _ in range(2):
            loss = run.model(x, x)[1]
            run.backward(loss)
            run.step()
            losses[-1].append(loss.item())
        run.close()
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-6), losses
