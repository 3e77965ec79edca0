"""Everything accel knows about the machine and the runtime, found without importing anything unsafe: the facts
(``Hardware``: a test or ``accel.decide(..., hardware=...)`` may make them up, tests/simulated_hardware.py) and probe(),
which finds them in /sys, /proc, this process's memory maps and installed metadata; what is installed and whether it
imports (a fresh interpreter for a package that may kill the one importing it: IPEX); the run's device. Where this
process sits in a launched job: launcher.py."""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import itertools
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from accel.errors import brief

__all__ = ["IPEX_IMPORT_HINTS", "ISA_FLAGS", "PACKAGE_BACKENDS", "Hardware", "device_model", "device_problem",
           "format_cpu_list", "hyperthread_siblings", "import_problem", "importable", "install_hint", "ipex_problem",
           "is_accelerator", "loaded_openmp", "package_version", "parse_cpu_list", "probe", "resolve_device",
           "torch_version"]


def torch_version() -> tuple[int, int]:
    """torch's (major, minor): what behaviour gates (IPEX's pin, fixes that came with a release) compare."""
    return tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


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


# torch.compile backends an optional package registers when imported: the backend -> (the package's module, why
# it cannot be imported here or None). The compile accelerator reads it; which package is safe to import is known here.
PACKAGE_BACKENDS = {"ipex": ("intel_extension_for_pytorch", ipex_problem)}


@dataclass(frozen=True)
class Hardware:
    logical_cpus: int
    physical_cores: int
    cpus_allowed: tuple[int, ...]  # this process's affinity mask
    physical_cpus: tuple[int, ...]  # one logical CPU per physical core, among those allowed
    numa_nodes: dict[int, tuple[int, ...]]
    isa: tuple[str, ...]
    cpu_model: str
    openmp: str  # "gnu", "intel", "llvm", "several: ..." or "none"
    devices: dict[str, int]  # device type -> count, cpu included
    versions: dict[str, str | None]
    torch_cpu_capability: str = ""

    @property
    def native_bf16(self) -> bool:
        """True when the CPU computes bf16 in hardware (AVX512-BF16 or AMX); else autocast emulates it slowly."""
        return "avx512_bf16" in self.isa or "amx_bf16" in self.isa

    @property
    def native_fp16(self) -> bool:
        return "avx512_fp16" in self.isa or "amx_fp16" in self.isa

    def to_dict(self) -> dict:
        data = asdict(self)
        data["numa_nodes"] = {str(k): list(v) for k, v in self.numa_nodes.items()}
        return data


def parse_cpu_list(text: str, cpus: int | None = None) -> tuple[int, ...]:
    """A CPU list as Linux writes it, '0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11). ``cpus``: the CPUs there are, which
    bounds every number before a range is built (a list from a variable: a range of a hundred billion is refused,
    never built). ValueError saying which part is wrong."""
    found: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        if not (low.strip().isdecimal() and (high.strip().isdecimal() or not high)):
            raise ValueError(f"{brief(part, 40)} is no CPU number or range of them")
        first, last = int(low), int(high or low)
        if last < first:
            raise ValueError(f"the range {part!r} ends before it starts")
        if cpus is not None and last >= cpus:
            raise ValueError(f"CPU {brief(last, 40)} is not on this machine, whose CPUs are 0-{cpus - 1}")
        found.extend(range(first, last + 1))
    return tuple(found)


