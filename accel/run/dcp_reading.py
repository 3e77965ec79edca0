"""Reading a torch.distributed.checkpoint (DCP) folder that may be hostile: DCP unpickles its .metadata and the
shards' bytes items with plain pickle and opens whatever paths .metadata names, so a crafted folder could run code
or hang run.load. These give DCP the metadata read once through a restricted unpickler, a reader that opens only the
manifest's own files and checks each one's hash as it reads it, and a planner that reads bytes items as weights only.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import pickle
from pathlib import Path
from typing import Any

import torch

from accel.errors import CheckpointError
from accel.files import read_small

__all__ = ["checked_metadata", "checked_reader", "weights_only_planner"]


def _allowed(module: str, name: str) -> bool:
    """What DCP's .metadata pickle names: its own metadata classes, torch's sizes, dtypes and layouts, paths."""
    if module == "torch.distributed.checkpoint.metadata":
        import torch.distributed.checkpoint.metadata as metadata

        return isinstance(getattr(metadata, name, None), type)
    if module == "torch.distributed.checkpoint.filesystem":
        return name == "_StorageInfo"
    if module == "torch":
        return name == "Size" or isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                         torch.memory_format))
    return (module, name) in {("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                              ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "Path")}


def checked_metadata(path: Path, files: dict[str, tuple[int, str]]) -> Any:
    """DCP's metadata, unpickled with nothing of it called beyond DCP's own metadata classes: DCP reads the file with
    pickle.load, so a crafted folder would run code at run.load. Read once, and those bytes hashed against the
    manifest (``files``): a file replaced since the folder's check is refused, never unpickled; DCP is handed this
    (``checked_reader``), never the file again."""
    from torch.distributed.checkpoint.metadata import Metadata

    size, digest = files.get(path.name, (0, None))
    if digest is None:  # a manifest crafted without it: nothing vouches for the file
        raise CheckpointError(f"{path}: not in the checkpoint's list of files; nothing was loaded")
    try:
        data = read_small(path.resolve(), size)  # (a link the user made followed, as for the shards)
    except OSError as error:
        raise CheckpointError(f"{path}: changed since run.load checked it ({error.strerror}); nothing was loaded") \
            from error
    if hashlib.blake2b(data, digest_size=20).hexdigest() != digest:
        raise CheckpointError(f"{path}: changed since run.load checked it (size or hash); nothing was loaded")

    found: list[str] = []

    class Names(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if not _allowed(module, name):
                found.append(f"{module}.{name}")
                raise pickle.UnpicklingError(f"{module}.{name}")
            return super().find_class(module, name)

    try:
        metadata = Names(io.BytesIO(data)).load()
    except Exception as error:  # a damaged pickle is foreign too
        metadata = found[0] if found else f"a pickle that does not load ({type(error).__name__})"
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path}: holds {metadata if isinstance(metadata, str) else type(metadata).__name__}, "
                              "beyond what torch's distributed checkpoints write: not an accel checkpoint, and nothing "
                              "of it was run or loaded")
    return metadata


def checked_reader(where: Path, metadata: Any, files: dict[str, tuple[int, str]]) -> Any:
    """DCP's reader of the folder's shards, with the metadata ``checked_metadata`` read and checked, and each shard
    read whole and hashed against the manifest (``files``) as DCP opens it: the check the sharded checkpoint's
    ``read`` made was of the files then, and one replaced since would be loaded unchecked. Only the manifest's files
    of the folder, as regular files: the metadata names the path of each (a pipe elsewhere would be waited on)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.filesystem import FileSystem
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Hashed(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Any:
            size, digest = files.get(Path(path).name, (0, None)) if Path(path).parent == where else (0, None)
            if digest is None:
                raise CheckpointError(f"{path}: named by .metadata, not a file of the checkpoint's manifest")
            data = read_small(Path(path).resolve(), size)  # (a link the user made followed: its bytes are hashed)
            if hashlib.blake2b(data, digest_size=20).hexdigest() != digest:
                raise CheckpointError(f"{path}: changed since run.load checked it (size or hash); nothing was loaded")
            yield io.BytesIO(data)

    class Checked(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:  # as FileSystemReader's, from the checked one
            metadata.storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    reader = Checked(str(where))
    reader.fs = Hashed()
    return reader


def weights_only_planner() -> Any:
    """DCP's default load planner, but a shard's bytes items (the optimizer's hyper-parameters) are read as weights
    only before DCP unpickles them: DCP's own reads them with torch.load(weights_only=False), so a crafted shard (its
    manifest written to match) would run code at run.load."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class WeightsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            torch.load(value, weights_only=True)  # raises on anything beyond plain data, with nothing of it called
            value.seek(0)
            super().load_bytes(read_item, value)

    return WeightsOnly()
