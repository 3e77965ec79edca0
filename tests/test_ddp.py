"""The ddp accelerator, accel.hardware.launcher and accel.distributed: launcher variables, validation, and real
2-process gloo runs."""
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scripts.launching import LAUNCHER_VARIABLES, output, torchrun

import accel
from accel.distributed import all_reduce_mean, barrier, is_main_process
from accel.hardware.launcher import Launch, launcher_environment, slurm_tasks_on_node
from accel.testing import tiny_loader, tiny_model

ALL_LAUNCHER_VARIABLES = LAUNCHER_VARIABLES + (
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_TASKS_PER_NODE", "SLURM_NODEID")


@pytest.fixture
def single_process(monkeypatch):
    for key in ALL_LAUNCHER_VARIABLES:
        monkeypatch.delenv(key, raising=False)


layouts = st.integers(1, 8).flatmap(lambda local_world: st.tuples(
    st.integers(1, 16), st.integers(0, local_world - 1), st.just(local_world))).flatmap(
    lambda t: st.tuples(st.integers(0, t[0] - 1), st.just(t[0]), st.just(t[1]), st.just(t[2])))


def launcher_variables(launcher, node, nodes, local_rank, local_world):
    rank, world = node * local_world + local_rank, nodes * local_world
    return {
        "torchrun": {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": local_world},
        "openmpi": {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": world,
                    "OMPI_COMM_WORLD_LOCAL_RANK": local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE": local_world},
        "intel-mpi/mpich": {"PMI_RANK": rank, "PMI_SIZE": world, "MPI_LOCALRANKID": local_rank,
                            "MPI_LOCALNRANKS": local_world},
        "slurm": {"SLURM_PROCID": rank, "SLURM_NTASKS": world, "SLURM_LOCALID": local_rank,
                  "SLURM_TASKS_PER_NODE": f"{local_world}(x{nodes})", "SLURM_NODEID": node},
    }[launcher]


@given(st.sampled_from(["torchrun", "openmpi", "intel-mpi/mpich", "slurm"]), layouts)
def test_each_launcher_maps_to_torch_variables(launcher, layout):
    node, nodes, local_rank, local_world = layout
    env = {k: str(v) for k, v in launcher_variables(launcher, node, nodes, local_rank, local_world).items()}
    launch = launcher_environment(env)
    assert launch == Launch(launcher, node * local_world + local_rank, nodes * local_world, local_rank, local_world)
    assert launch.to_env()["RANK"] == str(launch.rank) and launch.to_env()["LOCAL_WORLD_SIZE"] == str(local_world)


@given(layouts)
def test_torchrun_variables_win_over_the_outer_launcher(layout):
    """`srun torchrun ...` leaves SLURM's variables set; the ranks torchrun made are the real ones."""
    env = {**launcher_variables("slurm", 0, 1, 0, 1), **launcher_variables("torchrun", *layout)}
    assert launcher_environment({k: str(v) for k, v in env.items()}).launcher == "torchrun"


def test_missing_local_size_means_one_node_and_no_launcher_means_none():
    assert launcher_environment({"PMI_RANK": "2", "PMI_SIZE": "4"}) == Launch("intel-mpi/mpich", 2, 4, 2, 4)
    assert launcher_environment({"SLURM_LOCALID": "0"}) is None
    assert launcher_environment({}) is None


@given(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 5)), min_size=1, max_size=4))
def test_slurm_compressed_tasks_per_node(groups):
    text = ",".join(f"{count}(x{repeat})" if repeat > 1 else str(count) for count, repeat in groups)
    expanded = [count for count, repeat in groups for _ in range(repeat)]
    assert [slurm_tasks_on_node(text, node) for node in range(len(expanded))] == expanded


def test_single_process_skips_with_the_reason(single_process):
    run = accel.accelerate(tiny_model(), None, tiny_loader(), plan=["ddp"], device="cpu")
    row = run.report.row("ddp")
    assert row.status == "skipped" and "no launcher environment" in row.reason
    assert not isinstance(run.model, torch.nn.parallel.DistributedDataParallel)


def test_helpers_in_a_single_process(single_process):
    assert is_main_process()
    barrier()
    assert all_reduce_mean(2.5) == 2.5
    value = torch.tensor([1.0, 3.0])
    assert all_reduce_mean(value) is value


