"""pytorch/tutorials intermediate_source/pruning_tutorial.py: LeNet (two 3x3 convolutions, three linear layers) and
``torch.nn.utils.prune``: ``prune.global_unstructured(parameters_to_prune, pruning_method=prune.L1Unstructured,
amount=0.2)`` over the weights of conv1, conv2, fc1, fc2 and fc3, which moves each ``weight`` Parameter to
``weight_orig``, adds a ``weight_mask`` buffer and a forward pre-hook that computes ``weight`` before each forward;
pruned again (iterative pruning: a PruningContainer combines the masks), and at the end ``prune.remove(module,
'weight')`` makes it permanent. The tutorial prunes without training; here the pruned LeNet trains between the
pruning rounds as in its "Iterative Pruning" section, with SGD and cross entropy.

``build``: the first round before accelerate() (prune, then train), the second after the second step, mid-run, on the
user's model; ``prune.remove`` on every layer once the steps are done (what the loop observes: the permanent
weights and an evaluation). Real digits at 28x28 (LeNet's fc1 expects 16 * 5 * 5), batches of 8. The run's calls:
run.model, run.autocast(), run.backward(loss), run.step()."""
import torch
import torch.nn.functional as F
import torch.nn.utils.prune as prune
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {"prune": ("no module of type", "torch.fx cannot trace", "cannot run", "prune")}
FAILS = {}


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3)
        self.conv2 = nn.Conv2d(6, 16, 3)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), (2, 2))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(start_dim=1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x


def parameters_to_prune(model):
    return ((model.conv1, 'weight'), (model.conv2, 'weight'), (model.fc1, 'weight'), (model.fc2, 'weight'),
            (model.fc3, 'weight'))


def global_prune(model):
    prune.global_unstructured(parameters_to_prune(model), pruning_method=prune.L1Unstructured, amount=0.2)


class Train(Loop):
    name = "pruning_tutorial"
    again_at = 1  # the second round of pruning, after this step

    def __init__(self):
        self.test = digits(size=28, samples=64)[0][48:]

    def step(self, index, run, held, batch, loss_of):
        x, y = batch
        with run.autocast():
            loss = F.cross_entropy(run.model(x), y)
        run.backward(loss)
        run.step()
        return loss.detach()

    def after(self, index, held, run, loss):
        if index == self.again_at:
            global_prune(held.model)

    def start(self, held, run):
        self.model = held.model

    def observed(self):  # the steps done: the pruning made permanent, and the permanent model evaluated
        for module, name in parameters_to_prune(self.model):
            prune.remove(module, name)
        with torch.no_grad():
            return {"eval": self.model(self.test)}


def build() -> Setup:
    torch.manual_seed(0)
    model = LeNet()
    global_prune(model)  # the first round, before accelerate()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images, labels = digits(size=28, samples=48)
    loader = DataLoader(TensorDataset(images, labels), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    return Setup(model, optimizer, loader, loop=Train())
