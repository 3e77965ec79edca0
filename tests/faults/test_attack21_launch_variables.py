"""The launcher's variables accel reads (torchrun's, SLURM's, `accel launch`'s ACCEL_CORE_MAP and ACCEL_NODE_CPUS)
set to values no launcher writes: a zero world, a SLURM task count that is no number, a core map that is no CPU
list, a CPU range of a hundred billion. accelerate() reads them before anything changes (accel.run.context.placement,
the threads accelerator's decide), and promises one PlanError for every problem of a plan, with nothing changed.

What holds: nothing changes, whatever the values. Found: only RANK=abc is said as a plan problem (placement catches
launcher_environment's ValueError); a world of 0 is a ZeroDivisionError from accel.hardware.launcher.cores_for_rank, an
empty SLURM count an IndexError from slurm_tasks_on_node, a core map that is no list a bare ValueError, and a range of
a hundred billion CPUs is built in memory (parse_cpu_list) before anything looks at it."""
import os
import resource
import subprocess
import sys
import warnings

import pytest
from injectors import objects, process_state, warm_up

import accel
from accel.errors import PlanError
from accel.run import open_run
from accel.testing import snapshot

HOSTILE = {
    "world of zero": {"RANK": "0", "WORLD_SIZE": "0"},
    "local world of zero": {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "0"},
    "slurm count no number": {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "abc"},
    "core map no list": {"ACCEL_CORE_MAP": "x"},
    "core map negative": {"ACCEL_CORE_MAP": "-1"},
}


def accelerate_under(monkeypatch, variables: dict) -> BaseException | None:
    """accelerate(plan=["threads"]) with these variables set; what it raised (None: it applied, and was closed)."""
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    model, optimizer, loader = objects()
    before = snapshot(model, optimizer, loader)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            accel.accelerate(model, optimizer, loader, plan=["threads"], device="cpu").close()
    except Exception as error:  # noqa: BLE001 (what it raised is what is checked)
        return error
    finally:
        assert before.changes(snapshot(model, optimizer, loader)) == [] and open_run(model) is None
    return None


@pytest.mark.parametrize("name", ["rank no number", *HOSTILE])
def test_launch_variables_no_launcher_writes_change_nothing(monkeypatch, name):
    warm_up()
    state = process_state()
    accelerate_under(monkeypatch, HOSTILE.get(name, {"RANK": "abc", "WORLD_SIZE": "2"}))
    for key in HOSTILE.get(name, {"RANK": "abc", "WORLD_SIZE": "2"}):
        monkeypatch.delenv(key)
    assert process_state() == state


def test_a_rank_that_is_no_number_is_a_plan_problem(monkeypatch):
    assert isinstance(accelerate_under(monkeypatch, {"RANK": "abc", "WORLD_SIZE": "2"}), PlanError)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_launch_variables_no_launcher_writes_are_one_plan_error_naming_them(monkeypatch, name):
    error = accelerate_under(monkeypatch, HOSTILE[name])
    assert isinstance(error, PlanError), f"{type(error).__name__}: {error}"
    assert any(key in str(error) for key in HOSTILE[name]), str(error)


CHILD = """
import os, resource, sys, warnings
from accel.testing import tiny_loader, tiny_model, tiny_optimizer
import accel
from accel.errors import PlanError
model = tiny_model()
size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))
warnings.simplefilter("ignore")
try:
    accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=sys.argv[1:], device="cpu").close()
    print("applied")
except PlanError as error:
    print("PlanError", str(error).replace(chr(10), " "))
except BaseException as error:
    print(type(error).__name__, error)
"""


@pytest.mark.slow
def test_a_core_map_of_a_hundred_billion_cpus_is_a_plan_error_not_a_memory_error():
    """In a child under a memory limit of a GiB beyond what it holds (the range, built, would be 800 GB)."""
    if not hasattr(resource, "RLIMIT_AS"):
        pytest.skip("needs RLIMIT_AS")
    env = {**os.environ, "ACCEL_CORE_MAP": "0-99999999999", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", CHILD, "threads"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.startswith("PlanError"), done.stdout + done.stderr[-2000:]
