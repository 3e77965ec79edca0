"""accel's CUDA paths on a real GPU, one at a time: the device chosen, fp16 with its GradScaler (a step skipped on
gradients that overflow, clipping of the unscaled gradients), bf16, TF32 decided, reported and put back (also after
a program chose it through torch's newer setting), pinned memory and non-blocking copies, fused optimizers,
activation checkpointing, a checkpoint saved on the GPU loaded on the CPU and back, and `accel bench`."""
import math

import pytest
import torch
from gpu_helpers import DEVICE, ON_GPU, limit, on_gpu
from torch.nn.functional import cross_entropy

import accel
from accel.testing import tiny_loader, tiny_model, tiny_optimizer, train_steps

pytestmark = ON_GPU


def legacy_flags() -> tuple:
    """What a plan on CUDA may change process-wide, read as accel's harness reads it."""
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
            torch.get_float32_matmul_precision())


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def one_step(run, batch, scale_loss: float = 1.0):
    x, y = batch
    with run.autocast():
        output = run.model(x)
        loss = cross_entropy(output, y)
    run.backward(loss * scale_loss)
    return output


def test_auto_is_the_gpu_the_model_and_batches_go_there_and_a_missing_gpu_is_refused():
    model = tiny_model()
    optimizer = tiny_optimizer(model)
    assert accel.decide(model, optimizer, tiny_loader(), plan=[]).device == DEVICE
    run = accel.accelerate(model, optimizer, tiny_loader(), plan=[])
    assert run.device == DEVICE and run.report.device == str(DEVICE)
    assert {p.device for p in model.parameters()} == {DEVICE}
    x, y = next(iter(run.loader))
    assert x.device == DEVICE and y.device == DEVICE
    assert all(math.isfinite(loss) for loss in train_steps(run))
    run.close()
    assert {p.device for p in model.parameters()} == {DEVICE}  # the placement stays: the trained model is there
    missing = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(accel.PlanError, match=f"{missing} does not exist"):
        accel.accelerate(tiny_model(), None, None, plan=[], device=missing)


def fp16_run(*more):
    """A run in fp16 with a GradScaler whose scale starts at 1024: its default, 65536, can overflow the first steps."""
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = accel.accelerate(model, optimizer, tiny_loader(), plan=[{"amp": {"dtype": "float16"}}, *more])
    run.load_accelerator_state("amp", {"scaler": {**run.scaler.state_dict(), "scale": 1024.0}})
    return model, run


def test_fp16_skips_the_step_whose_gradients_overflow_halves_the_scale_and_trains_on():
    model, run = fp16_run()
    assert run.report.row("amp").changes["grad_scaler"] is True and run.scaler is not None
    batches = iter(run.loader)
    assert one_step(run, next(batches)).dtype == torch.float16
    assert run.step() is False  # it stepped
    scale, before = run.scaler.get_scale(), weights(model)
    one_step(run, next(batches), scale_loss=1e38)  # finite in fp32, infinite once scaled: the backward overflows
    assert not all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    assert run.step() is True  # skipped
    assert run.scaler.get_scale() == scale / 2 and run.steps == 2 and run.optimizer_steps == 1
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    one_step(run, next(batches))
    assert run.step() is False and run.optimizer_steps == 2
    assert not all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    run.close()


def test_fp16_clips_the_unscaled_gradients():
    max_norm, lr = 1e-3, 0.1
    model, run = fp16_run({"grad_clipping": {"max_norm": max_norm}})
    assert run.report.row("grad_clipping").changes["under_grad_scaler"] == "unscaled first"
    one_step(run, next(iter(run.loader)))
    scale = run.scaler.get_scale()
    true_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float())
                                                            for p in model.parameters()]))) / scale
    before = weights(model)
    assert run.step() is False
    assert float(run.state("grad_clipping").last_norm) == pytest.approx(true_norm, rel=1e-3)  # not scale x larger
    assert true_norm > max_norm
    moved = math.sqrt(sum(float((p.detach() - before[n]).square().sum()) for n, p in model.named_parameters()))
    assert moved == pytest.approx(lr * max_norm, rel=1e-2)  # SGD on a gradient clipped to max_norm; clipped before
    run.close()  # unscaling, it would move 65536x less


def test_amp_on_this_gpu_computes_in_bf16_where_it_can_without_a_scaler():
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=["amp"])
    native = torch.cuda.is_bf16_supported()
    expected = torch.bfloat16 if native else torch.float16
    assert run.decisions.compute_dtype is expected and run.autocast_dtype is expected
    assert (run.scaler is None) is native
    assert run.report.row("amp").changes["why"] == ("cuda supports bf16" if native else
                                                     "this GPU has no bf16: fp16 with a grad scaler")
    x, _ = next(iter(run.loader))
    with run.autocast():
        assert run.model(x).dtype is expected
    assert all(math.isfinite(loss) for loss in train_steps(run, epochs=2))
    run.close()


@pytest.mark.parametrize("allow", [True, False])
def test_tf32_is_decided_by_amp_reported_and_put_back_by_close(allow):
    before = legacy_flags()
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=[{"amp": {"allow_tf32": allow}}])
    changes = run.report.row("amp").changes
    assert changes["allow_tf32"] is allow and changes["cudnn_benchmark"] is True
    assert f"allow_tf32={allow}" in str(run.report)
    assert torch.backends.cuda.matmul.allow_tf32 is allow and torch.backends.cudnn.allow_tf32 is allow
    assert torch.backends.cudnn.benchmark is True
    train_steps(run)
    run.close()
    assert legacy_flags() == before


def test_a_plan_without_amp_leaves_tf32_as_it_was():
    before = legacy_flags()
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=["fused_optimizer", "loader"])
    assert legacy_flags() == before
    train_steps(run)
    run.close()
    assert legacy_flags() == before


