"""Attack 12: a sharded checkpoint's shards hold, beside tensors, DCP's "bytes" items (every optimizer hyper-parameter:
lr, momentum, ...), and DCP's default planner reads each back with torch.load(weights_only=False): a crafted folder
(shards and a manifest to match: whoever writes the folder writes both) ran its code at run.load, though .metadata
itself is read with nothing called. The bytes are now read as weights only."""
import io
import pickle

import pytest
import torch
from test_attack3_sharded_metadata import Proof, digest
from torch.distributed.checkpoint.filesystem import _StorageInfo

import accel
from accel.errors import CheckpointError
from accel.run.checkpoint import checksum
from accel.testing import tiny_loader, tiny_model


def fsdp_run():
    model = tiny_model()
    return accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), ["fsdp"],
                            device="cpu")


def saved_folder(tmp_path):
    """An fsdp run's sharded checkpoint under tmp_path/ckpt, closed: its step folder."""
    run = fsdp_run()
    run.save(tmp_path / "ckpt")
    run.close()
    return tmp_path / "ckpt" / (tmp_path / "ckpt" / "latest").read_text().strip()


def test_a_shards_bytes_item_runs_nothing_at_run_load(tmp_path, one_rank):
    folder = saved_folder(tmp_path)
    proof = tmp_path / "it ran"
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    index = next(i for i in metadata.storage_data if i.fqn == "optimizer.param_groups.0.lr")
    shard = folder / metadata.storage_data[index].relative_path
    payload = io.BytesIO()
    torch.save(Proof(str(proof)), payload)
    metadata.storage_data[index] = _StorageInfo(shard.name, shard.stat().st_size, len(payload.getvalue()))
    with open(shard, "ab") as file:  # the lr's bytes now the crafted pickle, appended
        file.write(payload.getvalue())
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    meta = torch.load(folder / "accel.pt", weights_only=True)
    for name in (shard.name, ".metadata"):
        meta["files"][name] = ((folder / name).stat().st_size, digest(folder / name))
    meta["checksum"] = checksum(meta)
    torch.save(meta, folder / "accel.pt")

    other = fsdp_run()
    try:
        with pytest.raises(CheckpointError):
            other.load(tmp_path / "ckpt")
    finally:
        other.close()
    assert not proof.exists(), "the shard's pickle ran at run.load"
