"""PyTorch's docs, torch.optim "Weight Averaging (SWA and EMA)", "Putting it all together": SWA, with
``swa_model = AveragedModel(model)``, CosineAnnealingLR and ``SWALR(optimizer, swa_lr=0.05)`` both built on the
optimizer before the loop; each epoch the batches (zero_grad, loss_fn(model(input), target).backward(), step), then
past swa_start ``swa_model.update_parameters(model)`` and ``swa_scheduler.step()``, else ``scheduler.step()``; at
the end ``update_bn(loader, swa_model)`` and ``preds = swa_model(test_input)``. And EMA (``build_ema``):
``AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))`` updated after every optimizer step, update_bn and
the predictions at the end.

The model: a small CNN with BatchNorm (what update_bn is for) and SGD with momentum, on real 8x8 digits in batches
of 8; an epoch is one batch (upstream: the whole loader), T_max=4 and swa_start=0 (upstream 300 and 160), decay 0.9
(upstream 0.999, which would hide three steps). The run's calls: run.model, run.autocast(), run.backward(loss),
run.step(); the averaged model, its schedulers and update_bn over run.loader are the user's, on the user's model."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn, update_bn
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}
FAILS = {}
EPOCH, SWA_START = 1, 0


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


class Train(Loop):
    name = "swa"
    ema = False

    def prepare(self, held):  # before the loop, as the docs build them
        optimizer, model = held.optimizer, held.model
        if self.ema:
            self.swa_model = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        else:
            self.swa_model = AveragedModel(model)
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
            self.swa_scheduler = SWALR(optimizer, swa_lr=0.05)
        self.test_input = digits(samples=64)[0][48:]

    def start(self, held, run):
        self.run = run

    def step(self, index, run, held, batch, loss_of):
        input, target = batch
        with run.autocast():
            loss = F.cross_entropy(run.model(input), target)
        run.backward(loss)
        run.step()  # optimizer.step() and zero_grad()
        if self.ema:
            self.swa_model.update_parameters(held.model)
        elif (index + 1) % EPOCH == 0:
            epoch = index // EPOCH
            if epoch > SWA_START:
                self.swa_model.update_parameters(held.model)
                self.swa_scheduler.step()
            else:
                self.scheduler.step()
        return loss.detach()

    def observed(self):
        update_bn(self.run.loader, self.swa_model)  # at the end
        with torch.no_grad():
            preds = self.swa_model(self.test_input)
        return {**{f"swa_model's {k}": v for k, v in self.swa_model.state_dict().items()}, "preds": preds}


class TrainEMA(Train):
    name = "ema"
    ema = True


def build(loop=Train) -> Setup:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = digits(samples=24)
    loader = DataLoader(TensorDataset(images, labels), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    return Setup(model, optimizer, loader, loop=loop())


def build_ema() -> Setup:
    return build(TrainEMA)
