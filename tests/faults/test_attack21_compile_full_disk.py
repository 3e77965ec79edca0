"""plan=["compile"] keeps inductor's compiled kernels in accel's cache folder (accel/accelerators/compile/cache.py),
and leaves torch's own folder in place where accel's "cannot be written", so that compile works as it does without
accel (a read-only cache: tests/faults/test_fault_disk.py). Whether it can be written is tried with an empty file:
on a disk with a few KiB left (a home quota, a small shared cache volume) the tag and the empty file fit, torch is
pointed there, and the first step of the loop fails in the middle, where g++ writes the kernel it compiled (an
InductorError, No space left on device); torch alone, in its own folder, trains."""
import os
import warnings

import pytest
import torch
from injectors import tmpfs

import accel
from accel.accelerators.compile import has_compiler


@pytest.mark.slow
def test_compile_with_a_cache_folder_on_an_almost_full_disk_trains_as_torch_compile_does(monkeypatch):
    if not has_compiler():
        pytest.skip("inductor on a CPU needs a C++ compiler")
    with tmpfs("256k") as disk:
        monkeypatch.setenv("ACCEL_CACHE_DIR", str(disk))
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())  # a pointwise op: a C++ kernel
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = accel.accelerate(model, optimizer, None, plan=["compile"], device="cpu")
            try:
                run.backward(run.model(torch.randn(2, 8)).sum())
                run.step()
            finally:
                run.close()
        assert not str(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")).startswith(str(disk))
