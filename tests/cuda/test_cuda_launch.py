"""ddp and fsdp (with and without cpu_offload, and fsdp beside amp) over nccl, started by `accel launch
--nproc-per-node 1`: one launched rank trains the plain loop and then each plan on its GPU
(tests/cuda/launched_cuda.py), and each plan trains what the plain loop trained, within its card."""
import json
import math
import os
import sys

import pytest
import torch
from gpu_helpers import DEVICE, ON_GPU, limit
from scripts.launching import free_port, output, run

from accel.testing.comparison import distance

pytestmark = ON_GPU
SCRIPT = os.path.join(os.path.dirname(__file__), "launched_cuda.py")
PLANS = {"ddp": [{"ddp": {}}], "fsdp": [{"fsdp": {}}], "fsdp_cpu_offload": [{"fsdp": {"cpu_offload": True}}],
         "fsdp_amp": [{"fsdp": {}}, "amp"]}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One `accel launch` of one rank for every plan (a process start, CUDA's and nccl's, paid once)."""
    out = tmp_path_factory.mktemp("launched") / "results.pt"
    device = [] if DEVICE.type == "cuda" else ["--device", "cpu"]  # the rehearsal on the CPU (gloo)
    result = run([sys.executable, "-m", "accel", "launch", "--nproc-per-node", "1", f"--master-port={free_port()}",
                  SCRIPT, "--out", str(out), "--plans", json.dumps(list(PLANS.values())), *device], timeout=240)
    assert result.returncode == 0 and out.exists(), output(result)
    return torch.load(out, weights_only=False)


@limit(250)
@pytest.mark.parametrize("name", list(PLANS))
def test_a_launched_rank_trains_on_its_gpu_over_nccl_what_the_plain_loop_trains(launched, name):
    plain, mine = launched["[]"], launched[json.dumps(PLANS[name])]
    assert "error" not in plain, plain.get("error")
    assert "error" not in mine, mine["error"]
    wrapper = next(iter(PLANS[name][0]))
    row = next(r for r in mine["report"]["accelerators"] if r["name"] == wrapper)
    assert row["status"] == "applied", row
    assert mine["device"] == str(DEVICE)
    if DEVICE.type == "cuda":  # (the rehearsal on the CPU runs gloo on the CPU)
        assert "nccl" in mine["backend"] and row["changes"]["device"] == str(DEVICE), (mine["backend"], row)
    assert row["changes"]["rank"] == "0/1" and row["changes"]["launcher"] == "torchrun"
    offloaded = "cpu_offload" in name
    assert mine["parameters_on"] == ["cpu" if offloaded else str(DEVICE)]
    assert mine["optimizer_state_on"] == ["cpu" if offloaded else str(DEVICE)]
    if offloaded:
        assert "cpu_offload" in row["changes"]
    if wrapper == "fsdp":
        assert mine["checkpoint"] == {"step": len(mine["losses"]), "same": True}
    assert mine["params_on"] == [str(DEVICE)]  # run.close() gave your own parameters back, on the device
    assert all(math.isfinite(loss) for loss in mine["losses"])
    precise = "amp" not in name  # amp: lower precision within its tolerance card; else the same math
    gap = distance(plain["params"], mine["params"])
    assert gap <= (1e-3 if precise else 0.5), f"{name}: relative distance {gap:.3g} from the plain loop's weights"
    mean = sum(mine["losses"]) / len(mine["losses"])
    reference = sum(plain["losses"]) / len(plain["losses"])
    assert abs(mean - reference) <= (1e-4 if precise else 0.05) * abs(reference), (mine["losses"], plain["losses"])
