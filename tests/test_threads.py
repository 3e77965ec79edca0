"""Cores per rank: the book's CPU allocation map, and the threads accelerator applying it from the local rank."""
import os

from hypothesis import given
from hypothesis import strategies as st

from accel.accelerators.threads import Threads
from accel.hardware import probe
from accel.hardware.launcher import CORE_MAP_VARIABLE, cores_for_rank, launcher_environment, rank_cores
from accel.testing import apply_one, process_state_restored

cpu_sets = st.lists(st.integers(0, 255), min_size=1, max_size=64, unique=True).map(lambda c: tuple(sorted(c)))


@given(cpu_sets, st.integers(1, 64))
def test_ranks_get_disjoint_equal_shares_when_cores_suffice(cpus, world):
    shares = [cores_for_rank(cpus, rank, world) for rank in range(world)]
    if world <= len(cpus):
        assert all(len(s) == len(cpus) // world for s in shares)
        flat = [c for s in shares for c in s]
        assert len(flat) == len(set(flat))  # disjoint
    assert all(s and set(s) <= set(cpus) for s in shares)  # never empty, never outside the allowed cores


@given(cpu_sets, st.integers(1, 8), st.integers(1, 8))
def test_explicit_cores_per_rank(cpus, world, per_rank):
    if world * per_rank > len(cpus):
        return
    shares = [cores_for_rank(cpus, rank, world, per_rank=per_rank) for rank in range(world)]
    assert [len(s) for s in shares] == [per_rank] * world
    assert sum(shares, ()) == cpus[:world * per_rank]  # contiguous, in order


def layout(environ):
    launch = launcher_environment(environ)
    return (launch.local_rank, launch.local_world_size) if launch else (0, 1)


def test_layout_from_each_launcher():
    assert layout({}) == (0, 1)
    assert layout({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == (1, 2)
    assert layout({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2",
                   "SLURM_TASKS_PER_NODE": "3(x2)", "SLURM_NODEID": "1"}) == (2, 3)


def test_core_map_from_accel_launch_wins_over_the_partition():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", CORE_MAP_VARIABLE: "0,1;6,7"}
    assert rank_cores((0, 1, 2, 3, 4, 5, 6, 7), launcher_environment(env), env) == ((6, 7), "accel launch")
    del env[CORE_MAP_VARIABLE]
    assert rank_cores((0, 1, 2, 3, 4, 5, 6, 7), launcher_environment(env), env)[0] == (4, 5, 6, 7)


def test_threads_accelerator_pins_this_local_rank_and_reports_it():
    physical = probe().physical_cpus
    local_rank = len(physical) - 1  # the last of as many ranks as cores: one core each
    with process_state_restored():
        os.environ.update(LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(len(physical)),
                          RANK=str(local_rank), WORLD_SIZE=str(len(physical)))
        row = apply_one(Threads()).row
        assert os.sched_getaffinity(0) == {physical[-1]}
    assert row.changes["threads"] == 1
    assert row.changes["rank_cores"].startswith(f"local rank {local_rank}/{len(physical)} -> cpus {physical[-1]}")


def test_a_spawned_child_keeps_all_of_the_runs_cpus():
    """threads exported OMP_PROC_BIND and GOMP_CPU_AFFINITY (KMP_AFFINITY=compact for Intel OpenMP): the main thread
    of every child that loads OpenMP (a spawn DataLoader worker) was bound to the first CPU, all of them to one."""
    import subprocess
    import sys

    import accel
    from accel.testing import tiny_model

    with process_state_restored():
        for key in ("OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"):  # yours, if set, would bind it
            os.environ.pop(key, None)
        run = accel.accelerate(tiny_model(), None, None, plan=["threads"], device="cpu")
        child = subprocess.run([sys.executable, "-c", "import os, torch; torch.ones(64, 64) @ torch.ones(64, 64); "
                                "print(sorted(os.sched_getaffinity(0)))"], capture_output=True, text=True, timeout=120)
        assert child.stdout.strip() == str(sorted(run.decisions.cpus)), child.stderr
        assert not {"OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"} & set(os.environ)
        run.close()
