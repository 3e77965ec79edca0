"""pytorch/examples mnist_rnn/main.py: Net (an LSTM over the image's 28 rows, input 28, hidden 64, batch_first; its
last output through BatchNorm1d, Dropout2d(0.25), a linear layer, ReLU, Dropout2d(0.5), a linear layer,
log_softmax), Adadelta at lr 0.1 and StepLR(step_size=1, gamma=0.7) built before training, F.nll_loss; train() as
upstream, with the run's calls.

Real digits resized to MNIST's 28x28 stand in for MNIST (the LSTM reads 28 rows of 28 values); 16 samples in
batches of 8 (upstream 64). Upstream applies Dropout2d to the (batch, 64) features, which torch warns of and
reads as one channel per sample: kept as upstream has it."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Setup

from . import digits
from . import examples_mnist as mnist

REFUSES = {}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(input_size=28, hidden_size=64, batch_first=True)
        self.batchnorm = nn.BatchNorm1d(64)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout2d(0.5)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, input):
        input = input.reshape(-1, 28, 28)
        output, hidden = self.rnn(input)
        output = output[:, -1, :]
        output = self.batchnorm(output)
        output = self.dropout1(output)
        output = self.fc1(output)
        output = F.relu(output)
        output = self.dropout2(output)
        output = self.fc2(output)
        output = F.log_softmax(output, dim=1)
        return output


class Train(mnist.Train):
    """train() is mnist/main.py's, line for line (and StepLR's step per epoch with it)."""

    name = "mnist_rnn"


def build() -> Setup:
    torch.manual_seed(1)
    images, labels = digits(size=28, samples=16)
    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(images, labels), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    return Setup(model, optimizer, loader, loop=Train())
