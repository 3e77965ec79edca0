"""pytorch/examples dcgan/main.py: the Generator and Discriminator (transposed convolutions and convolutions with
BatchNorm, 64x64), weights_init, BCELoss, two Adams at lr 2e-4 and beta1 0.5; each batch, D on the real images and
on G's fake (detached), D's step, then G through D, G's step: the loop as upstream, with one run per network.

ngf = ndf = 4 and nz = 8 (upstream: 64, 64, 100); real digits resized to 64x64 stand in for MNIST (nc = 1). The
Discriminator is the model the harness compares, the Generator's weights what the loop built."""
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

from accel.api import accelerate
from accel.errors import PlanError
from accel.plan.contract import REGISTRY
from accel.testing import Loop, Setup

from . import digits

nz, ngf, ndf, nc = 8, 4, 4, 1
REFUSES = {}
FAILS = {"prune": "NNI's ModelSpeedup could not carry the masks"}  # through .view(-1, 1).squeeze(1) after Sigmoid


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find('BatchNorm') != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 8), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 8), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, input):
        output = self.main(input)
        return output.view(-1, 1).squeeze(1)


class Train(Loop):
    name = "dcgan"
    real_label, fake_label = 1, 0

    def prepare(self, held):
        torch.manual_seed(2)
        self.netG = Generator(0)
        self.netG.apply(weights_init)
        self.optimizerG = optim.Adam(self.netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
        self.criterion = nn.BCELoss()

    def start(self, held, run):  # the Generator's own run, with the plan (what needs a loader aside)
        plan = [{n: o} for n, o in run.plan.to_dict().items() if "loader" not in REGISTRY[n].requires]
        try:
            self.runG = accelerate(self.netG, self.optimizerG, None, plan=plan, device=run.device)
        except PlanError as error:  # prune needs a dummy input to prune a network without a loader
            refused = {problem.accelerator for problem in error.problems}
            plan = [entry for entry in plan if next(iter(entry)) not in refused]
            self.runG = accelerate(self.netG, self.optimizerG, None, plan=plan, device=run.device)

    def step(self, index, run, held, batch, loss_of):
        runD, runG, criterion = run, self.runG, self.criterion
        held.model.zero_grad()  # netD.zero_grad()
        real_cpu = batch[0]
        batch_size = real_cpu.size(0)
        label = torch.full((batch_size,), self.real_label, dtype=real_cpu.dtype)
        with runD.autocast():
            output = runD.model(real_cpu)
        errD_real = criterion(output.float(), label)
        runD.backward(errD_real)
        noise = torch.randn(batch_size, nz, 1, 1)
        with runG.autocast():
            fake = runG.model(noise)
        label.fill_(self.fake_label)
        with runD.autocast():
            output = runD.model(fake.detach())
        errD_fake = criterion(output.float(), label)
        runD.backward(errD_fake)
        runD.step()  # optimizerD.step()
        self.netG.zero_grad()
        label.fill_(self.real_label)
        with runD.autocast():
            output = runD.model(fake)
        errG = criterion(output.float(), label)
        runG.backward(errG)
        runG.step()  # optimizerG.step()
        return (errD_real + errD_fake).detach()

    def observed(self):
        return {f"netG's {k}": v for k, v in self.runG.unwrap().state_dict().items()}

    def finish(self):
        self.runG.close()


def build() -> Setup:
    torch.manual_seed(1)
    netD = Discriminator(0)
    netD.apply(weights_init)
    optimizerD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    images, labels = digits(size=64, samples=12)
    loader = DataLoader(TensorDataset(images * 2 - 1, labels), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(1))  # Normalize((0.5,), (0.5,)), as upstream
    return Setup(netD, optimizerD, loader, loop=Train())
