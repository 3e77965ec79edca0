"""Smoke tests: every chapter example runs in --quick mode as a real subprocess and prints the rows it promises.

Numbers in --quick mode mean nothing (a few steps on a few samples), so only their presence and what the
accel report says are checked, never a speed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import accel
from accel.hardware import ipex_problem, package_version

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                    "SLURM_PROCID")


def run_example(name: str, *args: str, python: str = sys.executable) -> tuple[str, list[dict]]:
    """Run examples/NAME --quick --json; return its output and the table rows it printed as JSON."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}  # as a user starts it
    done = subprocess.run([python, str(EXAMPLES / name), "--quick", "--json", *args], cwd=EXAMPLES.parent, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    tables = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[{")]
    return done.stdout, tables[-1] if tables else []


def test_every_example_has_a_smoke_test():
    tested = {"ch02_batch_size.py", "ch03_compile.py", "ch04_openmp.py", "ch04_ipex.py", "ch05_data_pipeline.py",
              "ch06_pruning_sweep.py", "ch07_mixed_precision.py", "ch09_ddp_cpu.py", "ch10_multi_gpu.py",
              "ch11_multi_node.py"}
    assert {p.name for p in EXAMPLES.glob("ch*.py")} == tested


def test_ch02_batch_size():
    out, rows = run_example("ch02_batch_size.py")
    assert [r["batch"] for r in rows] == [16, 32]
    assert rows[0]["steps"] == 4 and rows[1]["steps"] == 2  # 64 samples
    assert all(0 <= r["accuracy"] <= 1 for r in rows)


@pytest.mark.slow
def test_ch03_compile():
    out, rows = run_example("ch03_compile.py")
    assert [r["variant"] for r in rows] == ["eager (baseline)", "compile (eager)"]
    assert "compile      compilation  applied  backend=eager" in out


@pytest.mark.slow
def test_ch04_openmp_runs_fresh_processes_and_accel_launch():
    out, rows = run_example("ch04_openmp.py")
    assert [r["variant"] for r in rows[:2]] == ["as started (baseline)", "accel launch (GNU vars)"]
    assert all(r.get("seconds") for r in rows[:2]), rows
    assert "accel launch: 1 node(s) x 1 process(es)" in out
    assert rows[-1]["variant"] == "accel launch --iomp"  # run, or skipped with the reason in the row


@pytest.mark.ipex
@pytest.mark.skipif(ipex_problem() is not None, reason=f"IPEX unusable here: {ipex_problem()}")
def test_ch04_ipex():
    out, rows = run_example("ch04_ipex.py")
    assert rows[1]["variant"] == "ipex fp32" and "ipex         kernels  applied" in out


@pytest.mark.skipif(ipex_problem() is None, reason="IPEX works here: test_ch04_ipex runs it")
def test_ch04_ipex_explains_why_it_cannot_run():
    out, rows = run_example("ch04_ipex.py")
    assert out.startswith("SKIPPED: IPEX cannot run") and ipex_problem() in out and not rows


def test_ch05_data_pipeline():
    out, rows = run_example("ch05_data_pipeline.py")
    assert [r["workers"] for r in rows] == [0, 2]
    assert all(r["samples_per_s"] > 0 for r in rows)
    assert "loader       data   applied  num_workers=2 (asked for), pin_memory=False" in out
    assert "pin_memory=True ignored" in out  # a CPU has no bus to cross: the report says why


@pytest.mark.skipif(package_version("nni") is None, reason="needs nni (pip install 'accel[prune]')")
def test_ch06_pruning_sweep_shrinks_the_model():
    out, rows = run_example("ch06_pruning_sweep.py")
    baseline, pruned = rows
    assert pruned["variant"] == "conv sparsity 50%"
    assert pruned["parameters"] < 0.6 * baseline["parameters"]
    assert 0 <= pruned["accuracy"] <= 1


def test_ch07_mixed_precision():
    out, rows = run_example("ch07_mixed_precision.py")
    expected = "bfloat16" if accel.probe().native_bf16 else "float32"
    assert [r["dtype"] for r in rows] == ["float32", expected, "float16"]


@pytest.mark.slow
def test_ch09_ddp_cpu_two_gloo_ranks():
    out, rows = run_example("ch09_ddp_cpu.py")
    (row,) = rows
    assert row["processes"] == 2 and row["ddp"] == "applied" and row["threads"] == 1
    assert "backend=gloo" in out and "64 of 128 samples per rank" in out


@pytest.mark.skipif(accel.probe().devices.get("cuda", 0) >= 2, reason="has GPUs: runs for real, too long for CI")
def test_ch10_explains_itself_without_gpus():
    out, rows = run_example("ch10_multi_gpu.py")
    assert out.startswith("SKIPPED: chapter 10 needs 2 or more CUDA GPUs") and not rows


def test_ch11_explains_itself_without_a_launcher():
    out, rows = run_example("ch11_multi_node.py")
    assert out.startswith("SKIPPED: chapter 11 is a multi-node job") and "accel launch --nnodes 2" in out


def test_cluster_scripts_are_valid_shell():
    scripts = sorted((EXAMPLES / "cluster").iterdir())
    assert {p.name for p in scripts} == {"ch11_mpirun.sh", "ch11_srun.sbatch", "ch11_torchrun.sbatch"}
    for script in scripts:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{script.name}: {done.stderr}"
        assert "examples/ch11_multi_node.py" in script.read_text()
