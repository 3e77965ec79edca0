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
