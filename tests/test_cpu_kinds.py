"""accel's decisions for every kind of machine it runs on, simulated, so each is tested on any machine: a Zen 3
(bf16 emulated), a Zen 4 (avx512_bf16), a Xeon with AMX and avx512_fp16, a GPU host, a 1-core container and a
2-socket Xeon with hyper-threads. Nothing here reads the CPU this test runs on."""
import pytest
import torch
from simulated_hardware import CPU_KINDS, simulated

import accel
from accel.accelerators.amp import Amp, auto_dtype, emulated
from accel.accelerators.loader import Loader
from accel.hardware import resolve_device
from accel.hardware.launcher import cores_for_rank
from accel.measure import peak_dtypes
from accel.search import generate_candidates
from accel.testing import tiny_loader, tiny_model, tiny_optimizer

CPU = torch.device("cpu")
# kind -> (bf16 autocast chosen by amp=auto on the CPU, fp16 native, physical cores, logical CPUs)
EXPECTED = {
    "zen3": (None, False, 2, 2),
    "zen4": (torch.bfloat16, False, 2, 2),
    "sapphire_rapids": (torch.bfloat16, True, 2, 2),
    "gpu_host": (torch.bfloat16, False, 16, 16),
    "one_core": (torch.bfloat16, False, 1, 1),
    "xeon_2s_smt": (None, False, 8, 16),
}


def test_every_kind_is_simulated_and_expected():
    assert set(CPU_KINDS) == set(EXPECTED)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_amp_chooses_bf16_only_where_the_cpu_computes_it_and_warns_of_emulation_where_it_does_not(kind):
    hardware = simulated(kind)
    dtype, cores, logical = EXPECTED[kind][0], EXPECTED[kind][2], EXPECTED[kind][3]
    assert (hardware.physical_cores, hardware.logical_cpus) == (cores, logical)
    assert auto_dtype(CPU, hardware)[0] is dtype
    decisions = accel.decide(tiny_model(), tiny_optimizer(tiny_model()), tiny_loader(), ["amp"], device="cpu",
                             hardware=hardware)
    assert decisions.compute_dtype is dtype
    if dtype is None:
        assert "no native bf16" in auto_dtype(CPU, hardware)[1]
    assert emulated(CPU, torch.bfloat16, hardware) is (dtype is None)
    assert emulated(CPU, torch.float16, hardware) is not EXPECTED[kind][1]
    assert not emulated(torch.device("cuda"), torch.float16, hardware)  # a GPU's dtypes are not the CPU's


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_threads_follow_physical_cores_and_workers_get_the_rest(kind):
    hardware = simulated(kind)
    decisions = accel.decide(tiny_model(), None, tiny_loader(), ["threads", "loader"], device="cpu",
                             hardware=hardware)
    cores, logical = EXPECTED[kind][2], EXPECTED[kind][3]
    assert decisions.threads == cores and len(decisions.cpus) == cores
    assert decisions.workers == logical - cores  # the hyper-threads feed the loader; no more than there is
    assert set(decisions.cpus) <= set(hardware.cpus_allowed)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_auto_searches_only_what_the_machine_can_serve(kind):
    hardware = simulated(kind)
    model = tiny_model()
    names = [next(iter(c)) for c in generate_candidates(hardware, model, tiny_optimizer(model), tiny_loader())]
    gpu = kind == "gpu_host"
    assert ("amp" in names) is (gpu or EXPECTED[kind][0] is not None)
    assert ("loader" in names) is (gpu or EXPECTED[kind][3] > EXPECTED[kind][2])  # spare CPUs or a bus to feed
    assert Amp.candidates(hardware, model) == ([{}] if gpu else [{"dtype": "bfloat16"}] if EXPECTED[kind][0] else [])
    assert ("loader" in names) is bool(Loader.candidates(hardware, model, loader=tiny_loader()))


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_roofline_holds_a_plan_against_the_peaks_this_machine_has(kind):
    hardware = simulated(kind)
    bf16, fp16 = EXPECTED[kind][0] is not None, EXPECTED[kind][1]
    assert peak_dtypes(CPU, hardware) == ["fp32"] + ["bf16"] * bf16 + ["fp16"] * fp16
    assert peak_dtypes(torch.device("cuda"), hardware) == ["fp32", "bf16", "fp16"]


def test_the_gpu_host_trains_on_its_gpu_and_each_rank_on_its_own():
    hardware = simulated("gpu_host")
    assert resolve_device("auto", hardware=hardware) == torch.device("cuda", 0)
    assert resolve_device("cpu", hardware=hardware) == CPU
    four = {**simulated("gpu_host").devices, "cuda": 4}
    from dataclasses import replace
    assert resolve_device("cuda", local_rank=3, hardware=replace(hardware, devices=four)) == torch.device("cuda", 3)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_ranks_share_the_physical_cores_without_overlap_or_go_round_robin_when_too_few(kind):
    physical = simulated(kind).physical_cpus
    for ranks in (1, 2, 4):
        shares = [cores_for_rank(physical, rank, ranks) for rank in range(ranks)]
        assert all(shares), shares  # never a rank without a core
        if ranks <= len(physical):
            flat = [cpu for share in shares for cpu in share]
            assert len(flat) == len(set(flat)) and set(flat) <= set(physical)  # disjoint, physical only
