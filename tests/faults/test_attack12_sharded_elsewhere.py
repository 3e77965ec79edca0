"""Attack 12: DCP's .metadata names, for each item, the file that holds it (``_StorageInfo.relative_path``), and DCP
opens that path joined to the folder: a crafted .metadata (its manifest entry written to match) named a file outside
the folder, a named pipe there, and run.load waited on it for ever. The reader opens only the files of the folder's
manifest, as regular files of the size it says."""
import os
import pickle

import pytest
import torch
from test_attack3_sharded_metadata import digest
from test_attack12_sharded_bytes import fsdp_run, saved_folder
from time_limit import time_limit
from torch.distributed.checkpoint.filesystem import _StorageInfo

from accel.errors import CheckpointError
from accel.run.checkpoint import checksum


def test_a_metadata_naming_a_pipe_outside_the_folder_is_refused_without_waiting(tmp_path, one_rank):
    folder = saved_folder(tmp_path)
    os.mkfifo(tmp_path / "pipe")
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    index = next(i for i in metadata.storage_data if i.fqn == "optimizer.param_groups.0.lr")
    metadata.storage_data[index] = _StorageInfo(str(tmp_path / "pipe"), 0, 8)  # absolute: the join gives it whole
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    meta = torch.load(folder / "accel.pt", weights_only=True)
    meta["files"][".metadata"] = ((folder / ".metadata").stat().st_size, digest(folder / ".metadata"))
    meta["checksum"] = checksum(meta)
    torch.save(meta, folder / "accel.pt")

    other = fsdp_run()
    try:
        with time_limit(20, "run.load of a folder whose .metadata names a pipe"), pytest.raises(CheckpointError) as no:
            other.load(tmp_path / "ckpt")
    finally:
        other.close()
    assert "ran past its limit" not in str(no.value), no.value  # (DCP wraps what a read raised: the limit too)
