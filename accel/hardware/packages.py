"""What is installed and whether it imports, found without importing it into this process: versions from
installed metadata, and a fresh interpreter for a package that may kill the one importing it (IPEX)."""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
import subprocess
import sys

import torch


def torch_version() -> tuple[int, int]:
    """torch's (major, minor): what behaviour gates (IPEX's pin, fixes that came with a release) compare."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def package_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


EXTRAS = {"nni": "prune", "intel-extension-for-pytorch": "ipex", "intel-openmp": "openmp"}  # pyproject.toml's


def install_hint(distribution: str) -> str:
    """The command that installs an optional package as accel pins it (its extra), else by its own name."""
    extra = EXTRAS.get(distribution)
    return f"pip install 'accel[{extra}]'" if extra else f"pip install {distribution}"


def importable(module: str) -> bool:
    """Whether a module could be imported, found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=1)
def ipex_problem() -> str | None:
    """Why IPEX must not be imported here, or None when it is safe (asked once per process). IPEX calls os._exit
    on import when its major.minor differs from torch's, so the versions are compared first; then a fresh interpreter
    imports it, because it breaks beside some of its neighbours (IPEX 2.8 with transformers 5)."""
    ipex = package_version("intel-extension-for-pytorch")
    if ipex is None:
        return "intel-extension-for-pytorch is not installed (pip install 'accel[ipex]' in a torch 2.8 environment)"
    want = ".".join(ipex.split("+")[0].split(".")[:2])
    have = ".".join(map(str, torch_version()))
    if want != have:
        return f"IPEX {want} needs torch {want}.*, found {torch.__version__.split('+')[0]}"
    if "intel_extension_for_pytorch" in sys.modules:
        return None  # imported already, and alive
    return import_problem("intel_extension_for_pytorch", IPEX_IMPORT_HINTS)


IPEX_IMPORT_HINTS = {  # what broke IPEX's import -> the fix, found on these machines
    "MoeModelOutputWithPast": "transformers 5 removed names IPEX 2.8 imports: pip install 'transformers<5'",
}
IMPORT_PROBE_TIMEOUT_S = 300


def import_problem(module: str, hints: dict[str, str] | None = None) -> str | None:
    """Why ``import module`` fails in a fresh interpreter of this environment (a package that exits on import takes
    only the probe with it), or None when it imports."""
    try:
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                              timeout=IMPORT_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"importing {module} took over {IMPORT_PROBE_TIMEOUT_S} s in a fresh interpreter"
    if done.returncode == 0:
        return None
    errors = [line for line in done.stderr.splitlines() if re.match(r"^\w*(Error|Exception)\b", line)]
    last = errors[-1] if errors else (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    fix = next((fix for key, fix in (hints or {}).items() if key in done.stderr), None)
    return f"{module} is installed but does not import here: {last}" + (f" ({fix})" if fix else "")


PACKAGE_BACKENDS = ("ipex",)  # torch.compile backends an optional package registers when imported


def compile_backend_problem(backend: str) -> str | None:
    """Why a torch.compile backend that an optional package registers (IPEX's 'ipex') cannot be used here, or None
    (for other backends torch's own list decides)."""
    return ipex_problem() if backend == "ipex" else None


def import_compile_backend(backend: str) -> None:
    """Import the optional package that registers this compile backend (after compile_backend_problem passed)."""
    if backend == "ipex":
        import intel_extension_for_pytorch  # noqa: F401  (optional; safe only once compile_backend_problem passed)