def format_cpu_list(cpus: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5', the form GOMP_CPU_AFFINITY and taskset accept."""
    runs = [[cpu for _, cpu in run] for _, run in itertools.groupby(enumerate(sorted(cpus)), lambda p: p[1] - p[0])]
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


OPTIONAL_PACKAGES = ("torchvision", "nni", "intel-extension-for-pytorch", "intel-openmp", "oneccl_bind_pt",
                     "scikit-learn", "matplotlib")  # distribution names: their versions are reported

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")
OPENMP_LIBRARIES = {"libgomp": "gnu", "libiomp5": "intel", "libomp.": "llvm"}


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def hyperthread_siblings(cpus) -> tuple[int, ...]:
    """The logical CPUs that share a physical core with any of ``cpus`` (themselves excluded), from /sys; () where
    the topology is not exposed."""
    found: set[int] = set()
    for cpu in cpus:
        found.update(parse_cpu_list(_read(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")))
    return tuple(sorted(found - set(cpus)))


def _physical_cpus(allowed: tuple[int, ...]) -> tuple[int, ...]:
    """First logical CPU of each physical core (by package and core id), restricted to the allowed set."""
    seen: dict[tuple[str, str], int] = {}
    for cpu in allowed:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        key = (_read(topo / "physical_package_id").strip(), _read(topo / "core_id").strip())
        if key == ("", ""):
            key = ("cpu", str(cpu))  # no topology exposed: count every logical CPU as a core
        seen.setdefault(key, cpu)
    return tuple(sorted(seen.values()))


def loaded_openmp(maps: str | None = None) -> str:
    """Which OpenMP runtime this process has loaded, read from /proc/self/maps."""
    maps = _read("/proc/self/maps") if maps is None else maps
    found = sorted({kind for lib, kind in OPENMP_LIBRARIES.items() if lib in maps})
    if not found:
        return "none"
    return found[0] if len(found) == 1 else "several: " + ", ".join(found)


def _devices() -> dict[str, int]:
    devices = {"cpu": 1} | {kind: getattr(torch, kind).device_count() for kind in ("cuda", "xpu")
                            if getattr(torch, kind).is_available()}
    if torch.backends.mps.is_available():
        devices["mps"] = 1
    custom = torch._C._get_privateuse1_backend_name()
    module = getattr(torch, custom, None)
    if custom != "privateuseone" and module is not None and hasattr(module, "device_count"):
        devices[custom] = module.device_count()
    return devices


@functools.lru_cache(maxsize=1)
def probe() -> Hardware:
    """The machine as this process sees it (cached: the hardware does not change under us)."""
    try:
        allowed = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        allowed = tuple(range(os.cpu_count() or 1))
    physical = _physical_cpus(allowed)
    cpuinfo = _read("/proc/cpuinfo")
    flags = (re.findall(r"^flags\s*:\s*(.*)$", cpuinfo, re.M) or [""])[0].split()
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                **{name: package_version(name) for name in OPTIONAL_PACKAGES}}
    return Hardware(logical_cpus=os.cpu_count() or 1, physical_cores=len(physical), cpus_allowed=allowed,
                    physical_cpus=physical, isa=tuple(f for f in ISA_FLAGS if f in flags), openmp=loaded_openmp(),
                    numa_nodes={int(node.name[4:]): parse_cpu_list(_read(node / "cpulist")) for node in nodes},
                    cpu_model=(re.findall(r"^model name\s*:\s*(.*)$", cpuinfo, re.M) or [platform.processor()])[0],
                    devices=_devices(), versions=versions, torch_cpu_capability=torch.backends.cpu.get_cpu_capability())


def resolve_device(device: str | torch.device | None = "auto", local_rank: int = 0,
                   hardware: Hardware | None = None) -> torch.device:
    """'auto' picks cuda, xpu, mps, else cpu; a device type without an index picks this local rank's device; any
    torch device string is taken as is. ``hardware``: the machine to resolve for (default: this one)."""
    if device is None or device == "auto":
        devices = (hardware or probe()).devices
        device = next((k for k in ("cuda", "xpu", "mps") if devices.get(k)), "cpu")
    device = torch.device(device)
    if device.index is None and device.type not in ("cpu", "mps", "meta"):
        count = (hardware or probe()).devices.get(device.type, 0)
        return torch.device(device.type, local_rank if count > 1 else 0)
    return device


def device_problem(device: torch.device, hardware: Hardware) -> str | None:
    """Why a run cannot use this device here (absent, or an index past the last one), or None."""
    if device.type == "cpu":
        return None
    found = ", ".join(f"{kind} x{count}" if kind != "cpu" else kind for kind, count in hardware.devices.items())
    count = hardware.devices.get(device.type, 0)
    if not count:
        return f"there is no {device.type} device here (found: {found})"
    if device.index is not None and device.index >= count:
        return f"{device} does not exist: {count} {device.type} device(s) here, indices 0-{count - 1}"
    return None


def is_accelerator(device: torch.device) -> bool:
    """True for devices with their own memory (batches cross a bus to reach them)."""
    return device.type not in ("cpu", "meta")


def device_model(device: torch.device) -> str:
    """The device's type, and its model where torch names it (an H100's answer is not an A100's)."""
    module = getattr(torch, device.type, None)
    if device.type == "cpu" or not hasattr(module, "get_device_name"):
        return device.type
    return f"{device.type} {module.get_device_name(device)}"