def test_amp_applies_after_the_program_chose_tf32_through_torchs_newer_setting():
    """transformers' TrainingArguments(tf32=True) sets torch.backends.fp32_precision = "tf32" (torch >= 2.9); torch then
    refuses to read the old allow_tf32 flag. amp sets TF32 for the run and close() puts that setting back."""
    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has no torch.backends.fp32_precision (torch >= 2.9)")
    legacy = legacy_flags()
    torch.backends.fp32_precision = "tf32"
    try:
        before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
        model = tiny_model()
        run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=[{"amp": {"allow_tf32": False}}])
        assert run.report.row("amp").status == "applied"
        assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == ("ieee", "ieee")
        train_steps(run)
        run.close()
        assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before
    finally:
        torch.backends.fp32_precision = "none"
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = legacy[0], legacy[1]
        assert legacy_flags() == legacy


def test_the_loader_pins_memory_and_copies_without_blocking():
    model = tiny_model()
    loader = tiny_loader(samples=256)
    run = accel.accelerate(model, tiny_optimizer(model), loader, plan=[{"loader": {"num_workers": 2}}])
    changes = run.report.row("loader").changes
    assert changes["pin_memory"] is True and changes["non_blocking"] is True
    assert run.decisions.non_blocking is True
    inner = run.loader.loader  # the DataLoader the run rebuilt: its batches come in pinned memory
    assert inner.pin_memory and next(iter(inner))[0].is_pinned()
    seen = [(x, y) for x, y in run.loader]
    assert all(x.device == DEVICE for x, _ in seen)
    expected = list(loader)  # the same batches, in the same order, whole once the copies are done
    assert all(torch.equal(x.cpu(), ex) and torch.equal(y.cpu(), ey) for (x, y), (ex, ey) in zip(seen, expected))
    assert len(seen) == len(expected)
    assert all(math.isfinite(loss) for loss in train_steps(run))
    run.close()


@pytest.mark.usefixtures("reproducible")
@pytest.mark.parametrize("optimizer", ["adam", "adamw", "sgd"])
def test_fused_optimizers_step_on_the_gpu_as_the_plain_loop(optimizer):
    from zoo import Case

    from accel.testing import check_equivalence

    result = check_equivalence(["fused_optimizer"], on_gpu(Case("batchnorm", optimizer={"sgd": "momentum"}.get(
        optimizer, optimizer))), device=DEVICE)
    assert result.applied == ["fused_optimizer"] and result.ok, result


@pytest.mark.usefixtures("reproducible")
def test_activation_checkpointing_recomputes_the_blocks_on_the_gpu_bit_for_bit():
    from zoo import Case

    from accel.testing import check_equivalence

    result = check_equivalence(["activation_checkpointing"], on_gpu(Case("blocks", "dict", optimizer="adam")),
                               device=DEVICE)
    assert result.applied == ["activation_checkpointing"] and result.keeps.weights == "exact" and result.ok, result


def test_a_checkpoint_saved_on_the_gpu_loads_on_the_cpu_and_back(tmp_path):
    """fp16's GradScaler state, the optimizer state and torch's CUDA random state, written on the GPU; a run on the
    CPU reads it (the CUDA state is this process's, kept), trains, saves; the GPU run reads that back."""
    plan = [{"amp": {"dtype": "float16"}}, "fused_optimizer"]

    def started(device):
        model = tiny_model()
        return model, accel.accelerate(model, torch.optim.AdamW(model.parameters(), lr=0.01), tiny_loader(),
                                       plan=plan, device=device)

    model, gpu = started(DEVICE)
    train_steps(gpu)
    gpu.scaler.update(1024.0)  # a scale of its own, to see it travel
    gpu.save(tmp_path / "gpu.pt")
    trained = weights(model)
    gpu.close()
    cpu_model, cpu = started("cpu")
    info = cpu.load(tmp_path / "gpu.pt")
    assert info["step"] == gpu.steps and cpu.steps == gpu.steps and cpu.scaler.get_scale() == 1024.0
    assert all(torch.equal(p, trained[n].cpu()) for n, p in cpu_model.named_parameters())
    assert {s["exp_avg"].device.type for s in cpu.optimizer.state.values()} == {"cpu"}
    train_steps(cpu)
    cpu.save(tmp_path / "cpu.pt")
    back_model, back = started(DEVICE)
    back.load(tmp_path / "cpu.pt")
    assert back.steps == cpu.steps and back.scaler.get_scale() == cpu.scaler.get_scale()
    assert all(torch.equal(p.cpu(), c) for (_, p), c in zip(back_model.named_parameters(),
                                                            weights(cpu_model).values()))
    assert {s["exp_avg"].device for s in back.optimizer.state.values()} == {DEVICE}
    assert all(math.isfinite(loss) for loss in train_steps(back))
    cpu.close()
    back.close()


@limit(90)
def test_accel_bench_measures_on_the_gpu_against_the_peak_of_the_dtype_it_computes_in():
    from accel.bench import bench

    result = bench(models=["tiny"], plans=[["amp"], ["channels_last", "fused_optimizer", "amp"]], rounds=1, steps=3,
                   warmup=1, batch_size=8, image_size=8, classes=10, device="cuda")
    assert result.machine["device"] == str(DEVICE)
    assert {"fp32", "bf16", "fp16"} <= set(result.machine["peaks_gflops"])
    rows = {row["plan"]: row for row in result.rows}
    assert all(row["status"] == "ok" for row in rows.values()), rows
    assert all(row["median_ms"] > 0 for row in rows.values())
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert {row["dtype"] for label, row in rows.items() if "amp" in label} == {expected}, rows
