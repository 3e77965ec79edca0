"""pytorch/examples imagenet/main.py: models.__dict__[args.arch]() (--arch mobilenet_v3_small: one of the
torchvision models it offers, small enough here), CrossEntropyLoss, SGD with momentum 0.9 and weight decay 1e-4 at
lr 0.1 for its batch of 256 (scaled linearly to this batch), StepLR(30, 0.1); train(): output = model(images),
loss, accuracy (top-1, top-5), zero_grad, backward, step; as upstream, with the run's calls (the scheduler on
run.optimizer).

Real digits resized to 32x32 over 3 channels stand in for ImageNet (ten classes)."""
import torch
import torch.nn as nn
import torchvision.models as models
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


class Train(Loop):
    name = "imagenet"

    def start(self, held, run):
        self.criterion = nn.CrossEntropyLoss()
        self.scheduler = StepLR(run.optimizer, step_size=30, gamma=0.1)
        self.top1 = []

    def step(self, index, run, held, batch, loss_of):
        images, target = batch
        with run.autocast():
            output = run.model(images)
            loss = self.criterion(output, target)
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        self.top1.append(acc1[0])
        run.backward(loss)
        run.step()
        return loss.detach()

    def after(self, step, held, run, loss):
        self.scheduler.step()  # (per epoch upstream; a scheduler held from before accelerate() either way)


def build() -> Setup:
    torch.manual_seed(0)
    model = models.__dict__["mobilenet_v3_small"](num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), 0.1 * 4 / 256, momentum=0.9, weight_decay=1e-4)
    images, labels = digits(size=32, samples=8, channels=3)
    loader = DataLoader(TensorDataset(images, labels), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    return Setup(model, optimizer, loader, loop=Train())
