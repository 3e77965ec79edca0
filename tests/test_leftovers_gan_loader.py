"""pytorch/examples' dcgan with one run per network (docs/two_models.md): the discriminator's run rebuilds the loader
with worker processes, and the generator's run is given the discriminator's run.loader, the loader that paces its
steps. The loop iterates the generator's run.loader; after a few steps the discriminator is done (frozen, its run
closed) and the generator trains on through it. Closing the discriminator's run stopped the workers under the
generator's epoch and marked its loader stopped: the open run's epoch raised 'the run was closed during this epoch',
and so did every later epoch of it. The run that reads the closed run's loader keeps it live; its workers stop once
no epoch of it is open."""
import multiprocessing
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel

sys.path.insert(0, str(Path(__file__).parent))
from corpus import digits  # noqa: E402
from corpus.examples_dcgan import Discriminator, Generator, nz, weights_init  # noqa: E402


@pytest.mark.slow
def test_the_generators_run_reads_the_closed_discriminators_rebuilt_loader_to_the_end():
    torch.manual_seed(1)
    netD, netG = Discriminator(0), Generator(0)
    netD.apply(weights_init)
    netG.apply(weights_init)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    images, labels = digits(size=64, samples=24)
    dataloader = DataLoader(TensorDataset(images * 2 - 1, labels), batch_size=4, shuffle=True,
                            generator=torch.Generator().manual_seed(1))
    runD = accel.accelerate(netD, optimizerD, dataloader, plan=[{"loader": {"num_workers": 2}}], device="cpu")
    assert runD.loader.loader is not dataloader  # rebuilt: its workers are the run's
    runG = accel.accelerate(netG, optimizerG, runD.loader, plan=[], device="cpu")
    criterion = nn.BCELoss()
    drawn = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: the loop uses only open runs
        for epoch in range(2):
            batches = 0
            for real_cpu, _ in runG.loader:
                batch_size = real_cpu.size(0)
                fake = runG.model(torch.randn(batch_size, nz, 1, 1))
                if not runD.closed:  # (1) update D
                    netD.zero_grad()
                    errD = criterion(runD.model(real_cpu), torch.ones(batch_size))
                    errD = errD + criterion(runD.model(fake.detach()), torch.zeros(batch_size))
                    runD.backward(errD)
                    runD.step()
                    if runD.steps == 2:  # the discriminator is done: frozen, its run closed
                        netD.requires_grad_(False)
                        runD.close()
                netG.zero_grad()  # (2) update G through D
                runG.backward(criterion(netD(fake), torch.ones(batch_size)))
                runG.step()
                batches += 1
            drawn.append(batches)
    assert drawn == [6, 6] and runG.steps == 12
    runG.close()
    assert multiprocessing.active_children() == []  # the workers stopped with the epochs that read them
