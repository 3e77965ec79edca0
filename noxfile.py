"""Test sessions. `nox` runs them all (what CI runs, in under 30 minutes on 2 cores); `nox -s tests` is the quick one.

tests: the newest torch pip resolves (2.15.0 on 2026-11-22) with every optional engine that installs beside it;
       the whole suite, the preservation zoo with its generated cases (tests/test_equivalence.py).
ipex:  torch 2.8.*, our tested minimum, with intel-extension-for-pytorch 2.8.* and the neighbours it can import
       beside (IPEX is archived; transformers 5 removed names IPEX 2.8 imports): IPEX for real (its tests, its
       zoo, the book's chapter 4 example), and on torch 2.8 the parts whose behaviour has moved between torch
       releases (distribution: gloo's reduce-scatter summed under AVG in 2.8; the plan contract; the hardware).
"""
import os

import nox

nox.options.sessions = ["tests", "ipex"]
nox.options.reuse_existing_virtualenvs = True
# OpenMP threads that wait passively: on a shared 2-core machine a spinning thread steals the core its peer needs
# (the zoo's 100 cases took 26 s beside a CPU-bound process with the default, 21 s with this). No test measures speed.
# Unbuffered output, as on CI: a launched job's ranks share one pipe, and print() then writes a line and its newline
# apart, so a test that reads the ranks' lines must meet that here too (tests/scripts/launching.py, say()).
QUIET_WAITS = {"OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
# One pytest worker per CPU this process may use, at most 4 (pytest-xdist), each test file whole on one worker (its
# module fixtures built once): alone, the suite keeps about one core of two busy, starting processes and waiting for
# ranks. More workers than CPUs would only slow the launched jobs' ranks.
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
WORKERS = ("-n", str(min(CPUS, 4)), "--dist", "loadfile")

# What IPEX 2.8 imports beside: checked by a fresh import in the session (ipex_problem) before any test runs.
IPEX_ENVIRONMENT = ("torch==2.8.*", "torchvision==0.23.*", "intel-extension-for-pytorch==2.8.*", "transformers<5")
ON_TORCH_28 = ("tests/test_ipex.py", "tests/test_fsdp.py", "tests/test_ddp.py", "tests/test_plan.py",
               "tests/test_lifecycle.py", "tests/test_hardware.py", "tests/test_cpu_kinds.py")
# Launched jobs whose torch-specific parts the tests kept on 2.8 cover: a wrong gradient scale (SGD: two ranks against
# one process, DDP and FSDP2 on a CNN), a sharded checkpoint into one process, a group added late, accumulation under
# FSDP2. The rest (restarts, compile under FSDP, auto's choice by memory, timeouts, compression, Adam's runs, a GPT
# beside the CNN) exercises accel's own code the same way on every torch: eight minutes of launched ranks saved.
NOT_ON_TORCH_28 = [f"--deselect=tests/{test}" for test in (
    "test_fsdp.py::test_a_killed_rank_resumes_from_the_last_sharded_checkpoint_with_no_step_lost",
    "test_fsdp.py::test_amp_and_compile_compose_with_fsdp",
    "test_fsdp.py::test_auto_under_torchrun_picks_by_memory_and_both_ranks_agree",
    "test_fsdp.py::test_two_ranks_train_a_group_added_later_over_your_own_parameters",
    "test_fsdp.py::test_a_checkpoint_of_two_ranks_loads_in_one_bit_for_bit_and_back",
    "test_fsdp.py::test_two_ranks_train_as_one_process_on_the_global_batch[gpt-adamw]",
    "test_fsdp.py::test_two_ranks_train_as_one_process_on_the_global_batch[gpt-sgd]",
    "test_ddp.py::test_matches_one_process_with_the_global_batch",
    "test_ddp.py::test_bf16_gradient_compression_and_ddp_options_train_in_step",
    "test_ddp.py::test_a_layer_unfrozen_under_ddp_is_named_and_accelerate_again_syncs_it",
    "test_ddp.py::test_a_rank_that_stops_answering_times_out_instead_of_hanging",
    "test_ddp.py::test_two_ranks_accumulating_without_run_autocast_reduce_once_per_optimizer_step",
    "test_ddp.py::test_killed_rank_restarts_from_its_last_checkpoint")]


@nox.session
def tests(session):
    session.install("-e", ".[test]")
    session.run("ruff", "check", ".")  # lint and import order first: seconds, and a finding fails the session
    session.run("pytest", "-q", *WORKERS, "-m", "not ipex", *session.posargs, env=QUIET_WAITS)


@nox.session
def ipex(session):
    # One resolver run, so nothing in .[test] can lift torch past 2.8 (IPEX 2.8 exits on any other torch).
    session.install(*IPEX_ENVIRONMENT, "-e", ".[test]")
    session.run("python", "-c", "from accel.hardware import ipex_problem as p; assert p() is None, p()")
    session.run("pytest", "-q", *WORKERS, "-m", "ipex", *session.posargs, env=QUIET_WAITS)  # every IPEX test
    session.run("pytest", "-q", *WORKERS, "-m", "not ipex", *ON_TORCH_28, *NOT_ON_TORCH_28, *session.posargs,
                env=QUIET_WAITS)
