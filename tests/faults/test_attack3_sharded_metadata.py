"""Found from outside (attack3): a sharded checkpoint folder is data anyone may have written, like a single file, but
its ``.metadata`` is read with torch.distributed.checkpoint's FileSystemReader.read_metadata(), which is a plain
pickle.load: whatever the file names runs at run.load(folder). accel's manifest in accel.pt (each file's size and
blake2b) does not help: whoever writes the folder writes the manifest too, and the checksum covers tensors only."""
import hashlib
import pickle
import sys

import pytest
import torch

import accel
import accel.run.sharded_checkpoint as sharded_checkpoint
from accel.errors import CheckpointError
from accel.run.checkpoint import checksum
from accel.testing import tiny_loader, tiny_model


class Proof:
    """Unpickled as open(path, "w"): a file that appears when the pickle ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def digest(path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=20).hexdigest()


@pytest.fixture
def folder(tmp_path, one_rank):
    """A sharded checkpoint's step folder, as run.save wrote it (a gloo group of one)."""
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), ["fsdp"], device="cpu")
    run.save(tmp_path / "ckpt")
    run.close()
    return tmp_path / "ckpt" / (tmp_path / "ckpt" / "latest").read_text().strip()


def load(root, proof, swap=None):
    """run.load(root) into another fsdp run (``swap``: a profile hook meanwhile): what it returned or raised, and
    whether the proof's pickle ran."""
    model = tiny_model(1)
    other = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), ["fsdp"],
                             device="cpu")
    sys.setprofile(swap)
    try:
        outcome = other.load(root)
    except CheckpointError as error:
        outcome = error
    finally:
        sys.setprofile(None)
        other.close()
        ran = proof.exists()
        proof.unlink(missing_ok=True)
    return outcome, ran


def test_a_sharded_checkpoints_metadata_runs_nothing(tmp_path, folder):
    proof = tmp_path / "it ran"
    (folder / ".metadata").write_bytes(pickle.dumps(Proof(str(proof))))
    meta = torch.load(folder / "accel.pt", weights_only=True)
    meta["files"][".metadata"] = ((folder / ".metadata").stat().st_size, digest(folder / ".metadata"))
    meta["checksum"] = checksum(meta)
    torch.save(meta, folder / "accel.pt")
    outcome, ran = load(tmp_path / "ckpt", proof)
    assert isinstance(outcome, CheckpointError) and not ran, outcome


def test_a_metadata_replaced_after_its_check_is_never_read(tmp_path, folder):
    """The check read .metadata with nothing called, and then run.load had DCP read the file again, twice, with
    pickle.load: a .metadata replaced in between (a shared folder's other writer) ran. DCP is now handed the metadata
    the check read; the file is replaced here as the load begins, after every check (a profile hook times it)."""
    proof = tmp_path / "it ran"

    def swap(frame, event, arg):
        if event == "call" and frame.f_code is sharded_checkpoint.load.__code__:
            (folder / ".metadata").write_bytes(pickle.dumps(Proof(str(proof))))

    outcome, ran = load(tmp_path / "ckpt", proof, swap)
    assert not ran and outcome["step"] == 0, outcome  # the shards as checked
    assert (folder / ".metadata").read_bytes() == pickle.dumps(Proof(str(proof)))  # the swap happened
