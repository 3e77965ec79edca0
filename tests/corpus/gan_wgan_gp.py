"""eriklindernoren/PyTorch-GAN implementations/wgan_gp/wgan_gp.py: the Generator (Linear blocks with
BatchNorm1d(out, 0.8) and LeakyReLU, Tanh) and the Discriminator (a critic: Linear and LeakyReLU, no sigmoid), two
Adams at lr 2e-4 and betas (0.5, 0.999); each batch: the critic on the real images and on G(z), the gradient penalty
(interpolates between real and fake with numpy's uniform weights, ``autograd.grad(d_interpolates, interpolates,
create_graph=True, retain_graph=True)``, the squared distance of each gradient's norm from 1: a double backward
through the critic), d_loss = -mean(real) + mean(fake) + lambda_gp * penalty, backward, the critic's step,
optimizer_G.zero_grad(), and every n_critic batches the generator's loss -mean(D(G(z))) and its step.

latent_dim 8 and 8x8 real digits (upstream 100 and 28x28 MNIST), n_critic 2 (upstream 5), batches of 4. One run per
network, as in the dcgan port: the critic is the model the harness compares, the generator's weights what the loop
observes. The run's calls: run.model for every forward of the critic (the penalty's too), run.backward, run.step;
the zero_grad calls are upstream's own."""
import numpy as np
import torch
import torch.autograd as autograd
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from accel.api import accelerate
from accel.errors import PlanError
from accel.plan.contract import REGISTRY
from accel.testing import Loop, Setup

from . import digits

REFUSES = {"prune": ("no module of type",)}
FAILS = {}
latent_dim, channels, img_size, n_critic, lambda_gp = 8, 1, 8, 2, 10
img_shape = (channels, img_size, img_size)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()

        def block(in_feat, out_feat, normalize=True):
            layers = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(latent_dim, 16, normalize=False),
            *block(16, 32),
            *block(32, 64),
            nn.Linear(64, int(np.prod(img_shape))),
            nn.Tanh()
        )

    def forward(self, z):
        img = self.model(z)
        img = img.view(img.shape[0], *img_shape)
        return img


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(int(np.prod(img_shape)), 32),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(32, 16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(16, 1),
        )

    def forward(self, img):
        img_flat = img.view(img.shape[0], -1)
        validity = self.model(img_flat)
        return validity


def compute_gradient_penalty(D, real_samples, fake_samples):
    """Calculates the gradient penalty loss for WGAN GP"""
    alpha = torch.tensor(np.random.random((real_samples.size(0), 1, 1, 1)), dtype=torch.float32)
    interpolates = (alpha * real_samples + ((1 - alpha) * fake_samples)).requires_grad_(True)
    d_interpolates = D(interpolates)
    fake = torch.ones(real_samples.shape[0], 1, dtype=d_interpolates.dtype)
    gradients = autograd.grad(
        outputs=d_interpolates,
        inputs=interpolates,
        grad_outputs=fake,
        create_graph=True,
        retain_graph=True,
        only_inputs=True,
    )[0]
    gradients = gradients.view(gradients.size(0), -1)
    gradient_penalty = ((gradients.norm(2, dim=1) - 1) ** 2).mean()
    return gradient_penalty


class Train(Loop):
    name = "wgan_gp"

    def prepare(self, held):
        torch.manual_seed(2)
        self.generator = Generator()
        self.optimizer_G = torch.optim.Adam(self.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def start(self, held, run):  # the generator's own run, with the plan (what needs a loader aside)
        np.random.seed(3)
        plan = [{n: o} for n, o in run.plan.to_dict().items() if "loader" not in REGISTRY[n].requires]
        try:
            self.runG = accelerate(self.generator, self.optimizer_G, None, plan=plan, device=run.device)
        except PlanError as error:
            refused = {problem.accelerator for problem in error.problems}
            plan = [entry for entry in plan if next(iter(entry)) not in refused]
            self.runG = accelerate(self.generator, self.optimizer_G, None, plan=plan, device=run.device)

    def step(self, i, run, held, batch, loss_of):
        runD, runG, optimizer_D = run, self.runG, held.optimizer
        imgs = batch[0]
        real_imgs = imgs
        optimizer_D.zero_grad()
        z = torch.tensor(np.random.normal(0, 1, (imgs.shape[0], latent_dim)), dtype=torch.float32)
        with runG.autocast():
            fake_imgs = runG.model(z)
        with runD.autocast():
            real_validity = runD.model(real_imgs)
            fake_validity = runD.model(fake_imgs)
            gradient_penalty = compute_gradient_penalty(runD.model, real_imgs.data, fake_imgs.data)
            d_loss = -torch.mean(real_validity) + torch.mean(fake_validity) + lambda_gp * gradient_penalty
        runD.backward(d_loss)
        runD.step()  # optimizer_D.step()
        self.optimizer_G.zero_grad()
        if i % n_critic == 0:
            with runG.autocast():
                fake_imgs = runG.model(z)
            with runD.autocast():
                fake_validity = runD.model(fake_imgs)
                g_loss = -torch.mean(fake_validity)
            runG.backward(g_loss)
            runG.step()  # optimizer_G.step()
        return d_loss.detach()

    def observed(self):
        return {f"generator's {k}": v for k, v in self.runG.unwrap().state_dict().items()}

    def finish(self):
        self.runG.close()


def build() -> Setup:
    torch.manual_seed(1)
    discriminator = Discriminator()
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    images, labels = digits(size=img_size, samples=16)
    loader = DataLoader(TensorDataset(images * 2 - 1, labels), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(1))  # Normalize([0.5], [0.5]), as upstream
    return Setup(discriminator, optimizer_D, loader, loop=Train())
