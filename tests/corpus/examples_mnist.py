"""pytorch/examples mnist/main.py: Net (two convolutions, dropout, two linear layers, log_softmax), Adadelta at lr 1.0
and StepLR(step_size=1, gamma=0.7) built before training, F.nll_loss; train() as upstream, with the run's calls.

Real digits resized to MNIST's 28x28 stand in for MNIST (the network's 9216 features need 28x28)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


class Train(Loop):
    """train(): optimizer.zero_grad(), output = model(data), F.nll_loss, backward, step; scheduler.step() per epoch
    (here every 2 batches, an epoch of the small loader), on run.optimizer (what accel's docs say: prune trains a
    copy with an optimizer of its own)."""

    name = "mnist"

    def start(self, held, run):
        self.scheduler = StepLR(run.optimizer, step_size=1, gamma=0.7)

    def step(self, index, run, held, batch, loss_of):
        data, target = batch
        with run.autocast():
            output = run.model(data)
        loss = F.nll_loss(output.float(), target)
        run.backward(loss)
        run.step()
        return loss.detach()

    def after(self, step, held, run, loss):
        if step % 2 == 1:
            self.scheduler.step()


def build() -> Setup:
    torch.manual_seed(1)
    images, labels = digits(size=28, samples=16)
    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    loader = DataLoader(TensorDataset(images, labels), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    return Setup(model, optimizer, loader, loop=Train())
