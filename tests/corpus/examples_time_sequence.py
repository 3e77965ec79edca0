"""pytorch/examples time_sequence_prediction/train.py (with generate_sine_wave.py's data): Sequence (two LSTMCells and a
linear layer, stepped over the sequence one value at a time, in double precision, with an empty ``dummy_param`` that
only tells the device), MSELoss, and LBFGS at lr 0.8 stepped with a closure that zeroes the gradients, runs the model
and calls backward: ``optimizer.step(closure)``, the loop's own step; then the prediction of the test sequences, 2
values into the future, under no_grad.

The sine waves as generate_sine_wave.py draws them (T=20), 8 training sequences of 7 values (upstream 97 of 1000),
the whole set one batch, as upstream loads it whole; LBFGS with max_iter=5 (upstream 20). The run's calls: run.model
and run.backward(loss) inside the closure; the step is the user's LBFGS with the closure, as accel's docs say a
closure optimizer is stepped."""
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

REFUSES = {"prune": ("no module of type",)}
IDLE = {"grad_accumulation": "closure", "grad_clipping": "closure"}  # stands aside, said (status idle)
FUTURE = 2


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)
        self.dummy_param = nn.Parameter(torch.empty(0))

    def forward(self, input, future=0):
        outputs = []
        device = self.dummy_param.device
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double).to(device)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double).to(device)
        h_t2 = torch.zeros(input.size(0), 51, dtype=torch.double).to(device)
        c_t2 = torch.zeros(input.size(0), 51, dtype=torch.double).to(device)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):  # if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        outputs = torch.cat(outputs, dim=1)
        return outputs


def sine_waves(T=20, L=7, N=11) -> torch.Tensor:
    """generate_sine_wave.py, smaller."""
    np.random.seed(2)
    x = np.empty((N, L), 'int64')
    x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
    return torch.from_numpy(np.sin(x / 1.0 / T).astype('float64'))


class Train(Loop):
    """for i in range(opt.steps): def closure(): ...; optimizer.step(closure); then the test prediction."""

    name = "time_sequence_prediction"

    def __init__(self):
        self.criterion = nn.MSELoss()
        data = sine_waves()
        self.test_input, self.test_target = data[:3, :-1], data[:3, 1:]
        self.test_losses = []

    def step(self, index, run, held, batch, loss_of):
        input, target = batch
        optimizer = held.optimizer

        def closure():
            optimizer.zero_grad()
            with run.autocast():
                out = run.model(input)
            loss = self.criterion(out, target)
            run.backward(loss)
            return loss

        loss = optimizer.step(closure)
        with torch.no_grad():
            pred = run.model(self.test_input, future=FUTURE)
            self.test_losses.append(self.criterion(pred[:, :-FUTURE], self.test_target).detach())
        return loss.detach()

    def observed(self):
        return {"test loss": torch.stack(self.test_losses)}


def build() -> Setup:
    np.random.seed(0)
    torch.manual_seed(0)
    data = sine_waves()
    input, target = data[3:, :-1], data[3:, 1:]
    seq = Sequence().double()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=5)
    loader = DataLoader(TensorDataset(input, target), batch_size=len(input))
    return Setup(seq, optimizer, loader, loop=Train())
