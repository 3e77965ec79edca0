"""pytorch/pytorch functorch/examples/maml_omniglot/maml-omniglot-transforms.py: MAML with torch.func. The net (three
Conv2d, BatchNorm2d(track_running_stats=False), ReLU(inplace=True), MaxPool2d blocks, Flatten, Linear), Adam at 1e-3
as the meta-optimizer; each batch of tasks: meta_opt.zero_grad(), ``vmap(loss_for_task)`` over the tasks, where
loss_for_task takes ``params = dict(net.named_parameters())`` and adapts them n_inner_iter times with
``grad(compute_loss)`` through ``functional_call(net, (new_params, buffers), x)`` (a double backward: the meta-gradient
goes through the inner gradients), then the query loss; ``qry_losses.sum().backward()``, meta_opt.step(). test(): the
same adaptation per task with ``torch.autograd.grad`` and functional_call, without vmap.

64 channels become 4, n_way 5, k_spt 1, k_qry 1, 2 tasks a batch (upstream 5, 5, 15, 32), n_inner_iter 1 (upstream
5); tasks of real 28x28 digits (classes drawn with numpy as OmniglotNShot draws its characters) in place of Omniglot,
one batch of tasks per loader item. The run's calls: ``net`` in loss_for_task is run.model (its named_parameters and
functional_call), run.autocast() around the vmap, run.backward(qry_losses.sum()), run.step()."""
import functools

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils.data import DataLoader, Dataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {"prune": ("no module of type", "dummy_input", "torch.fx cannot trace", "cannot run")}
N_WAY, K_SPT, K_QRY, TASK_NUM, N_INNER_ITER, WIDTH = 5, 1, 1, 2, 1, 4


def loss_for_task(net, n_inner_iter, x_spt, y_spt, x_qry, y_qry):
    params = dict(net.named_parameters())
    buffers = dict(net.named_buffers())
    querysz = x_qry.size(0)

    def compute_loss(new_params, buffers, x, y):
        logits = functional_call(net, (new_params, buffers), x)
        loss = F.cross_entropy(logits, y)
        return loss

    new_params = params
    for _ in range(n_inner_iter):
        grads = grad(compute_loss)(new_params, buffers, x_spt, y_spt)
        new_params = {k: new_params[k] - g * 1e-1 for k, g, in grads.items()}

    qry_logits = functional_call(net, (new_params, buffers), x_qry)
    qry_loss = F.cross_entropy(qry_logits, y_qry)
    qry_acc = (qry_logits.argmax(dim=1) == y_qry).sum() / querysz
    return qry_loss, qry_acc


def test(net, tasks, n_inner_iter=N_INNER_ITER):
    params = dict(net.named_parameters())
    buffers = dict(net.named_buffers())
    qry_losses = []
    x_spt, y_spt, x_qry, y_qry = tasks
    for i in range(x_spt.size(0)):
        new_params = params
        for _ in range(n_inner_iter):
            spt_logits = functional_call(net, (new_params, buffers), x_spt[i])
            spt_loss = F.cross_entropy(spt_logits, y_spt[i])
            grads = torch.autograd.grad(spt_loss, new_params.values())
            new_params = {k: new_params[k] - g * 1e-1 for k, g, in zip(new_params, grads)}
        qry_logits = functional_call(net, (new_params, buffers), x_qry[i]).detach()
        qry_losses.append(F.cross_entropy(qry_logits, y_qry[i], reduction="none").detach())
    return torch.cat(qry_losses)


class Tasks(Dataset):
    """OmniglotNShot.next() in miniature: each item a batch of TASK_NUM tasks, N_WAY classes drawn per task, K_SPT
    support and K_QRY query images per class, the labels 0..N_WAY-1 in the drawn order."""

    def __init__(self, batches, seed):
        images, labels = digits(size=28, samples=400)
        rng = np.random.RandomState(seed)
        by_class = [images[labels == c] for c in range(10)]
        self.items = []
        for _ in range(batches):
            sets = [], [], [], []
            for _ in range(TASK_NUM):
                classes = rng.choice(10, N_WAY, replace=False)
                spt, qry = [], []
                for j, c in enumerate(classes):
                    picked = rng.choice(len(by_class[c]), K_SPT + K_QRY, replace=False)
                    spt += [(by_class[c][p], j) for p in picked[:K_SPT]]
                    qry += [(by_class[c][p], j) for p in picked[K_SPT:]]
                for k, part in ((0, spt), (2, qry)):
                    sets[k].append(torch.stack([x for x, _ in part]))
                    sets[k + 1].append(torch.tensor([y for _, y in part]))
            self.items.append(tuple(torch.stack(s) for s in sets))

    def __getitem__(self, index):
        return self.items[index]

    def __len__(self):
        return len(self.items)


class Train(Loop):
    name = "maml_omniglot"

    def __init__(self):
        self.test_tasks = Tasks(1, seed=2)[0]

    def step(self, batch_idx, run, held, batch, loss_of):
        x_spt, y_spt, x_qry, y_qry = batch
        task_num, setsz, c_, h, w = x_spt.size()
        n_inner_iter = N_INNER_ITER
        compute_loss_for_task = functools.partial(loss_for_task, run.model, n_inner_iter)
        with run.autocast():
            qry_losses, qry_accs = vmap(compute_loss_for_task)(x_spt, y_spt, x_qry, y_qry)
        run.backward(qry_losses.sum())
        run.step()  # meta_opt.zero_grad() and meta_opt.step()
        return qry_losses.detach().sum() / task_num

    def after(self, index, held, run, loss):
        self.tested = test(run.model, self.test_tasks)

    def observed(self):
        return {"test query losses": self.tested}


def build() -> Setup:
    torch.manual_seed(1)
    np.random.seed(1)
    inplace_relu = True
    net = nn.Sequential(
        nn.Conv2d(1, WIDTH, 3),
        nn.BatchNorm2d(WIDTH, affine=True, track_running_stats=False),
        nn.ReLU(inplace=inplace_relu),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(WIDTH, WIDTH, 3),
        nn.BatchNorm2d(WIDTH, affine=True, track_running_stats=False),
        nn.ReLU(inplace=inplace_relu),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(WIDTH, WIDTH, 3),
        nn.BatchNorm2d(WIDTH, affine=True, track_running_stats=False),
        nn.ReLU(inplace=inplace_relu),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(WIDTH, N_WAY),
    )
    net.train()
    meta_opt = optim.Adam(net.parameters(), lr=1e-3)
    loader = DataLoader(Tasks(4, seed=1), batch_size=None, shuffle=False)
    return Setup(net, meta_opt, loader, loop=Train())
