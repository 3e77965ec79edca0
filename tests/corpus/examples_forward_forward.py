"""pytorch/examples mnist_forward_forward/main.py: Hinton's forward-forward training. Net holds its Layers in a plain
Python list (no parameters of its own) and each Layer (an nn.Linear subclass) has its own Adam at lr 0.03, a
threshold, and a ``train(x_pos, x_neg)`` that overrides nn.Module.train: num_epochs times, the goodness of the
positive and the negative data (the squared activations' mean), loss = log1p(exp(cat([-g_pos + threshold, g_neg -
threshold]))).mean(), zero_grad, backward, step; then it returns its detached outputs, which the next layer trains on.
The data: the whole training set as one batch, the label overlaid on the first 10 pixels (overlay_y_on_x), negative
data with a wrong label drawn by get_y_neg; predict() picks the label of the largest summed goodness.

Smaller: dims [64, 32, 32] on real 8x8 digits (upstream 784, 500, 500 on MNIST), 48 images, 4 epochs per layer
(upstream 1000). One run per Layer, with its own optimizer and a loader of its one batch (each epoch one pass of
run.loader); the run's calls in Layer.train's place: run.model, run.autocast(), run.backward(loss), run.step().
``train_ff`` trains the whole net and returns each layer's losses: the plain loop is ``plan=None`` (no accel at all).
The harness's check_equivalence does not fit this loop: it calls ``model.train()``, which Layer overrides (upstream)."""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset

import accel

from . import digits

LR, THRESHOLD, EPOCHS = 0.03, 2.0, 4


def get_y_neg(y):
    y_neg = y.clone()
    for idx, y_samp in enumerate(y):
        allowed_indices = list(range(10))
        allowed_indices.remove(y_samp.item())
        y_neg[idx] = torch.tensor(allowed_indices)[torch.randint(len(allowed_indices), size=(1,))].item()
    return y_neg


def overlay_y_on_x(x, y, classes=10):
    x_ = x.clone()
    x_[:, :classes] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Net(torch.nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.layers = []
        for d in range(len(dims) - 1):
            self.layers = self.layers + [Layer(dims[d], dims[d + 1])]

    def predict(self, x):
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, label)
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness = goodness + [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        goodness_per_label = torch.cat(goodness_per_label, 1)
        return goodness_per_label.argmax(1)

    def train(self, x_pos, x_neg):
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            h_pos, h_neg = layer.train(h_pos, h_neg)


class Layer(nn.Linear):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.relu = torch.nn.ReLU()
        self.opt = Adam(self.parameters(), lr=LR)
        self.threshold = THRESHOLD
        self.num_epochs = EPOCHS

    def forward(self, x):
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos, x_neg):  # upstream's own loop, for the plain run
        self.losses = []
        for i in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log1p(torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.losses.append(loss.detach())
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()

    def train_through(self, run, x_pos, x_neg):
        """Layer.train with the run's calls: each epoch one pass of run.loader (its one batch)."""
        self.losses = []
        for i in range(self.num_epochs):
            for x_pos_b, x_neg_b in run.loader:
                with run.autocast():
                    g_pos = run.model(x_pos_b).pow(2).mean(1)
                    g_neg = run.model(x_neg_b).pow(2).mean(1)
                loss = torch.log1p(torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
                run.backward(loss)
                run.step()  # self.opt.zero_grad(), self.opt.step()
                self.losses.append(loss.detach().float())
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


def data():
    torch.manual_seed(1)
    x, y = digits(samples=48)
    x = (x.flatten(1) - 0.1307) / 0.3081  # Normalize, Lambda(torch.flatten)
    x_pos = overlay_y_on_x(x, y)
    y_neg = get_y_neg(y)
    x_neg = overlay_y_on_x(x, y_neg)
    return x, y, x_pos, x_neg


def train_ff(plan=None):
    """The net trained as upstream (``plan=None``) or each Layer through its own run of ``plan``: the net, each
    layer's losses, each run's report (closed)."""
    x, y, x_pos, x_neg = data()
    torch.manual_seed(1)
    net = Net([64, 32, 32])
    reports = []
    if plan is None:
        net.train(x_pos, x_neg)
    else:
        h_pos, h_neg = x_pos, x_neg
        for layer in net.layers:
            loader = DataLoader(TensorDataset(h_pos, h_neg), batch_size=len(h_pos))
            run = accel.accelerate(layer, layer.opt, loader, plan=plan, device="cpu")
            try:
                h_pos, h_neg = layer.train_through(run, h_pos, h_neg)
            finally:
                run.close()
            reports.append(run.report)
    return net, [torch.stack(layer.losses) for layer in net.layers], reports, net.predict(x)
