"""The preservation contract on the GPU: zoo cases (zoo, drawn as tests/test_equivalence.py draws
them) trained on the GPU plainly and through a plan, held to each plan's cards (docs/contract.md). Every built-in
that runs in one process, in each of its configurations; plans of up to three drawn by hypothesis; ddp and fsdp in
a one-rank nccl group. The counts follow ACCEL_CUDA_ZOO_EXAMPLES (drawn plans; ddp and fsdp a third each, at
least 3)."""
import os

import pytest
import torch
from gpu_helpers import DEVICE, ON_GPU, limit, on_gpu
from hypothesis import given, settings
from scripts.launching import one_rank_env
from test_equivalence import COMMON, LOADER_REFUSES, OPTIONS, SLOW, cases, expect_kept, plans, sharded_cases
from zoo import BATCHES, EXTRAS, LOADERS, MODELS, OPTIMIZERS, Case

from accel.testing import check_equivalence

pytestmark = [*ON_GPU, pytest.mark.usefixtures("reproducible")]
DRAWN = int(os.environ.get("ACCEL_CUDA_ZOO_EXAMPLES", "8"))
GPU_SETTINGS = dict(SLOW, derandomize=True, database=None)  # the same cases on every run of the check


def on_the_gpu(plan, case: Case, steps: int = 3):
    """check_equivalence of one zoo case on the GPU; plans that compile start from an empty dynamo cache."""
    if any("compile" in entry for entry in plan):
        torch._dynamo.reset()
    return check_equivalence(list(plan), on_gpu(case), steps=steps, device=DEVICE)


def each_configuration():
    """(plan of one built-in, a zoo case) for every configuration of every built-in that runs in one process, the
    zoo's models, containers, extras, loaders and optimizers taken in turn; a model with repeated blocks where the
    configuration looks for them, and no loader that the loader accelerator refuses to change (its named
    refusals: workers over a stream, persistent workers)."""
    models = sorted(MODELS)
    for i, (name, options) in enumerate((n, o) for n in COMMON for o in OPTIONS[n]):
        blocks = name == "activation_checkpointing" and not options or options.get("regional")
        loaders = [k for k in LOADERS if name != "loader" or k not in ("stream", "sharded_stream", "workers")]
        yield {name: options}, Case("blocks" if blocks else models[i % len(models)], BATCHES[i % len(BATCHES)],
                                    EXTRAS[i % len(EXTRAS)], loaders[i % len(loaders)], OPTIMIZERS[i % len(OPTIMIZERS)])


CONFIGURATIONS = list(each_configuration())


@limit(30)
@pytest.mark.parametrize("plan,case", CONFIGURATIONS, ids=[f"{next(iter(p))}{i}" for i, (p, _) in
                                                          enumerate(CONFIGURATIONS)])
def test_every_built_in_alone_trains_on_the_gpu_what_the_plain_loop_trains(plan, case):
    result = on_the_gpu([plan], case)
    assert result.refused is None and result.applied == [next(iter(plan))], f"{case}\n{result}"
    expect_kept(result, case, plan)


@limit(120)
@settings(max_examples=DRAWN, **GPU_SETTINGS)
@given(case=cases, plan=plans(COMMON))
def test_plans_of_up_to_three_train_on_the_gpu_what_the_plain_loop_trains(case, plan):
    result = on_the_gpu(plan, case)
    assert result.refused is None or any(r in result.refused for r in LOADER_REFUSES), f"{case}\n{result}"
    expect_kept(result, case, plan)


# --- in a one-rank nccl group, as `torchrun --nproc-per-node 1` gives (last in this file: the group and the
# launcher's variables stay until the module ends) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def nccl_group():
    env = {**one_rank_env(), "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    if DEVICE.type == "cuda":
        torch.distributed.init_process_group("nccl", rank=0, world_size=1, device_id=DEVICE)
        torch.distributed.all_reduce(torch.ones(1, device=DEVICE))  # NCCL's communicator made now, not in a case
    else:  # the rehearsal on the CPU (gpu_helpers.REHEARSAL)
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


@limit(90)
@settings(max_examples=max(3, DRAWN // 3), **GPU_SETTINGS)
@given(case=cases, plan=plans(COMMON, required=("ddp",)))
def test_ddp_over_nccl_with_up_to_two_others(nccl_group, case, plan):
    result = on_the_gpu(plan, case)
    if result.refused:
        assert any(r in result.refused for r in LOADER_REFUSES), f"{case}\n{result}"
    else:
        assert "ddp" in result.applied, f"{case}\n{result}"
    expect_kept(result, case, plan)


@limit(90)
@settings(max_examples=max(3, DRAWN // 3), **GPU_SETTINGS)
@given(case=sharded_cases, plan=plans(COMMON, required=("fsdp",)))
def test_fsdp_over_nccl_with_up_to_two_others(nccl_group, case, plan):
    result = on_the_gpu(plan, case)
    if result.refused:
        assert any(r in result.refused for r in (*LOADER_REFUSES, "that are not the model's",
                                                     "in the middle of accumulating gradients under fsdp")), result
    else:
        assert "fsdp" in result.applied, f"{case}\n{result}"
    expect_kept(result, case, plan)
