"""pytorch/examples word_language_model/main.py and model.py: RNNModel (an LSTM language model with dropout), no
optimizer (its default): model.zero_grad(), the hidden state repackaged (detached) each batch, NLLLoss on
log_softmax, clip_grad_norm_(0.25), then every weight moved by hand (p.data.add_(p.grad, alpha=-lr)).

batchify and get_batch as upstream, over a random token stream; a DataLoader with batch_size=None hands the loop
get_batch's chunks, in order. The one line accel adds: run.unscale_gradients() before clipping (true gradients
under a loss scale; a no-op otherwise)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from accel.testing import Loop, Setup

from . import tokens

NTOKENS, BPTT, BATCH_SIZE, CLIP, LR = 50, 6, 4, 0.25, 20.0
NEEDS_OPTIMIZER = ("needs the optimizer",)
REFUSES = {"fused_optimizer": NEEDS_OPTIMIZER, "grad_accumulation": NEEDS_OPTIMIZER, "grad_clipping": NEEDS_OPTIMIZER,
           "amp": NEEDS_OPTIMIZER}  # fp16's loss scaling: refused up front (it scaled gradients 65536x before)


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


class Chunks(Dataset):
    """get_batch(source, i) for i in range(0, source.size(0) - 1, bptt): the loop's batches, in order."""

    def __init__(self, source):
        self.source, self.starts = source, list(range(0, source.size(0) - 1, BPTT))

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, index):
        i = self.starts[index]
        seq_len = min(BPTT, len(self.source) - 1 - i)
        return self.source[i:i + seq_len], self.source[i + 1:i + 1 + seq_len].view(-1)


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


class Train(Loop):
    name = "word_language_model"
    needs_optimizer = False

    def start(self, held, run):
        self.hidden = held.model.init_hidden(BATCH_SIZE)
        self.criterion = nn.NLLLoss()

    def step(self, index, run, held, batch, loss_of):
        data, targets = batch
        held.model.zero_grad()
        self.hidden = repackage_hidden(self.hidden)
        with run.autocast():
            output, self.hidden = run.model(data, self.hidden)
        loss = self.criterion(output.float(), targets)
        run.backward(loss)
        run.unscale_gradients()
        torch.nn.utils.clip_grad_norm_(held.model.parameters(), CLIP)
        for p in held.model.parameters():
            p.data.add_(p.grad, alpha=-LR)
        return loss.detach()


def build() -> Setup:
    torch.manual_seed(1111)
    model = RNNModel("LSTM", NTOKENS, 16, 16, 2, dropout=0.2)
    loader = DataLoader(Chunks(batchify(tokens(BATCH_SIZE * BPTT * 4 + BATCH_SIZE, NTOKENS), BATCH_SIZE)),
                        batch_size=None)
    return Setup(model, None, loader, loop=Train())
