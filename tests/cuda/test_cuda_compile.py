"""compile on the GPU with inductor (Triton kernels): the whole model, each repeated block in place (regional), and
the usual GPU stack channels_last + amp + compile, each training what the plain loop trains within its cards."""
import pytest
import torch
from gpu_helpers import DEVICE, ON_GPU, limit, on_gpu
from zoo import Case

from accel.testing import check_equivalence

pytestmark = [*ON_GPU, pytest.mark.usefixtures("reproducible")]


def compiled(plan, case):
    torch._dynamo.reset()  # a fresh dynamo cache: each test compiles its own model
    result = check_equivalence(plan, on_gpu(case), steps=3, device=DEVICE)
    assert result.failed is None and result.refused is None, f"{case}\n{result}"
    assert "compile" in result.applied and result.ok, f"{case}\n{result}"
    return result


@limit(120)
def test_inductor_compiles_the_whole_model_and_keeps_the_same_math():
    assert compiled(["compile"], Case("batchnorm", "dict", "mask", "shuffled", "adam")).keeps.weights == "float"


@limit(120)
def test_regional_compile_compiles_each_block_in_place_and_keeps_the_same_math():
    compiled([{"compile": {"regional": True}}], Case("blocks", "tuple", "none", "plain", "momentum"))


@limit(120)
def test_channels_last_amp_and_compile_together_keep_amps_card():
    result = compiled(["channels_last", "amp", "compile"], Case("batchnorm", "namedtuple", "none", "shuffled", "adamw"))
    assert result.applied == ["channels_last", "amp", "compile"] and result.keeps.weights == "tolerance"
