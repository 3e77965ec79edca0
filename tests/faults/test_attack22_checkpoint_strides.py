"""A checkpoint small on disk and huge once read, through the archive check: torch.save keeps a view's strides, so
a tensor of a stride of 0 over a storage of one number is a few bytes on disk and any size once made contiguous.
run.load's checksum makes every tensor contiguous (checkpoint.checksum) before anything compares its shape with the
model's, so a 2 KiB-record file allocates what its strides say: half a GiB here; with a size past what a storage
can count, a RuntimeError out of run.load, not a CheckpointError. refuse_inflating (the archive's entries hold no
more than the file) passes both: what a record's tensor spans is in the pickle, not the zip."""
from pathlib import Path

import pytest
import torch
from injectors import objects, train
from test_attack21_checkpoint_inflate import reset_peak, resident, resident_peak_since_reset

import accel
from accel.errors import CheckpointError


def strided(real: Path, hostile: Path, numel: int) -> None:
    """real, with its model's first tensor a view of ``numel`` numbers over one: its stride 0."""
    state = torch.load(real, weights_only=True)
    key = next(iter(state["model"]))
    state["model"][key] = torch.zeros(1).expand(numel)
    torch.save(state, hostile)


@pytest.fixture
def run_and_file(tmp_path):
    run = accel.accelerate(*objects(), plan=["threads"], device="cpu")
    train(run, 1)
    run.save(tmp_path / "real.pt")
    yield run, tmp_path
    run.close()


def test_a_view_past_any_storage_is_a_checkpoint_error(run_and_file):
    run, where = run_and_file
    strided(where / "real.pt", where / "hostile.pt", 2 ** 62)
    assert (where / "hostile.pt").stat().st_size < 1 << 20
    before = {k: v.clone() for k, v in run.unwrap().state_dict().items()}
    with pytest.raises(CheckpointError):
        run.load(where / "hostile.pt")
    assert all(torch.equal(v, run.unwrap().state_dict()[k]) for k, v in before.items())


def test_a_stride_zero_view_is_refused_unmade(run_and_file):
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to measure a peak")
    run, where = run_and_file
    strided(where / "real.pt", where / "hostile.pt", 128 << 20)  # float32: 512 MiB once contiguous
    assert (where / "hostile.pt").stat().st_size < 1 << 20
    now = resident()
    reset_peak()
    with pytest.raises(CheckpointError):
        run.load(where / "hostile.pt")
    grew = resident_peak_since_reset() - now
    size = (where / "hostile.pt").stat().st_size
    assert grew < 64 << 20, f"run.load of a {size >> 10} KiB file took {grew >> 20} MiB"
