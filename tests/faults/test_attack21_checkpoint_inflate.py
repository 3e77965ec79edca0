"""A checkpoint small on disk and huge once read: torch.save writes a zip archive whose entries are stored, but
torch.load reads deflated entries as well, and a record is read whole, at the size its zip header gives, before
torch compares it with the tensor it belongs to. A real run.save's checkpoint with one tensor's record replaced by
half a GiB of zeros, deflated: about two MiB on disk. accel bounds what a checkpoint's pickle unfolds to
(accel.plan.untrusted) but not what its archive inflates to: run.load refuses the file, after the half GiB."""
import zipfile
from pathlib import Path

import pytest
import torch
from injectors import objects, train

import accel
from accel.errors import CheckpointError

INFLATED = 512 << 20


def inflating(real: Path, hostile: Path, size: int) -> str:
    """real, with its first tensor record replaced by ``size`` zero bytes, deflated; the record's name."""
    with zipfile.ZipFile(real) as source, zipfile.ZipFile(hostile, "w") as target:
        victim = next(name for name in source.namelist() if "/data/" in name and not name.endswith(".pkl"))
        for info in source.infolist():
            entry = zipfile.ZipInfo(info.filename, info.date_time)
            if info.filename != victim:
                target.writestr(entry, source.read(info.filename))
                continue
            entry.compress_type, entry._compresslevel = zipfile.ZIP_DEFLATED, 1
            with target.open(entry, "w", force_zip64=True) as out:
                zeros = bytes(1 << 20)
                for _ in range(size >> 20):
                    out.write(zeros)
    return victim


def resident_peak_since_reset() -> int:
    """The process's peak resident bytes since reset_peak() (Linux's VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def resident() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # (Linux: the peak resident size starts again from now)


@pytest.fixture
def run_and_bomb(tmp_path):
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to measure a peak")
    run = accel.accelerate(*objects(), plan=["threads"], device="cpu")
    train(run, 1)
    run.save(tmp_path / "real.pt")
    inflating(tmp_path / "real.pt", tmp_path / "hostile.pt", INFLATED)
    yield run, tmp_path / "hostile.pt"
    run.close()


@pytest.mark.slow
def test_a_checkpoint_that_inflates_to_half_a_gib_is_refused_unread(run_and_bomb):
    run, hostile = run_and_bomb
    assert hostile.stat().st_size < 8 << 20  # (a few MiB on disk)
    before = {k: v.clone() for k, v in run.unwrap().state_dict().items()}
    now = resident()
    reset_peak()
    with pytest.raises(CheckpointError):
        run.load(hostile)
    grew = resident_peak_since_reset() - now
    assert all(torch.equal(v, run.unwrap().state_dict()[k]) for k, v in before.items())
    assert grew < 64 << 20, f"run.load of a {hostile.stat().st_size >> 10} KiB file took {grew >> 20} MiB"
