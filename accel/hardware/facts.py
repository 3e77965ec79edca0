"""Hardware: what accel knows about the machine and the runtime, as plain facts (probe() finds them; a test or
``accel.decide(..., hardware=...)`` may make them up, as the project's tests do: tests/simulated_hardware.py)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


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
