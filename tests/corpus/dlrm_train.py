"""facebookresearch/dlrm dlrm_s_pytorch.py (with dlrm_data_pytorch.py's random data): DLRM_Net (a bottom MLP of
Linear and ReLU built from numpy's normal draws, one ``nn.EmbeddingBag(n, m, mode="sum", sparse=True)`` per sparse
feature, the "dot" interaction of the dense row with the pooled embeddings through bmm and a gather of the lower
triangle, a top MLP ending in Sigmoid), its loss_fn BCELoss on the model, ``torch.optim.SGD`` over dlrm.parameters()
(sparse gradients for the embedding tables: the reason SGD and Adagrad are DLRM's optimizers), LRPolicyScheduler
(warm-up, then a quadratic decay) stepped with the optimizer; each batch: Z = dlrm(X, lS_o, lS_i), E = loss_fn(Z, T),
optimizer.zero_grad(), E.backward(), optimizer.step(), lr_scheduler.step().

The defaults of the script (``--arch-embedding-size 4-3-2``, ``--arch-mlp-bot 4-3-2``, ``--arch-mlp-top 4-2-1``,
``--arch-sparse-feature-size 2``, ``--num-indices-per-lookup 10``, ``--learning-rate 0.01``) with BCE as the loss and
mini-batches of 4 (upstream 1); RandomDataset as upstream builds it for ``--data-generation random`` (numpy's seed
reset at index 0, each item one mini-batch, collate_wrapper_random_offset), 6 batches. The run's calls: run.model,
run.autocast(), run.backward(E), run.step(); the scheduler is the user's, built before accelerate() on the optimizer.
``ADAGRAD`` builds the same with ``--optimizer adagrad``."""
import numpy as np
import torch
import torch.nn as nn
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader, Dataset

from accel.testing import Loop, Setup

REFUSES = {"prune": ("no module of type",)}


class LRPolicyScheduler(LRScheduler):
    def __init__(self, optimizer, num_warmup_steps, decay_start_step, num_decay_steps):
        self.num_warmup_steps = num_warmup_steps
        self.decay_start_step = decay_start_step
        self.decay_end_step = decay_start_step + num_decay_steps
        self.num_decay_steps = num_decay_steps
        super().__init__(optimizer)

    def get_lr(self):
        step_count = self._step_count
        if step_count < self.num_warmup_steps:
            scale = 1.0 - (self.num_warmup_steps - step_count) / self.num_warmup_steps
            lr = [base_lr * scale for base_lr in self.base_lrs]
            self.last_lr = lr
        elif self.decay_start_step <= step_count and step_count < self.decay_end_step:
            decayed_steps = step_count - self.decay_start_step
            scale = ((self.num_decay_steps - decayed_steps) / self.num_decay_steps) ** 2
            min_lr = 0.0000001
            lr = [max(min_lr, base_lr * scale) for base_lr in self.base_lrs]
            self.last_lr = lr
        else:
            if self.num_decay_steps > 0:
                lr = self.last_lr
            else:
                lr = self.base_lrs
        return lr


