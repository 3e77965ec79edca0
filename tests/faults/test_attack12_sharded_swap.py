"""Attack 12: a sharded checkpoint's shards are hashed against the manifest when run.load checks the folder, and DCP
then opened and read them again: a shard replaced in between (a shared folder's other writer, a save of another run)
was loaded unchecked, silently. The shards DCP reads are now the bytes checked (each hashed as it is read)."""
import sys

import pytest
import torch

import accel
import accel.run.sharded_checkpoint as sharded_checkpoint
from accel.errors import CheckpointError
from accel.testing import tiny_loader, tiny_model


def fsdp_run(seed: int):
    model = tiny_model(seed)
    return accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), ["fsdp"],
                            device="cpu")


def saved(root, seed: int):
    run = fsdp_run(seed)
    run.save(root)
    run.close()
    return root / (root / "latest").read_text().strip()


def test_a_shard_replaced_after_its_check_is_not_loaded(tmp_path, one_rank):
    folder, other = saved(tmp_path / "mine", 0), saved(tmp_path / "other", 1)
    shards = sorted(p.name for p in folder.glob("*.distcp"))

    def swap(frame, event, arg):  # as the load begins, after every check
        if event == "call" and frame.f_code is sharded_checkpoint.load.__code__:
            for name in shards:
                (folder / name).write_bytes((other / name).read_bytes())

    run = fsdp_run(2)
    before = [p.detach().clone() for p in run.unwrap().parameters()]
    sys.setprofile(swap)
    try:
        with pytest.raises(CheckpointError, match="changed"):
            run.load(tmp_path / "mine")
        assert all(torch.equal(a, b) for a, b in zip(before, run.unwrap().parameters()))
    finally:
        sys.setprofile(None)
        run.close()


def test_a_metadata_file_replaced_after_its_check_is_not_unpickled(tmp_path, one_rank):
    """DCP's .metadata decides which bytes of which shard go to which tensor: it was hashed with the folder's check,
    then opened again and unpickled, so one replaced in between (another model's) was read unchecked. Its bytes are
    now read once, hashed and unpickled from the same read (found by CK, the sibling of the shards' swap)."""
    folder = saved(tmp_path / "mine", 0)
    other_model = torch.nn.Sequential(torch.nn.Linear(8, 3))
    other = accel.accelerate(other_model, torch.optim.SGD(other_model.parameters(), lr=0.1), tiny_loader(), ["fsdp"],
                             device="cpu")
    other.save(tmp_path / "other")
    other.close()
    other_metadata = (tmp_path / "other" / (tmp_path / "other" / "latest").read_text().strip() / ".metadata")

    def swap(frame, event, arg):  # after the folder's check, as its metadata is read
        if event == "call" and frame.f_code is sharded_checkpoint.checked_metadata.__code__:
            (folder / ".metadata").write_bytes(other_metadata.read_bytes())

    run = fsdp_run(2)
    before = [p.detach().clone() for p in run.unwrap().parameters()]
    try:
        sys.setprofile(swap)
        try:
            with pytest.raises(CheckpointError, match="changed since run.load checked it"):
                run.load(tmp_path / "mine")
        finally:
            sys.setprofile(None)
        assert all(torch.equal(a, b) for a, b in zip(before, run.unwrap().parameters()))
    finally:
        run.close()


def test_a_manifest_without_the_metadata_file_is_refused_as_such(tmp_path, one_rank):
    """A manifest (accel.pt, its checksum redone) crafted without DCP's .metadata: nothing vouches for that file, and
    the error says so rather than that it changed since a check that never covered it."""
    folder = saved(tmp_path / "mine", 0)
    meta = torch.load(folder / sharded_checkpoint.META, weights_only=True)
    del meta["files"][".metadata"]
    with pytest.raises(CheckpointError, match="not in the checkpoint's list of files"):
        sharded_checkpoint.checked_metadata(folder / ".metadata", meta["files"])
