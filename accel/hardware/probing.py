"""The machine as this process sees it: ``Hardware``, the facts (a test or ``accel.decide(..., hardware=...)`` may
make them up: tests/simulated_hardware.py), and probe(), which finds them: cores, NUMA nodes and ISA flags in /sys
and /proc, the OpenMP runtime in this process's memory maps, package versions in installed metadata."""
from __future__ import annotations

import functools
import itertools
import os
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from accel.hardware.packages import package_version


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


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """A CPU list as Linux writes it, '0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


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


def _allowed_cpus() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return tuple(range(os.cpu_count() or 1))


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


def _numa_nodes() -> dict[int, tuple[int, ...]]:
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return {int(node.name[4:]): parse_cpu_list(_read(node / "cpulist")) for node in nodes}


def _cpuinfo() -> tuple[tuple[str, ...], str]:
    text = _read("/proc/cpuinfo")
    flags_line = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    return tuple(f for f in ISA_FLAGS if f in flags), (model.group(1) if model else platform.processor())


def loaded_openmp(maps: str | None = None) -> str:
    """Which OpenMP runtime this process has loaded, read from /proc/self/maps."""
    maps = _read("/proc/self/maps") if maps is None else maps
    found = sorted({kind for lib, kind in OPENMP_LIBRARIES.items() if lib in maps})
    if not found:
        return "none"
    return found[0] if len(found) == 1 else "several: " + ", ".join(found)


def _devices() -> dict[str, int]:
    devices = {"cpu": 1}
    if torch.cuda.is_available():
        devices["cuda"] = torch.cuda.device_count()
    if torch.xpu.is_available():
        devices["xpu"] = torch.xpu.device_count()
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
    allowed = _allowed_cpus()
    physical = _physical_cpus(allowed)
    isa, model = _cpuinfo()
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions.update({name: package_version(name) for name in OPTIONAL_PACKAGES})
    return Hardware(logical_cpus=os.cpu_count() or 1, physical_cores=len(physical), cpus_allowed=allowed,
                    physical_cpus=physical, numa_nodes=_numa_nodes(), isa=isa, cpu_model=model, openmp=loaded_openmp(),
                    devices=_devices(), versions=versions, torch_cpu_capability=torch.backends.cpu.get_cpu_capability())
