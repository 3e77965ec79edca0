"""pytorch/examples vae/main.py: the VAE (784-400-20 encoder, reparameterization, 20-400-784 decoder), Adam at 1e-3,
loss_function = binary cross-entropy summed + KL divergence; train() as upstream, with the run's calls.

Real digits resized to 28x28 stand in for MNIST."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


class Train(Loop):
    name = "vae"

    def step(self, index, run, held, batch, loss_of):
        data, _ = batch
        with run.autocast():
            recon_batch, mu, logvar = run.model(data)
        loss = loss_function(recon_batch.float(), data, mu.float(), logvar.float())
        run.backward(loss)
        run.step()
        return loss.detach()


def build() -> Setup:
    torch.manual_seed(1)
    model = VAE()
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    images, labels = digits(size=28, samples=16)
    loader = DataLoader(TensorDataset(images, labels), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    return Setup(model, optimizer, loader, loop=Train())
