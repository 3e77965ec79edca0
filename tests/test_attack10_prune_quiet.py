"""attack10: pruning a residual conv net with Identity skips (timm's and torchvision's shape) through NNI's
ModelSpeedup prints nothing on the user's stdout and asks for no NNI issue: NNI 3.0 prints each mask conflict's axis
('0 Filter') and logs an error, telling the user to report an issue, for every Identity it has no replacer for
(one per ModelSpeedup: check()'s dry run and the surgery), though an Identity has nothing to shrink."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel

pytest.importorskip("nni")


class Block(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.skip = nn.Identity()  # as timm's and torchvision's residual blocks hold one

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + self.skip(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


@pytest.mark.slow
def test_pruning_a_residual_net_with_identities_says_nothing_on_stdout_nor_asks_for_an_nni_issue(capfd):
    torch.manual_seed(0)
    model = Net()
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(16, 3, 8, 8, generator=generator),
                                      torch.randint(0, 10, (16,), generator=generator)), batch_size=8)
    capfd.readouterr()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, plan={"prune": {}},
                           device="cpu")
    try:
        assert [row.status for row in run.report.rows] == ["applied"]
        out, err = capfd.readouterr()
        assert out == ""
        assert "Has not supported replacing module" not in err
    finally:
        run.close()
