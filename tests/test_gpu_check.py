"""The GPU check (benchmarks/gpu/run.sh, docs/gpu.md) rehearsed where there is no GPU: the real script runs to the end,
every test in tests/cuda is skipped with the reason, the benchmark is skipped with the reason, and it exits 0; the
benchmark's code runs for real on tiny models on the CPU; and what the check found in accel's CUDA paths, tested
where it can be without a GPU (TF32 set after a program chose it through torch's newer setting; gloo beside nccl
for fsdp's CPU offload)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scripts.launching import clean_env, output

ROOT = Path(__file__).resolve().parent.parent
GPU = pytest.mark.skipif(torch.cuda.is_available(),
                         reason="a GPU is here: benchmarks/gpu/run.sh runs the check for real")


def run(command: list, out: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, env={**clean_env(), "OUT": str(out), "PYTHON": sys.executable, **env},
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@GPU
def test_the_gpu_check_runs_to_the_end_without_a_gpu_and_says_why_each_part_was_skipped(tmp_path):
    result = run(["bash", "benchmarks/gpu/run.sh"], tmp_path)
    assert result.returncode == 0, output(result)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["0-summary.txt", "1-env.txt", "2-tests.log", "2-tests.xml", "3-bench.json", "3-bench.log"], files
    summary = (tmp_path / "0-summary.txt").read_text()
    assert result.stdout.endswith(summary) and summary.rstrip().endswith("result: ok"), summary
    assert all(f"  {part:6} {word}" in summary for part, word in (("env", "ok"), ("tests", "ok"), ("bench", "skipped")))
    counts = summary.split("cuda tests: ")[1].splitlines()[0]
    skipped = int(counts.split(" skipped")[0].rsplit(" ", 1)[1])
    assert counts.startswith("0 passed, 0 failed, 0 error, ") and skipped >= 40, counts
    reason = "because no CUDA device here"
    assert f"SKIPPED {skipped}, {reason}" in summary, summary  # every one of them, for that reason
    for module in (ROOT / "tests" / "cuda").glob("test_*.py"):
        assert f"tests/cuda/{module.name}::" in summary, module.name
    assert "benchmark:\n  skipped: no CUDA device here" in summary
    assert json.loads((tmp_path / "3-bench.json").read_text())["skipped"].startswith("no CUDA device here")
    assert "accel 0.3.0" in (tmp_path / "1-env.txt").read_text() or "accelerators (plan-time checks" in (
        tmp_path / "1-env.txt").read_text()


@pytest.mark.slow
def test_the_gpu_benchmark_runs_on_tiny_models_on_the_cpu(tmp_path):
    """Every variant of both models trains and is timed, FLOPs are counted, and the goals are judged: the code the GPU
    runs, on the CPU (Accelerate without its compile here: dynamo's tracing alone takes tens of seconds on 2 cores)."""
    result = run([sys.executable, "benchmarks/gpu/bench_gpu.py", "--device", "cpu", "--tiny", "--backend", "no",
                  "--budget-s", "2", "--json", str(tmp_path / "bench.json")], tmp_path)
    assert result.returncode == 0, output(result)
    found = json.loads((tmp_path / "bench.json").read_text())
    assert found["bf16_peak_tflops"] >= 0 and found["machine"]["device"] == "cpu"
    assert set(found["models"]) == {"resnet50", "gpt2"}
    for name, model in found["models"].items():
        assert model["flops_per_step"] > 0, name
        for label in ("eager fp32", "Accelerate bf16+compile", "accel auto"):
            row = model["variants"][label]
            assert row["rounds"] == 2 and row["median_ms"] > 0 and row["mfu"] > 0, (name, label, row)
        assert model["variants"]["accel auto"]["settled"] is True
        assert set(model["ratios"]) == {"auto_vs_eager", "auto_vs_accelerate"}
        assert all(goal["measured"] is not None for goal in model["goals"].values()), model["goals"]


def test_amp_sets_tf32_for_the_run_after_a_program_chose_it_through_torchs_newer_setting():
    """torch >= 2.9 refuses to read allow_tf32 once fp32_precision was set (transformers' tf32=True sets it): amp's
    layer reads that setting instead and puts it back; torch keeps both flags in the process, no GPU needed."""
    from accel.accelerators.amp import set_tf32
    from accel.run.journal import Journal

    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has no torch.backends.fp32_precision (torch >= 2.9)")
    pairs = ((torch.backends.cuda.matmul, torch.backends.cuda.matmul),
             (torch.backends.cudnn, torch.backends.cudnn.conv))
    legacy = [flags.allow_tf32 for flags, _ in pairs]
    torch.backends.fp32_precision = "tf32"
    try:
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            _ = torch.backends.cuda.matmul.allow_tf32  # what amp read before
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


def test_the_settings_docs_gpu_md_names_are_the_ones_the_check_reads():
    text = (ROOT / "docs" / "gpu.md").read_text()
    named = set(re.findall(r"\b(ACCEL_(?:GPU_CHECK|CUDA)_[A-Z_]+)\b", text))
    read = "".join(p.read_text()
                   for p in [ROOT / "benchmarks" / "gpu" / "run.sh", *(ROOT / "tests" / "cuda").glob("*.py")])
    assert named and all(name in read for name in named), sorted(n for n in named if n not in read)
    assert all(len(line) < 2000 for line in re.findall(r"run\(command=.*\)", text))


def test_the_harness_leaves_out_what_inductor_sets_in_the_environment_on_a_gpu(monkeypatch):
    """On a GPU, inductor sets TRITON_CACHE_DIR when it first loads a Triton kernel (and TRITON_PTXAS_PATH where it
    compiles one), whoever compiled: check_equivalence must not count that as a plan's change of the process."""
    from accel.testing.trace import process_state

    before = process_state()
    monkeypatch.setenv("TRITON_CACHE_DIR", "/tmp/torchinductor_you/triton/0")
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/site-packages/torch/bin/ptxas")
    assert process_state() == before
