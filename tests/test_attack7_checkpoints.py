"""attack7: checkpoints run.save writes and run.load then refuses as 'not what run.save writes' (the load-time
layout check, checkpoint_fit.layout_problems, holds more than what run.save writes: commit ddc49d2 checked only
that each part unpickles). Each found by saving a real run and loading it into the same one."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

import accel


def setup(optimizer=lambda params: torch.optim.SGD(params, lr=0.1), sampler=None):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
    return model, optimizer(model.parameters()), DataLoader(data, batch_size=4, sampler=sampler)


def saved_and_loaded(tmp_path, **kwargs):
    """Train one epoch, run.save, and run.load the file into a fresh run of the same script; the new optimizer."""
    model, optimizer, loader = setup(**kwargs)
    run = accel.accelerate(model, optimizer, loader, plan=[])
    for x, y in run.loader:
        run.backward(nn.functional.mse_loss(run.model(x), y))
        run.step()
    run.save(tmp_path / "run.pt")
    run.close()
    model, optimizer, loader = setup(**kwargs)
    again = accel.accelerate(model, optimizer, loader, plan=[])
    try:
        again.load(tmp_path / "run.pt")  # fails on main: 'not a checkpoint run.save wrote (its ... is not what ...)'
    finally:
        again.close()
    return optimizer


class CountingSophia(torch.optim.SGD):
    """An optimizer that counts its steps in its state under a name, as Sophia-style optimizers do
    (``self.state["global_step"] = self.state.get("global_step", 0) + 1``): torch's state_dict keeps such a key as
    it is, and its load_state_dict restores it."""

    def step(self, closure=None):
        self.state["global_step"] = self.state.get("global_step", 0) + 1
        return super().step(closure)


def test_an_optimizer_state_kept_under_a_name_loads_back(tmp_path):
    optimizer = saved_and_loaded(tmp_path, optimizer=lambda params: CountingSophia(params, lr=0.1))
    assert optimizer.state["global_step"] == 4


class TextSeedSampler(Sampler):
    """A user's sampler whose ``seed`` is not an integer (a run name hashed by the sampler itself)."""

    def __init__(self, n, seed="run-a"):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(sum(map(ord, self.seed)) + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self):
        return self.n


def test_a_sampler_whose_seed_is_not_an_integer_does_not_make_its_checkpoints_unloadable(tmp_path):
    """run.load restores a sampler's seed only when it is an integer torch's generators take (or None); a user
    sampler's seed of another kind (text here) was written anyway, and every checkpoint of the run was refused."""
    saved_and_loaded(tmp_path, sampler=TextSeedSampler(16))


def test_under_fsdp_an_optimizer_state_kept_under_a_name_is_refused_by_name(monkeypatch, tmp_path):
    """torch's distributed checkpoint gathers an optimizer's state per parameter: run.save under fsdp raised a bare
    KeyError('global_step') from inside torch for the optimizer above. It is a CheckpointError naming the key, with
    nothing written, and the run goes on."""
    from scripts.launching import one_rank_env

    from accel.errors import CheckpointError
    from accel.workloads import TinyGPT

    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = CountingSophia(model.parameters(), lr=0.01)
    ids = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=4)
    run = accel.accelerate(model, optimizer, loader, plan=["fsdp"], device="cpu")
    try:
        for x, y in run.loader:
            run.backward(nn.functional.cross_entropy(run.model(x).flatten(0, 1), y.flatten()))
            run.step()
        with pytest.raises(CheckpointError, match="global_step"):
            run.save(tmp_path / "ckpt")  # fails on main: KeyError 'global_step' from get_state_dict
        assert not (tmp_path / "ckpt" / "latest").exists()
        run.backward(nn.functional.cross_entropy(run.model(x).flatten(0, 1), y.flatten()))
        run.step()
    finally:
        run.close()