def test_launched_without_master_address_is_a_clear_problem(single_process, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(accel.PlanError) as error:
        accel.accelerate(tiny_model(), None, None, plan=["ddp"], device="cpu")
    assert "ddp.MASTER_ADDR: launched by openmpi (rank 1 of 2) but MASTER_ADDR is not set" in str(error.value)
    assert "MASTER_PORT is not set" not in str(error.value)


def test_backend_must_serve_the_device_and_options_are_checked(single_process, monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(accel.PlanError) as error:
        accel.accelerate(tiny_model(), None, None, plan={"ddp": {"backend": "nccl"}}, device="cpu")
    assert "backend 'nccl' does not serve device cpu" in str(error.value)
    with pytest.raises(accel.PlanError) as error:
        accel.Plan({"ddp": {"comm_hook": "fp8", "timeout_s": 0}})
    assert ("ddp.comm_hook: 'fp8': not allowed" in str(error.value)
            and "ddp.timeout_s: 0: must be > 0" in str(error.value))


# --- real 2-process gloo runs on loopback ---------------------------------------------------------------------

def load_ranks(folder):
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One uninterrupted 2-rank DDP run of train_digits.py (2 epochs of 8 steps, 32 samples per rank and step)."""
    out = tmp_path_factory.mktemp("ddp")
    result = torchrun("train_digits.py", "--out", out)
    assert result.returncode == 0, output(result)
    return load_ranks(out)


@pytest.mark.slow
def test_parameters_identical_across_ranks(two_ranks):
    first, second = two_ranks
    assert first["report"]["accelerators"][0]["status"] == "applied"
    for name, tensor in first["params"].items():
        assert torch.equal(tensor, second["params"][name]), name
    assert first["main"] and not second["main"]
    assert first["losses"] == second["losses"]  # all_reduce_mean: the same mean on both ranks


@pytest.mark.slow
def test_sampler_shards_are_disjoint_complete_and_reshuffled(two_ranks):
    for epoch in (0, 1):
        shards = [set(rank["seen"][epoch]) for rank in two_ranks]
        assert len(shards[0]) == len(shards[1]) == 256
        assert not shards[0] & shards[1]
        assert shards[0] | shards[1] == set(range(512))
    assert two_ranks[0]["seen"][0] != two_ranks[0]["seen"][1]  # set_epoch: a new order every epoch


@pytest.mark.slow
def test_matches_one_process_with_the_global_batch(two_ranks, tmp_path):
    result = torchrun("train_digits.py", "--out", tmp_path, "--plan", "", "--batch-size", 64,
                      "--global-batch-reference", nproc=1)
    assert result.returncode == 0, output(result)
    single = torch.load(tmp_path / "rank0.pt", weights_only=False)
    # the same global mean loss at every step: the same samples in every global batch, gradients averaged
    torch.testing.assert_close(torch.tensor(two_ranks[0]["losses"]), torch.tensor(single["losses"]),
                               rtol=1e-5, atol=1e-5)
    # Adam's update m/sqrt(v) magnifies the all-reduce's different summation order on tiny gradients: after 16
    # steps parameters differ by ~1e-4 (they moved ~1e-2); a different sample order would differ by ~1e-2
    for name, tensor in two_ranks[0]["params"].items():
        torch.testing.assert_close(tensor, single["params"][name], rtol=1e-3, atol=5e-4)


@pytest.mark.slow
def test_with_sgd_the_weights_match_one_process_closely(tmp_path):
    """Adam hides a wrong gradient scale (its update barely changes when every gradient doubles: fsdp on torch 2.8's
    gloo trained so); SGD's update is the gradient itself, so the ranks' average must be exact to rounding."""
    result = torchrun("train_digits.py", "--out", tmp_path / "two", "--optimizer", "sgd", "--epochs", 1)
    assert result.returncode == 0, output(result)
    single = torchrun("train_digits.py", "--out", tmp_path / "one", "--plan", "", "--batch-size", 64, "--epochs", 1,
                      "--global-batch-reference", "--optimizer", "sgd", nproc=1)
    assert single.returncode == 0, output(single)
    ranks, one = load_ranks(tmp_path / "two"), torch.load(tmp_path / "one" / "rank0.pt", weights_only=False)
    for name, tensor in ranks[0]["params"].items():
        torch.testing.assert_close(tensor, one["params"][name], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_killed_rank_restarts_from_its_last_checkpoint(two_ranks, tmp_path):
    """Rank 1 SIGKILLs itself in step 7; torchrun restarts both; they resume from step 6's checkpoint.

    The plan adds compile (eager backend) around DDP, so the checkpoint goes through both wrappers.
    """
    plan = '{"ddp": {}, "compile": {"backend": "eager"}}'
    result = torchrun("train_digits.py", "--out", tmp_path, "--plan", plan, "--ckpt", tmp_path / "ckpt.pt",
                      "--kill-rank", 1, "--kill-step", 6, "--marker", tmp_path / "killed", restarts=1)
    assert result.returncode == 0, output(result)
    assert (tmp_path / "killed").exists()  # the kill did happen
    for rank in load_ranks(tmp_path):
        assert rank["resumed_from"] == 6  # every completed step was in the checkpoint
        assert rank["steps"] == 16
        assert len(rank["seen"][0]) == 2 * 32  # only the steps after the checkpoint were run again
        for name, tensor in two_ranks[0]["params"].items():
            torch.testing.assert_close(rank["params"][name], tensor, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_rank_that_stops_answering_times_out_instead_of_hanging(tmp_path):
    result = torchrun("stalled_rank.py", tmp_path, timeout=90)
    assert result.returncode != 0
    message = (tmp_path / "rank0.txt").read_text()
    assert "timed out" in message.lower() or "timeout" in message.lower(), message


@pytest.mark.slow
def test_bf16_gradient_compression_and_ddp_options_train_in_step(tmp_path):
    plan = ('{"ddp": {"comm_hook": "bf16", "static_graph": true, "gradient_as_bucket_view": true, '
            '"bucket_cap_mb": 1}}')
    result = torchrun("train_digits.py", "--out", tmp_path, "--plan", plan, "--epochs", 1)
    assert result.returncode == 0, output(result)
    first, second = load_ranks(tmp_path)
    assert first["report"]["accelerators"][0]["changes"]["comm_hook"] == "bf16_compress_hook"
    assert all(torch.equal(t, second["params"][n]) for n, t in first["params"].items())
    assert first["losses"][-1] < first["losses"][0]


def test_a_layer_unfrozen_under_ddp_is_named_and_accelerate_again_syncs_it():
    """DDP registers the parameters that require gradients when it wraps: one unfrozen later would train apart on
    each rank. accel warns at the next step; accelerate() again wraps anew and the ranks train together."""
    result = torchrun("unfreeze_ddp.py", timeout=300)  # no retry: the exit abort's cause is fixed (drain_gloo_workers)
    assert result.returncode == 0 and result.stdout.count("OK") == 2, output(result)
    assert result.stdout.count("gloo workers parked at exit") == 2 and "terminate called" not in result.stderr, \
        output(result)


def test_gloo_workers_are_read_from_proc_running_or_parked(tmp_path):
    """The exit drain counts gloo's worker threads in state R (running, or waiting for the CPU) and no others."""
    from accel.distributed.group import gloo_workers_busy

    for tid, (name, state) in enumerate([("pt_gloo_runloop", "R"), ("pt_gloo_runloop", "S"), ("python", "R"),
                                         ("gloo_tcp_loop", "R"), ("pt_gloo_runloop", "R")]):
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "comm").write_text(name + "\n")
        (tmp_path / str(tid) / "stat").write_text(f"{100 + tid} ({name}) {state} 1 2 3")
    assert gloo_workers_busy(str(tmp_path)) == 2
    assert gloo_workers_busy(str(tmp_path / "absent")) == 0



ACCUMULATING = '''
"""2 gloo ranks, ddp + grad_accumulation(steps=3), a loop that never enters run.autocast(): per micro-batch, the
all-reduces DDP ran in its backward and whether the ranks' gradients agree after it."""
import json
import sys

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import accel
from accel.hardware.launcher import rank
from accel.testing import tiny_loader, tiny_model

torch.manual_seed(0)
model = tiny_model()
run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(samples=192),
                       ["ddp", {"grad_accumulation": {"steps": 3}}], device="cpu")
reduced = []


def counted(state, bucket):
    reduced[-1] += 1
    return default_hooks.allreduce_hook(state, bucket)


run.model.register_comm_hook(None, counted)
seen = []
for x, y in run.loader:
    reduced.append(0)
    loss = torch.nn.functional.cross_entropy(run.model(x), y)
    run.backward(loss)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    both = [torch.empty_like(grads) for _ in range(2)]
    torch.distributed.all_gather(both, grads)
    seen.append({"allreduces": reduced[-1], "same": torch.equal(both[0], both[1]),
                 "micro": run.state("grad_accumulation").micro, "stepped": not run.step()})
applied, me = [row.name for row in run.report.rows if row.status == "applied"], rank()
run.close()  # leaves the group accel joined
with open(f"{sys.argv[1]}/rank{me}.json", "w") as handle:
    json.dump({"seen": seen, "applied": applied}, handle)
'''


def test_two_ranks_accumulating_without_run_autocast_reduce_once_per_optimizer_step(tmp_path):
    """Before: DDP's no_sync was entered by run.autocast() only, so a loop that does not enter it (no amp in its plan,
    why would it) all-reduced every micro-batch. Now the run turns the reduction off after every run.step() while
    grad_accumulation accumulates: the first N-1 micro-batches' backward reduces nothing (the ranks' gradients
    differ, each its own half of the data), the N-th all-reduces their sum."""
    script = tmp_path / "accumulating_ddp.py"
    script.write_text(ACCUMULATING)
    result = torchrun(str(script), tmp_path, timeout=180)
    assert result.returncode == 0, output(result)
    for r in range(2):
        done = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert done["applied"] == ["grad_accumulation", "ddp"]
        seen = done["seen"]
        assert len(seen) == 6  # 192 samples, 96 a rank, 16 a batch: two optimizer steps
        final = [i % 3 == 2 for i in range(len(seen))]
        assert [s["stepped"] for s in seen] == final
        assert [s["allreduces"] > 0 for s in seen] == final, seen
        assert [s["same"] for s in seen] == final, seen  # unreduced: each rank's own gradients until the N-th
