"""pytorch/examples gcn/main.py: GraphConv (``support = torch.mm(input, kernel)``, ``torch.spmm(adj_mat, support)``,
an optional bias) twice in GCN with ReLU and Dropout, log_softmax; load_cora's features row-normalized and made
sparse (``features.to_sparse()``), the adjacency with self-loops, renormalized D^-1/2 (A + I) D^-1/2 and sparse;
Adam at lr 0.01 with weight_decay 5e-4, NLLLoss; each epoch train_iter: model.train(), zero_grad, output =
model(*input), the loss on the training nodes, backward, step, then test() on the training and validation nodes
(model.eval() under no_grad).

Cora is not downloaded: a random graph of 60 nodes, 30 binary features and 4 classes (the labels a function of the
features), 150 random citations, built with load_cora's own steps; hidden 16, dropout 0.5 as upstream, 40/10/10 nodes
for train/val/test. The graph is the one batch of a loader (batch_size=None), each epoch one pass of it (of
run.loader with accel); the run's calls: run.model(*input), run.autocast(), run.backward(loss), run.step(); test() on
run.model. ``train_gcn(plan)`` trains it (``plan=None``: upstream's loop, no accel) and returns the model's state,
the losses and the validation losses. The harness's check_equivalence does not fit: its fingerprint of a batch
cannot read a sparse tensor."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Adam
from torch.utils.data import DataLoader

import accel
from accel.testing import Loop, Setup

EPOCHS = 4


class GraphConv(nn.Module):
    def __init__(self, input_dim, output_dim, use_bias=False):
        super().__init__()
        self.kernel = nn.Parameter(torch.Tensor(input_dim, output_dim))
        nn.init.xavier_normal_(self.kernel)
        self.bias = None
        if use_bias:
            self.bias = nn.Parameter(torch.Tensor(output_dim))
            nn.init.zeros_(self.bias)

    def forward(self, input_tensor, adj_mat):
        support = torch.mm(input_tensor, self.kernel)
        output = torch.spmm(adj_mat, support)
        if self.bias is not None:
            output = output + self.bias
        return output


class GCN(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, use_bias=True, dropout_p=0.1):
        super().__init__()
        self.gc1 = GraphConv(input_dim, hidden_dim, use_bias=use_bias)
        self.gc2 = GraphConv(hidden_dim, output_dim, use_bias=use_bias)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input_tensor, adj_mat):
        x = self.gc1(input_tensor, adj_mat)
        x = F.relu(x)
        x = self.dropout(x)
        x = self.gc2(x, adj_mat)
        return F.log_softmax(x, dim=1)


def load_graph(V=60, n_features=30, n_classes=4, E=150):
    """load_cora's steps on a random graph in place of cora.content and cora.cites."""
    rng = np.random.RandomState(0)
    content = (rng.rand(V, n_features) < 0.2).astype(np.int32)
    features = torch.FloatTensor(content)
    scale_vector = torch.sum(features, dim=1)
    scale_vector = 1 / scale_vector
    scale_vector[scale_vector == float('inf')] = 0
    scale_vector = torch.diag(scale_vector).to_sparse()
    features = scale_vector @ features
    labels = torch.LongTensor(content @ rng.randint(0, n_classes, n_features) % n_classes)
    edges = rng.randint(0, V, (E, 2)).astype(np.int32)
    adj_mat = torch.sparse_coo_tensor(edges.T, torch.ones(E), (V, V), dtype=torch.int64)
    adj_mat = torch.eye(V) + adj_mat
    degree_mat = torch.sum(adj_mat, dim=1)
    degree_mat = torch.sqrt(1 / degree_mat)
    degree_mat[degree_mat == float('inf')] = 0
    degree_mat = torch.diag(degree_mat).to_sparse()
    adj_mat = degree_mat @ adj_mat @ degree_mat
    return features.to_sparse(), labels, adj_mat.to_sparse()


def test(model, criterion, input, target, mask):
    model.eval()
    with torch.no_grad():
        output = model(*input)
        output, target = output[mask], target[mask]
        loss = criterion(output, target)
        acc = (output.argmax(dim=1) == target).float().sum() / len(target)
    return loss.item(), acc.item()


def train_gcn(plan=None):
    """upstream's epochs (plan None) or the same through a run of the plan: (state, losses, validation losses,
    the run's report or None)."""
    torch.manual_seed(42)
    features, labels, adj_mat = load_graph()
    idx = torch.randperm(len(labels))
    idx_test, idx_val, idx_train = idx[:10], idx[10:20], idx[20:]
    gcn = GCN(features.shape[1], 16, labels.max().item() + 1, True, 0.5)
    optimizer = Adam(gcn.parameters(), lr=0.01, weight_decay=5e-4)
    criterion = nn.NLLLoss()
    losses, val_losses, report = [], [], None
    loader = DataLoader([((features, adj_mat), labels)], batch_size=None)
    if plan is None:  # upstream's train_iter, over the same loader (iter() draws its seed as with accel)
        for epoch in range(EPOCHS):
            for input, target in loader:
                gcn.train()
                optimizer.zero_grad()
                output = gcn(*input)
                loss = criterion(output[idx_train], target[idx_train])
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())
                val_losses.append(test(gcn, criterion, input, target, idx_val)[0])
    else:
        run = accel.accelerate(gcn, optimizer, loader, plan=plan, device="cpu")
        try:
            for epoch in range(EPOCHS):
                for input, target in run.loader:
                    run.model.train()
                    with run.autocast():
                        output = run.model(*input)
                        loss = criterion(output[idx_train].float(), target[idx_train])
                    run.backward(loss)
                    run.step()
                    losses.append(loss.detach())
                    val_losses.append(test(run.model, criterion, input, target, idx_val)[0])
        finally:
            run.close()
        report = run.report
    val_losses.append(test(gcn, criterion, (features, adj_mat), labels, idx_test)[0])  # the test set's, at the end
    return {k: v.detach().clone() for k, v in gcn.state_dict().items()}, torch.stack(losses), val_losses, report


class Train(Loop):
    """train_iter's step for check_equivalence: the whole graph, the loss on the training nodes."""

    name = "gcn"

    def __init__(self, idx_train):
        self.idx_train, self.criterion = idx_train, nn.NLLLoss()

    def step(self, index, run, held, batch, loss_of):
        input, target = batch
        with run.autocast():
            output = run.model(*input)
            loss = self.criterion(output[self.idx_train].float(), target[self.idx_train])
        run.backward(loss)
        run.step()
        return loss.detach()


def build() -> Setup:
    torch.manual_seed(42)
    features, labels, adj_mat = load_graph()
    idx = torch.randperm(len(labels))
    gcn = GCN(features.shape[1], 16, labels.max().item() + 1, True, 0.5)
    optimizer = Adam(gcn.parameters(), lr=0.01, weight_decay=5e-4)
    loader = DataLoader([((features, adj_mat), labels)], batch_size=None)
    return Setup(gcn, optimizer, loader, loop=Train(idx[20:]))
