"""amp on a model with a recurrent layer: torch's bfloat16 LSTM has no CPU kernel without AVX-512 (oneDNN refuses
the primitive), so autocast would crash the user's first step where the plain loop trains. amp tries a tiny layer
of each recurrent class the model holds, and stands aside, saying why, where torch cannot train it; elsewhere it
applies. Either way the first steps run (found by the corpus's mnist_rnn port on a Zen 3)."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.accelerators.amp import recurrent_refusal


class Reader(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.rnn = kind(8, 16, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def test_amp_trains_a_recurrent_model_or_says_why_it_stands_aside():
    for kind in (nn.LSTM, nn.GRU):
        torch.manual_seed(0)
        model = Reader(kind)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        loader = DataLoader(TensorDataset(torch.randn(32, 5, 8), torch.randint(0, 10, (32,))), batch_size=8)
        run = accel.accelerate(model, optimizer, loader, plan=[{"amp": {"dtype": "bfloat16"}}], device="cpu")
        try:
            row = next(r for r in run.report.rows if r.name == "amp")
            refusal = recurrent_refusal(kind, "cpu", torch.bfloat16)
            assert (row.status == "skipped") == bool(refusal), (kind, row, refusal)
            if refusal:
                assert kind.__name__ in row.reason and "plain step runs" in row.reason, row.reason
            for x, y in run.loader:
                with run.autocast():
                    loss = nn.functional.cross_entropy(run.model(x), y)
                run.backward(loss)
                run.step()
        finally:
            run.close()
