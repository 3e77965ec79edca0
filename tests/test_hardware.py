"""The probe: facts read from /sys and /proc, without importing anything unsafe."""
import json
import subprocess
import sys
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from accel.hardware import EXTRAS, format_cpu_list, install_hint, loaded_openmp, parse_cpu_list, probe, resolve_device


@given(st.sets(st.integers(0, 512), min_size=1))
def test_cpu_lists_round_trip(cpus):
    assert parse_cpu_list(format_cpu_list(sorted(cpus))) == tuple(sorted(cpus))


def test_cpu_list_forms():
    assert parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpu_list([5, 0, 1, 2]) == "0-2,5"


def test_openmp_runtime_is_read_from_memory_maps():
    gnu = "7f00-7f10 r-xp 0 08:01 1 /venv/lib/python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1\n"
    intel = "7f00-7f10 r-xp 0 08:01 1 /venv/lib/libiomp5.so\n"
    assert loaded_openmp(gnu) == "gnu"
    assert loaded_openmp(intel) == "intel"
    assert loaded_openmp(gnu + intel) == "several: gnu, intel"
    assert loaded_openmp("") == "none"
    assert probe().openmp in ("gnu", "intel", "llvm") or probe().openmp.startswith("several")  # torch loads one


def test_probe_sees_this_process():
    hardware = probe()
    assert 1 <= hardware.physical_cores <= hardware.logical_cpus
    assert set(hardware.physical_cpus) <= set(hardware.cpus_allowed)
    assert hardware.devices["cpu"] == 1
    assert hardware.versions["torch"] == torch.__version__
    assert json.loads(json.dumps(hardware.to_dict()))["physical_cores"] == hardware.physical_cores
    assert hardware.native_bf16 == ("avx512_bf16" in hardware.isa or "amx_bf16" in hardware.isa)


def test_probe_imports_no_optional_engine():
    # A fresh interpreter: other tests in this process may have imported IPEX or NNI for real.
    code = ("import sys; from accel.hardware import ipex_problem, probe; probe(); ipex_problem(); "
            "print(json.dumps(sorted(m for m in ('intel_extension_for_pytorch', 'nni') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_device_resolution():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type in (expected, "xpu", "mps")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("privateuseone:1") == torch.device("privateuseone", 1)


def test_an_optional_package_that_breaks_on_import_is_named_with_its_error_and_the_fix(tmp_path, monkeypatch):
    """What ipex_problem() runs after the version check: a fresh interpreter imports the package, so a package
    that raises on import (IPEX 2.8 beside transformers 5) or exits (IPEX against another torch) is a reason at plan
    time, never a NameError at apply time or a dead process."""
    from accel.hardware import IPEX_IMPORT_HINTS, import_problem

    (tmp_path / "breaks_on_import.py").write_text("raise NameError(\"name 'MoeModelOutputWithPast' is not defined\")\n")
    (tmp_path / "exits_on_import.py").write_text("import os\nos._exit(127)\n")
    (tmp_path / "imports_fine.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    problem = import_problem("breaks_on_import", IPEX_IMPORT_HINTS)
    assert "NameError" in problem and "MoeModelOutputWithPast" in problem and "transformers<5" in problem
    assert "exit code 127" in import_problem("exits_on_import")
    assert import_problem("imports_fine") is None


def test_an_optional_package_is_installed_through_the_extra_that_pins_it():
    """install_hint names the extra of pyproject.toml that holds the package, and the package's own name
    elsewhere."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for distribution, extra in EXTRAS.items():
        assert any(pin.split("=")[0].split("<")[0].split(">")[0] == distribution for pin in extras[extra]), distribution
        assert install_hint(distribution) == f"pip install 'accel[{extra}]'"
    assert install_hint("oneccl_bind_pt") == "pip install oneccl_bind_pt"
