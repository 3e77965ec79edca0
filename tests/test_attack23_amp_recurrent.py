"""attack23 on amp's order of refusals: a plan wrong on every machine is refused before amp stands aside for a
recurrent layer this CPU cannot train under autocast (a bfloat16 LSTM without AVX-512). A grad scaler asked for with
bfloat16 is such a plan: elsewhere a PlanError, so here too (else the same script fails on a colleague's machine)."""
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.errors import PlanError

DIGITS = load_digits()


class RowReader(nn.Module):
    """Reads a digit's eight rows as a sequence (the recurrent layer amp may stand aside for)."""

    def __init__(self, kind: type[nn.Module]):
        super().__init__()
        self.rnn, self.head = kind(8, 16, batch_first=True), nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.rnn(x.view(-1, 8, 8))[0][:, -1])


def loader() -> DataLoader:
    data = TensorDataset(torch.tensor(DIGITS.data[:64], dtype=torch.float32) / 16, torch.tensor(DIGITS.target[:64]))
    return DataLoader(data, batch_size=16)


def test_a_grad_scaler_with_bfloat16_is_refused_with_an_lstm_too():
    plan = {"amp": {"dtype": "bfloat16", "grad_scaler": True}}
    flat = nn.Linear(64, 10)  # the same plan without a recurrent layer: refused on every machine
    with pytest.raises(PlanError, match="grad_scaler"):
        accel.accelerate(flat, torch.optim.SGD(flat.parameters(), lr=0.1), loader(), plan=plan, device="cpu")
    model = RowReader(nn.LSTM)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(PlanError, match="a grad scaler is only for fp16"):
        accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), plan=plan, device="cpu")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