class DLRM_Net(nn.Module):
    def create_mlp(self, ln, sigmoid_layer):
        layers = nn.ModuleList()
        for i in range(0, ln.size - 1):
            n = ln[i]
            m = ln[i + 1]
            LL = nn.Linear(int(n), int(m), bias=True)
            mean = 0.0
            std_dev = np.sqrt(2 / (m + n))
            W = np.random.normal(mean, std_dev, size=(m, n)).astype(np.float32)
            std_dev = np.sqrt(1 / m)
            bt = np.random.normal(mean, std_dev, size=m).astype(np.float32)
            LL.weight.data = torch.tensor(W, requires_grad=True)
            LL.bias.data = torch.tensor(bt, requires_grad=True)
            layers.append(LL)
            if i == sigmoid_layer:
                layers.append(nn.Sigmoid())
            else:
                layers.append(nn.ReLU())
        return torch.nn.Sequential(*layers)

    def create_emb(self, m, ln):
        emb_l = nn.ModuleList()
        v_W_l = []
        for i in range(0, ln.size):
            n = ln[i]
            EE = nn.EmbeddingBag(n, m, mode="sum", sparse=True)
            W = np.random.uniform(low=-np.sqrt(1 / n), high=np.sqrt(1 / n), size=(n, m)).astype(np.float32)
            EE.weight.data = torch.tensor(W, requires_grad=True)
            v_W_l.append(None)
            emb_l.append(EE)
        return emb_l, v_W_l

    def __init__(self, m_spa, ln_emb, ln_bot, ln_top, arch_interaction_op="dot", arch_interaction_itself=False,
                 sigmoid_bot=-1, sigmoid_top=-1, loss_threshold=0.0):
        super().__init__()
        self.arch_interaction_op = arch_interaction_op
        self.arch_interaction_itself = arch_interaction_itself
        self.loss_threshold = loss_threshold
        self.emb_l, self.v_W_l = self.create_emb(m_spa, ln_emb)
        self.bot_l = self.create_mlp(ln_bot, sigmoid_bot)
        self.top_l = self.create_mlp(ln_top, sigmoid_top)
        self.loss_fn = torch.nn.BCELoss(reduction="mean")

    def apply_mlp(self, x, layers):
        return layers(x)

    def apply_emb(self, lS_o, lS_i, emb_l, v_W_l):
        ly = []
        for k, sparse_index_group_batch in enumerate(lS_i):
            sparse_offset_group_batch = lS_o[k]
            per_sample_weights = None
            E = emb_l[k]
            V = E(sparse_index_group_batch, sparse_offset_group_batch, per_sample_weights=per_sample_weights)
            ly.append(V)
        return ly

    def interact_features(self, x, ly):
        (batch_size, d) = x.shape
        T = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
        Z = torch.bmm(T, torch.transpose(T, 1, 2))
        _, ni, nj = Z.shape
        offset = 1 if self.arch_interaction_itself else 0
        li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
        lj = torch.tensor([j for i in range(nj) for j in range(i + offset)])
        Zflat = Z[:, li, lj]
        R = torch.cat([x] + [Zflat], dim=1)
        return R

    def forward(self, dense_x, lS_o, lS_i):
        return self.sequential_forward(dense_x, lS_o, lS_i)

    def sequential_forward(self, dense_x, lS_o, lS_i):
        x = self.apply_mlp(dense_x, self.bot_l)
        ly = self.apply_emb(lS_o, lS_i, self.emb_l, self.v_W_l)
        z = self.interact_features(x, ly)
        p = self.apply_mlp(z, self.top_l)
        if 0.0 < self.loss_threshold and self.loss_threshold < 1.0:
            z = torch.clamp(p, min=self.loss_threshold, max=(1.0 - self.loss_threshold))
        else:
            z = p
        return z


def generate_uniform_input_batch(m_den, ln_emb, n, num_indices_per_lookup, num_indices_per_lookup_fixed):
    ra = np.random
    Xt = torch.tensor(ra.rand(n, m_den).astype(np.float32))
    lS_emb_offsets = []
    lS_emb_indices = []
    for size in ln_emb:
        lS_batch_offsets = []
        lS_batch_indices = []
        offset = 0
        for _ in range(n):
            if num_indices_per_lookup_fixed:
                sparse_group_size = np.int64(num_indices_per_lookup)
            else:
                r = ra.random(1)
                sparse_group_size = np.int64(np.round(max([1.0], r[0] * min(size, num_indices_per_lookup))))
            r = ra.random(sparse_group_size)
            sparse_group = np.unique(np.round(r * (size - 1)).astype(np.int64))
            sparse_group_size = np.int32(sparse_group.size)
            lS_batch_offsets += [offset]
            lS_batch_indices += sparse_group.tolist()
            offset += sparse_group_size
        lS_emb_offsets.append(torch.tensor(lS_batch_offsets))
        lS_emb_indices.append(torch.tensor(lS_batch_indices))
    return (Xt, lS_emb_offsets, lS_emb_indices)


