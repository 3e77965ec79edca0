"""Attack 13: read_small opens with O_NOFOLLOW (a link swapped into a shared plan cache is not followed), and the
sharded checkpoint's reads went through it: its ``latest`` and, since run.load hashes each shard as read, every shard.
A checkpoint folder whose files are links the user made (a Hugging Face hub snapshot, whose files are links to its
blobs; DVC's symlink cache; ``cp -rs``) was loaded before and was refused ('a symbolic link, not followed'). The
user chose those links; each file read through them is still checked (a regular file, its size and hash)."""
from __future__ import annotations

import shutil

import pytest
import torch

import accel
from accel.errors import CheckpointError
from accel.testing import tiny_loader, tiny_model


def fsdp_run(seed):
    model = tiny_model(seed)
    return accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), ["fsdp"], device="cpu")


def weights(run):
    return {k: v.full_tensor().clone() for k, v in run.unwrap().state_dict().items()}


def as_snapshot(saved, blobs, snapshot):
    """The folder as a hub snapshot: each file moved to blobs/ and linked from where it was."""
    blobs.mkdir()
    for index, file in enumerate(sorted(p for p in saved.rglob("*") if p.is_file())):
        link = snapshot / file.relative_to(saved)
        link.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(file, blobs / str(index))
        link.symlink_to(blobs / str(index))


@pytest.mark.slow
def test_a_checkpoint_folder_of_links_the_user_made_loads(tmp_path, one_rank):
    run = fsdp_run(0)
    try:
        for _, (x, y) in zip(range(2), run.loader):
            run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
            run.step()
        run.save(tmp_path / "ckpt")
        saved = weights(run)
    finally:
        run.close()
    as_snapshot(tmp_path / "ckpt", tmp_path / "blobs", tmp_path / "snapshot")
    other = fsdp_run(1)
    try:
        other.load(tmp_path / "snapshot")
        assert all(torch.equal(v, saved[k]) for k, v in weights(other).items())
        shard = next((tmp_path / "snapshot").glob("step-*/__0_*.distcp")).resolve()
        shard.write_bytes(shard.read_bytes()[::-1])  # a blob changed: still refused, by its hash
        with pytest.raises(CheckpointError, match="differs from what was saved"):
            other.load(tmp_path / "snapshot")
    finally:
        other.close()
