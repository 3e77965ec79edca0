"""The machines accel is run on, simulated: decisions tested for every CPU kind on whichever machine runs the test.

The kinds are the ones this project's machines come as (docs/machines.md): a Zen 3 (AVX2 and FMA only: bf16 is
emulated), a Zen 4 (avx512_bf16, no AMX, no native fp16), an Intel Xeon with AMX and avx512_fp16
(Sapphire Rapids or later), a GPU host, a 1-core container, and a 2-socket Xeon with hyper-threads and 2 NUMA
nodes. Pass one to ``accel.decide(..., hardware=simulated("zen3"))`` to see what a plan decides there.
"""
from __future__ import annotations

from dataclasses import replace

from accel.hardware import Hardware, probe

ZEN3_ISA = ("avx2", "fma")
ZEN4_ISA = ("avx2", "fma", "avx512f", "avx512_bf16")
AMX_ISA = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")

# kind -> (cpu model, ISA flags, logical CPUs, threads per core, NUMA nodes, GPUs)
CPU_KINDS: dict[str, tuple[str, tuple[str, ...], int, int, int, int]] = {
    "zen3": ("AMD EPYC 7B13 (Zen 3)", ZEN3_ISA, 2, 1, 1, 0),
    "zen4": ("AMD EPYC 9B14 (Zen 4)", ZEN4_ISA, 2, 1, 1, 0),
    "sapphire_rapids": ("Intel Xeon Platinum 8481C (Sapphire Rapids)", AMX_ISA, 2, 1, 1, 0),
    "gpu_host": ("AMD EPYC 9B14 (Zen 4)", ZEN4_ISA, 16, 1, 1, 1),
    "one_core": ("AMD EPYC 9B14 (Zen 4)", ZEN4_ISA, 1, 1, 1, 0),
    "xeon_2s_smt": ("Intel Xeon Gold 6338 (Ice Lake, 2 sockets)", ("avx2", "fma", "avx512f"), 16, 2, 2, 0),
}


def simulated(kind: str) -> Hardware:
    """A Hardware for one of CPU_KINDS: its CPU, cores, hyper-threads, NUMA nodes and devices; this machine's
    versions (what is installed is not simulated)."""
    model, isa, logical, per_core, nodes, gpus = CPU_KINDS[kind]
    cpus = tuple(range(logical))
    physical = cpus[::per_core] if per_core > 1 else cpus  # siblings numbered next to each other
    per_node = logical // nodes
    return replace(probe(), logical_cpus=logical, physical_cores=len(physical), cpus_allowed=cpus,
                   physical_cpus=physical, isa=isa, cpu_model=model, openmp="gnu",
                   numa_nodes={n: cpus[n * per_node:(n + 1) * per_node] for n in range(nodes)},
                   devices={"cpu": 1, **({"cuda": gpus} if gpus else {})}, torch_cpu_capability="")
