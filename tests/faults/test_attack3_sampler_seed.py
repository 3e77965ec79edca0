"""Found from outside (attack3): "every part of a checkpoint is checked before anything reads it" (docs/contract.md),
but the sampler's seed is only checked to sit in a mapping (checkpoint_fit.layout_problems: "sampler": mapping):
a file whose seed is text, a float or past 64 bits loads without a word, sets the DistributedSampler's seed, and the
user's next epoch raises inside torch (TypeError, RuntimeError, ValueError), not accel's CheckpointError. Its
sibling: an optimizer param group's settings (lr as text, betas of one value, weight_decay None) load the same way
and raise at the user's next step."""
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import accel
from accel.errors import CheckpointError
from accel.run.checkpoint import checksum
from accel.testing import tiny_loader, tiny_model, tiny_optimizer, train_steps


def sharded_loader():
    """The user's own loader with a DistributedSampler (as a launched script builds it), here for one replica."""
    data = tiny_loader().dataset
    return DataLoader(data, batch_size=16, sampler=DistributedSampler(data, num_replicas=1, rank=0, seed=3))


def tampered(path, loader, change):
    """A checkpoint of two steps of the plain plan, changed by ``change(state)``, its checksum made to match."""
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), loader, [], device="cpu")
    train_steps(run, 2)
    run.save(path)
    run.close()
    state = torch.load(path, weights_only=True)
    change(state)
    state["checksum"] = checksum(state)
    torch.save(state, path)


@pytest.mark.parametrize("seed", ["x", 1.5, 2**70], ids=["text", "float", "past-64-bits"])
def test_a_checkpoints_sampler_seed_is_checked_before_it_is_set(tmp_path, seed):
    tampered(tmp_path / "ckpt.pt", sharded_loader(), lambda state: state["sampler"].update(seed=seed))

    model = tiny_model(1)
    run = accel.accelerate(model, tiny_optimizer(model), sharded_loader(), [], device="cpu")
    try:
        try:
            run.load(tmp_path / "ckpt.pt")
        except CheckpointError:
            assert run.loader.loader.sampler.seed == 3  # refused, nothing changed: the fix
            return
        train_steps(run, 2)  # or taken in a form that trains
    finally:
        run.close()


@pytest.mark.parametrize("key, value", [("lr", "fast"), ("betas", [1.0]), ("weight_decay", None)],
                         ids=["lr-text", "betas-one", "weight_decay-none"])
def test_a_checkpoints_param_group_settings_are_checked_before_they_are_set(tmp_path, key, value):
    tampered(tmp_path / "ckpt.pt", tiny_loader(),
             lambda state: state["optimizer"]["param_groups"][0].update({key: value}))

    model = tiny_model(1)
    optimizer = tiny_optimizer(model)
    run = accel.accelerate(model, optimizer, tiny_loader(), [], device="cpu")
    try:
        try:
            run.load(tmp_path / "ckpt.pt")
        except CheckpointError:
            assert optimizer.param_groups[0]["lr"] == 0.01  # refused, nothing changed: the fix
            return
        train_steps(run, 2)  # or taken in a form that trains
    finally:
        run.close()
