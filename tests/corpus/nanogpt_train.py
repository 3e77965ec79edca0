"""nanoGPT's train.py and model.py (karpathy/nanoGPT): the GPT (CausalSelfAttention with flash attention, MLP, Block,
LayerNorm with optional bias, tied lm_head, GPT-2's initialisation), configure_optimizers (weight decay on 2-D
tensors only), the learning rate of get_lr (linear warm-up, cosine decay) written into every param group at each
iteration, gradient_accumulation_steps micro-steps (the loss divided by them), scaler.unscale_ and
clip_grad_norm_(1.0), the step; with the run's calls in the place of the GradScaler's (run.unscale_gradients()).

n_layer 2, n_head 2, n_embd 32, block_size 16, dropout 0.1, bias False, vocabulary 96; get_batch's random offsets
into a token array, drawn by a DataLoader's random sampler (with replacement) over every offset."""
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler

from accel.testing import Loop, Setup

from . import tokens

REFUSES = {}
GRADIENT_ACCUMULATION_STEPS = 2
learning_rate, warmup_iters, lr_decay_iters, min_lr = 6e-4, 1, 4, 6e-5


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                                             dropout_p=self.dropout if self.training else 0,
                                                             is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 96
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.1
    bias: bool = False


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [{'params': decay_params, 'weight_decay': weight_decay},
                        {'params': nodecay_params, 'weight_decay': 0.0}]
        fused_available = 'fused' in inspect.signature(torch.optim.AdamW).parameters
        extra_args = dict(fused=True) if fused_available and device_type == 'cuda' else dict()
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


class Offsets(Dataset):
    """get_batch's x and y at every offset i of the token array: data[i:i+block_size], data[i+1:i+1+block_size]."""

    def __init__(self, data, block_size):
        self.data, self.block_size = data, block_size

    def __len__(self):
        return len(self.data) - self.block_size

    def __getitem__(self, i):
        return self.data[i:i + self.block_size], self.data[i + 1:i + 1 + self.block_size]


class Train(Loop):
    name = "nanogpt"

    def step(self, index, run, held, batch, loss_of):
        iter_num, micro_step = divmod(index, GRADIENT_ACCUMULATION_STEPS)
        if micro_step == 0:
            lr = get_lr(iter_num)
            for param_group in run.optimizer.param_groups:
                param_group['lr'] = lr
        X, Y = batch
        with run.autocast():
            logits, loss = run.model(X, Y)
            loss = loss / GRADIENT_ACCUMULATION_STEPS
        run.backward(loss)
        if micro_step == GRADIENT_ACCUMULATION_STEPS - 1:
            run.unscale_gradients()
            torch.nn.utils.clip_grad_norm_(held.model.parameters(), 1.0)
            run.step()
        return loss.detach()


def build() -> Setup:
    torch.manual_seed(1337)
    model = GPT(GPTConfig())
    optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.95), "cpu")
    data = Offsets(tokens(256, GPTConfig.vocab_size), GPTConfig.block_size)
    sampler = RandomSampler(data, replacement=True, num_samples=64, generator=torch.Generator().manual_seed(1337))
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    return Setup(model, optimizer, loader, loop=Train())
