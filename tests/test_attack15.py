"""Attack 15: what the session's "same behaviour" simplifications of the core changed.

A plan file is read as any file from outside is (accel.files.read_small): a huge one, however sparse, is refused
unread."""
from __future__ import annotations

import tracemalloc

import pytest

from accel.errors import PlanError
from accel.plan import Plan


def test_a_huge_plan_file_is_refused_unread(tmp_path):
    path = tmp_path / "plan.yaml"
    with open(path, "wb") as file:
        file.truncate(64 << 20)  # sparse: nothing on the disk, 64 MiB when read
    tracemalloc.start()
    try:
        with pytest.raises(PlanError) as refused:
            Plan(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "64.0 MiB" in str(refused.value)
    assert peak < 8 << 20  # not read into memory
