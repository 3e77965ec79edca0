"""attack8: run.loader with a sampler of the user's that has set_epoch but cannot be a dict key (a dataclass, whose
__eq__ leaves it unhashable): run.loader remembers per sampler the epoch a run set on it, and iter(run.loader)
raised TypeError where the plain loop trains, on a loop that leaves the sampler to the run (docs/accelerators/ddp.md:
run.loader calls set_epoch every epoch)."""
from dataclasses import dataclass

import pytest
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

import accel
from accel.testing import tiny_model, tiny_optimizer


@dataclass(eq=True)
class EpochSampler(Sampler):
    """A shuffling sampler of the DistributedSampler kind (set_epoch reseeds), written as a dataclass."""
    n: int
    epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist())

    def __len__(self) -> int:
        return self.n


def epochs(loader, sampler, tell, n=3):
    """The loop's epochs; ``tell(epoch)`` numbers them for the sampler (None: the loop leaves it alone)."""
    seen = []
    for epoch in range(n):
        if tell is not None:
            sampler.set_epoch(tell(epoch))
        seen.append([y.tolist() for _, y in loader])
    return seen


@pytest.mark.parametrize("loop_tells", [True, False])
def test_an_unhashable_sampler_with_set_epoch_reads_the_plain_loop_s_batches(loop_tells):
    """Told by the loop (from 1), its order stays the loop's; left alone, run.loader numbers its epochs from 0."""
    data = TensorDataset(torch.randn(32, 1, 8, 8), torch.arange(32))
    sampler = EpochSampler(32)
    plain = epochs(DataLoader(data, batch_size=8, sampler=sampler), sampler,
                   (lambda epoch: epoch + 1) if loop_tells else (lambda epoch: epoch))
    sampler = EpochSampler(32)
    model = tiny_model(0)
    run = accel.accelerate(model, tiny_optimizer(model), DataLoader(data, batch_size=8, sampler=sampler), plan=[],
                           device="cpu")
    try:
        assert epochs(run.loader, sampler, (lambda epoch: epoch + 1) if loop_tells else None) == plain
    finally:
        run.close()
