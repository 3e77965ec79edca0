"""plan="auto"'s run.load read a single-file checkpoint three times (the plan it takes, the fit check, the load),
and a sharded one's accel.pt twice with every shard hashed twice: each read a fresh chance for a file replaced in
between to be loaded unchecked. Now it is read and checked once, and that state serves the plan, the fit and the
load. Each read counted at the one reader (checkpoint.load_file) and the one hasher (sharded_checkpoint._digest),
each wrapped to count and still read."""
import collections

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
import accel.run.checkpoint as checkpoint
import accel.run.sharded_checkpoint as sharded_checkpoint
from accel.search import inloop

DIGITS = load_digits()
DATA = TensorDataset(torch.tensor(DIGITS.data[:64], dtype=torch.float32) / 16, torch.tensor(DIGITS.target[:64]))


def objects(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), DataLoader(DATA, batch_size=16)


def train(run, steps):
    for _, (x, y) in zip(range(steps), run.loader):
        run.backward(nn.functional.cross_entropy(run.model(x), y))
        run.step()


@pytest.fixture
def reads(monkeypatch):
    """The name of every file the checkpoint reader loads and the shard hasher hashes, each time."""
    seen = collections.Counter()
    load_file, digest = checkpoint.load_file, sharded_checkpoint._digest

    def counted(function):
        def read(path):
            seen[path.name] += 1
            return function(path)
        return read

    monkeypatch.setattr(checkpoint, "load_file", counted(load_file))
    monkeypatch.setattr(sharded_checkpoint, "_digest", counted(digest))
    return seen


def test_auto_reads_a_checkpoint_file_once(tmp_path, monkeypatch, reads):
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    run = accel.accelerate(*objects(0), [{"grad_accumulation": {"steps": 2}}], device="cpu")
    train(run, 3)
    run.save(tmp_path / "ckpt.pt")
    run.close()
    again = accel.accelerate(*objects(1), accel.Auto(cache=False, budget_s=5), device="cpu")
    try:
        info = again.load(tmp_path / "ckpt.pt")
        assert info["step"] == 3 and again.plan.names() == ["grad_accumulation"]
    finally:
        again.close()
    assert reads == {"ckpt.pt": 1}


def test_auto_reads_a_sharded_checkpoints_state_and_hashes_each_shard_once(tmp_path, monkeypatch, one_rank, reads):
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    run = accel.accelerate(*objects(0), ["fsdp"], device="cpu")
    train(run, 2)
    run.save(tmp_path / "shards")
    run.close()
    reads.clear()  # the save hashes what it wrote
    again = accel.accelerate(*objects(1), accel.Auto(cache=False, budget_s=5), device="cpu")
    try:
        assert again.load(tmp_path / "shards")["step"] == 2
    finally:
        again.close()
    assert reads["accel.pt"] == 1 and set(reads.values()) == {1} and len(reads) > 2, reads
