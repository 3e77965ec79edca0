"""What the GPU tests share: the device, the skip where there is none, a per-test time limit, zoo cases on the GPU.

Every test in tests/cuda is marked ``cuda`` and skipped with the reason where torch sees no CUDA device, so the
suite passes on CPU machines; ``bash benchmarks/gpu/run.sh`` runs them on a GPU machine (docs/gpu.md).
"""
from __future__ import annotations

import functools
import os

import pytest
import torch

REHEARSAL = os.environ.get("ACCEL_CUDA_TESTS_ON_CPU") == "1"  # run their code on the CPU, to catch mistakes
# before GPU minutes are spent (the assertions about the GPU then fail; never in CI)
HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cpu") if REHEARSAL and not HAS_CUDA else torch.device("cuda", 0)
NO_CUDA = (f"no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda}, "
           "torch.cuda.is_available() is False): run on a GPU machine with benchmarks/gpu/run.sh (docs/gpu.md)")
ON_GPU = [pytest.mark.cuda, pytest.mark.skipif(not (HAS_CUDA or REHEARSAL), reason=NO_CUDA)]  # each file's marks
LIMIT_S = float(os.environ.get("ACCEL_CUDA_TEST_LIMIT_S", "60"))  # a test's time limit (tests/cuda/conftest.py)


def limit(seconds: float):
    """This test's own time limit, for the few that compile or launch processes."""
    def mark(test):
        test.limit_s = seconds
        return test
    return mark


def on_gpu(case):
    """The zoo case's objects with the model on the GPU before accelerate(), as a GPU user writes it (the harness
    compares the user's objects before and after accelerate(): a model accel moved would count as changed), and its
    evaluation reading held-out digits on the model's device."""
    def build():
        setup = case.build()
        setup.model.to(DEVICE)  # in place: the optimizer's parameters are the same objects
        setup.evaluate = functools.partial(evaluate_on_device, masked=setup.evaluate.keywords["masked"])
        return setup
    return build


def evaluate_on_device(model: torch.nn.Module, masked: bool) -> torch.Tensor:
    """zoo.evaluate, with the held-out digits moved to the model's device."""
    import zoo

    images, _, mask, _ = zoo.digits(samples=128)
    device = next(model.parameters()).device
    images, mask = images[96:112].to(device), mask[96:112].to(device)
    output = model(images, mask) if masked else model(images)
    return output["main"] if isinstance(output, dict) else output


@pytest.fixture
def reproducible():
    """cuDNN's deterministic kernels, no TF32 and no benchmark search while the test runs: two trainings that differ
    only by a plan then differ only by what the plan does (the GPU's own run-to-run differences and TF32's rounding
    would show as differences beyond an exact or float card). amp's own TF32 and benchmark settings still apply
    inside its runs, under its tolerance card."""
    flags = (torch.backends.cudnn, "deterministic", True), (torch.backends.cudnn, "benchmark", False), \
        (torch.backends.cudnn, "allow_tf32", False), (torch.backends.cuda.matmul, "allow_tf32", False)
    saved = [getattr(obj, name) for obj, name, _ in flags]
    for obj, name, value in flags:
        setattr(obj, name, value)
    yield
    for (obj, name, _), value in zip(flags, saved):
        setattr(obj, name, value)
