"""GPU tests: a time limit per test, shorter than the suite's (tests/time_limit.py), Hugging Face offline, and cuBLAS
set up to be reproducible before any CUDA work.

A test stuck inside a CUDA or NCCL call is not interrupted by the alarm (Python runs the handler once the call
returns): benchmarks/gpu/run.sh bounds the whole pytest process, and pytest's faulthandler_timeout prints the stack.
"""
import os

import pytest
from gpu_helpers import LIMIT_S, reproducible  # noqa: F401  (a fixture of the GPU tests)
from time_limit import time_limit

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPU machine has no network: models are built from configs
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts: reproducible GEMMs


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with time_limit(getattr(getattr(item, "function", None), "limit_s", LIMIT_S), item.nodeid):
        yield