class RandomDataset(Dataset):
    """dlrm_data_pytorch.RandomDataset for --data-generation random, uniform: each item one mini-batch."""

    def __init__(self, m_den, ln_emb, num_batches, mini_batch_size, num_indices_per_lookup,
                 num_indices_per_lookup_fixed=False, rand_seed=123):
        self.m_den, self.ln_emb, self.num_batches = m_den, ln_emb, num_batches
        self.mini_batch_size, self.data_size = mini_batch_size, num_batches * mini_batch_size
        self.num_indices_per_lookup = num_indices_per_lookup
        self.num_indices_per_lookup_fixed = num_indices_per_lookup_fixed
        self.reset_seed_on_access, self.rand_seed = True, rand_seed

    def __getitem__(self, index):
        if self.reset_seed_on_access and index == 0:
            np.random.seed(self.rand_seed)
        n = min(self.mini_batch_size, self.data_size - (index * self.mini_batch_size))
        (X, lS_o, lS_i) = generate_uniform_input_batch(self.m_den, self.ln_emb, n, self.num_indices_per_lookup,
                                                       self.num_indices_per_lookup_fixed)
        T = torch.tensor(np.random.rand(n, 1).astype(np.float32))
        return (X, lS_o, lS_i, T)

    def __len__(self):
        return self.num_batches


def collate_wrapper_random_offset(list_of_tuples):
    (X, lS_o, lS_i, T) = list_of_tuples[0]
    return (X, torch.stack(lS_o), lS_i, T)


class Train(Loop):
    """for j, inputBatch in enumerate(train_ld): Z = dlrm_wrap(X, lS_o, lS_i); E = loss_fn_wrap(Z, T);
    optimizer.zero_grad(); E.backward(); optimizer.step(); lr_scheduler.step()."""

    name = "dlrm"

    def prepare(self, held):  # built before accelerate(), on the optimizer, as upstream
        self.lr_scheduler = LRPolicyScheduler(held.optimizer, 2, 3, 3)

    def step(self, index, run, held, batch, loss_of):
        X, lS_o, lS_i, T = batch
        with run.autocast():
            Z = run.model(X, lS_o, lS_i)
        E = held.model.loss_fn(Z.float(), T)
        run.backward(E)
        run.step()  # optimizer.zero_grad() and optimizer.step()
        self.lr_scheduler.step()
        return E.detach()


def build(optimizer: str = "sgd") -> Setup:
    np.random.seed(123)  # --numpy-rand-seed
    torch.manual_seed(123)
    ln_emb = np.array([4, 3, 2])
    m_spa, ln_bot = 2, np.array([4, 3, 2])
    num_fea = ln_emb.size + 1
    num_int = (num_fea * (num_fea - 1)) // 2 + ln_bot[-1]
    ln_top = np.array([num_int, 4, 2, 1])
    dlrm = DLRM_Net(m_spa, ln_emb, ln_bot, ln_top, sigmoid_bot=-1, sigmoid_top=ln_top.size - 2)
    opts = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad}
    optimizer = opts[optimizer](dlrm.parameters(), lr=0.01)
    train_data = RandomDataset(ln_bot[0], ln_emb, num_batches=6, mini_batch_size=4, num_indices_per_lookup=10)
    loader = DataLoader(train_data, batch_size=1, shuffle=False, num_workers=0,
                        collate_fn=collate_wrapper_random_offset, pin_memory=False, drop_last=False)
    return Setup(dlrm, optimizer, loader, loop=Train())


def build_adagrad() -> Setup:
    return build("adagrad")
