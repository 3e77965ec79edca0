"""What the GPU check (docs/gpu.md) found in accel's CUDA paths, tested where it can be without a GPU: TF32 set after a
program chose it through torch's newer setting; gloo beside nccl for fsdp's CPU offload."""
import pytest
import torch


def test_amp_sets_tf32_for_the_run_after_a_program_chose_it_through_torchs_newer_setting():
    """torch >= 2.9 refuses to read allow_tf32 once fp32_precision was set (transformers' tf32=True sets it): amp's
    layer reads that setting instead and puts it back; torch keeps both flags in the process, no GPU needed."""
    from accel.accelerators.amp import set_tf32
    from accel.run.journal import Journal

    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has no torch.backends.fp32_precision (torch >= 2.9)")
    pairs = ((torch.backends.cuda.matmul, torch.backends.cuda.matmul), (torch.backends.cudnn, torch.backends.cudnn.conv))
    legacy = [flags.allow_tf32 for flags, _ in pairs]
    torch.backends.fp32_precision = "tf32"
    try:
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            torch.backends.cuda.matmul.allow_tf32  # what amp read before
        before = [precision.fp32_precision for _, precision in pairs]
        for allow, expected in ((False, "ieee"), (True, "tf32")):
            journal = Journal()
            for flags, precision in pairs:
                set_tf32(journal, flags, precision, allow)
            assert [precision.fp32_precision for _, precision in pairs] == [expected, expected]
            journal.rollback()
            assert [precision.fp32_precision for _, precision in pairs] == before
    finally:
        torch.backends.fp32_precision = "none"
        for (flags, _), value in zip(pairs, legacy):
            flags.allow_tf32 = value


def test_fsdp_offloading_to_the_cpu_starts_its_group_with_gloo_beside_nccl():
    """With cpu_offload the shards are CPU tensors: gathering them (run.close(), clip_grad_norm_, checkpoints) needs a
    backend for CPU tensors, which nccl is not."""
    from accel.accelerators.fsdp import FSDP

    cuda = torch.device("cuda", 0)
    assert FSDP(cpu_offload=True).group_backend(cuda) == "cpu:gloo,cuda:nccl"
    assert FSDP().group_backend(cuda) == "nccl"
    assert FSDP(cpu_offload=True, backend="gloo").group_backend(cuda) == "gloo"
    assert FSDP().group_backend(torch.device("cpu")) == "gloo"
