"""accel launch: the layout and environment it computes, --dry-run, and a real 2-rank launch pinned per rank."""
import json
import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scripts.launching import accel_launch, output

from accel.cli import main
from accel.cli.launch import CORE_MAP, LaunchError, environment, rank_layout
from accel.distributed import rank_start
from accel.hardware import package_version, probe
from accel.hardware.launcher import CORE_MAP_VARIABLE


@given(st.integers(1, 64), st.integers(1, 8), st.integers(0, 8), st.integers(0, 3))
def test_layout_gives_disjoint_cores_and_global_ranks(cores, nproc, per, node_rank):
    physical = tuple(range(0, 2 * cores, 2))  # one logical CPU of each core, as probe() lists them
    if nproc * max(per, 1 if per else cores // nproc) > cores or (not per and cores < nproc):
        with pytest.raises(LaunchError, match="physical cores"):
            rank_layout(physical, nproc, per or None, node_rank)
        return
    layout = rank_layout(physical, nproc, per or None, node_rank)
    assert [r for r, _, _ in layout] == list(range(node_rank * nproc, (node_rank + 1) * nproc))
    flat = [cpu for _, _, cpus in layout for cpu in cpus]
    assert len(flat) == len(set(flat)) and set(flat) <= set(physical)
    assert {len(cpus) for _, _, cpus in layout} == {per or cores // nproc}


def test_environment_respects_what_the_user_set(tmp_path):
    layout = [(0, 0, (0, 1)), (1, 1, (2, 3))]
    set_, kept = environment(layout, False, "none", {"OMP_NUM_THREADS": "7"}, prefix=str(tmp_path))
    assert set_ == {CORE_MAP: "0,1;2,3"} and kept == {"OMP_NUM_THREADS": "7"}
    assert CORE_MAP == CORE_MAP_VARIABLE  # what the threads accelerator reads


def test_intel_openmp_preload_is_appended_or_refused_clearly(tmp_path):
    layout = [(0, 0, (0,))]
    with pytest.raises(LaunchError, match="pip install intel-openmp"):
        environment(layout, True, "none", {}, prefix=str(tmp_path))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").touch()  # where the intel-openmp wheel puts it (the path logic only)
    set_, _ = environment(layout, True, "none", {"LD_PRELOAD": "/opt/mine.so"}, prefix=str(tmp_path))
    assert set_["LD_PRELOAD"] == f"/opt/mine.so:{tmp_path}/lib/libiomp5.so"
    assert set_["KMP_BLOCKTIME"] == "1" and set_["OMP_NUM_THREADS"] == "1"
    assert "KMP_AFFINITY" not in set_  # its compact binding would pin the rank's spawned children to one CPU


def test_dry_run_prints_the_layout_and_the_command(capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    physical = probe().physical_cpus
    assert main(["launch", "--nproc-per-node", str(len(physical)), "--master-port", "29555", "--dry-run",
                 "train.py", "--lr", "0.1"]) == 0
    out = capsys.readouterr().out
    for rank, cpu in enumerate(physical):
        assert f"rank {rank} (local {rank}) -> cpus {cpu}" in out
    assert f"{CORE_MAP}={';'.join(map(str, physical))}" in out
    assert "kept (already set by you): OMP_NUM_THREADS=5" in out
    command = shlex.split(out.split("command: ")[1].strip())
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[command.index("--master-addr") + 1] == "127.0.0.1" and "29555" in command
    assert command[-4:] == [str(Path(rank_start.__file__).resolve()), "train.py", "--lr", "0.1"]


def test_too_many_cores_asked_is_refused(capsys):
    physical = probe().physical_cpus
    assert main(["launch", "--nproc-per-node", "2", "--cores-per-proc", str(len(physical)), "--dry-run", "x.py"]) == 2
    assert "physical cores" in capsys.readouterr().err


@pytest.mark.skipif(package_version("intel-openmp") is not None, reason="intel-openmp is installed here")
def test_iomp_without_intel_openmp_fails_before_starting_anything(capsys):
    assert main(["launch", "--iomp", "x.py"]) == 2
    assert "pip install intel-openmp" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(len(probe().physical_cpus) < 2, reason="needs 2 physical cores")
def test_each_rank_starts_pinned_to_its_own_core(tmp_path):
    result = accel_launch("report_cores.py", tmp_path, "--extra", launch_args=["--nproc-per-node", "2"])
    assert result.returncode == 0, output(result)
    assert "rank 1 (local 1) -> cpus" in result.stdout
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    physical = probe().physical_cpus
    for rank, info in enumerate(ranks):
        share = physical[rank * (len(physical) // 2):(rank + 1) * (len(physical) // 2)]
        assert info["affinity_at_start"] == list(share)  # pinned before torch loaded
        assert info["torch_threads"] == len(share)
        assert info["threads_row"]["rank_cores"].endswith("(accel launch)")
        assert info["ddp"] == "applied" and info["mean_rank"] == 0.5
        assert info["argv"] == [str(tmp_path), "--extra"]
    assert not set(ranks[0]["affinity"]) & set(ranks[1]["affinity"])
