"""pytorch/examples super_resolution/main.py and model.py: Net (four convolutions, orthogonal init, the last one to
upscale_factor ** 2 channels, then nn.PixelShuffle), nn.MSELoss, Adam at lr 0.01; train() as upstream, with the run's
calls; test() (the PSNR over the test set, under no_grad) and checkpoint() after every epoch, an epoch being 2
batches here. Upstream's checkpoint pickles the whole module (``torch.save(model, path)``); here its state_dict, read
back into a copy of the model (pruned, it has the pruned shapes): check_equivalence's own forward hook (a lambda)
cannot be pickled. The whole-module pickle under each plan: tests/corpus/test_whole_model_pickle.py.

data.py's transforms on real digits: the target the 16x16 image (the Y channel of a crop), the input the same resized
to 8x8 (upscale_factor 2); 24 images in batches of 4 (upstream 64), 8 for the test set."""
import copy
import io
from math import log10

import torch
import torch.nn as nn
import torch.nn.init as init
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset
from torchvision.transforms.functional import resize

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}
UPSCALE_FACTOR, CROP_SIZE = 2, 16


class Net(nn.Module):
    def __init__(self, upscale_factor):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 64, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(64, 64, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(64, 32, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(32, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)
        self._initialize_weights()

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        x = self.pixel_shuffle(self.conv4(x))
        return x

    def _initialize_weights(self):
        init.orthogonal_(self.conv1.weight, init.calculate_gain('relu'))
        init.orthogonal_(self.conv2.weight, init.calculate_gain('relu'))
        init.orthogonal_(self.conv3.weight, init.calculate_gain('relu'))
        init.orthogonal_(self.conv4.weight)


def dataset(start: int, count: int) -> TensorDataset:
    """input_transform (Resize(crop_size // upscale_factor)) and target_transform (the crop itself)."""
    target = digits(size=CROP_SIZE, samples=start + count)[0][start:]
    return TensorDataset(resize(target, [CROP_SIZE // UPSCALE_FACTOR] * 2, antialias=True), target)


class Train(Loop):
    """train(epoch), then test() and checkpoint(epoch) at each epoch's end."""

    name = "super_resolution"

    def start(self, held, run):
        self.criterion = nn.MSELoss()
        self.testing_data_loader = DataLoader(dataset=dataset(24, 8), batch_size=4, shuffle=False)
        self.psnr, self.reloaded = [], []
        self.model = held.model

    def step(self, index, run, held, batch, loss_of):
        input, target = batch
        with run.autocast():
            loss = self.criterion(run.model(input).float(), target)
        run.backward(loss)
        run.step()
        return loss.detach()

    def after(self, step, held, run, loss):
        if step % 2 == 1:
            self.test(run)
            self.checkpoint()

    def test(self, run):
        avg_psnr = 0
        with torch.no_grad():
            for input, target in self.testing_data_loader:
                prediction = run.model(input)
                mse = self.criterion(prediction, target)
                avg_psnr += 10 * log10(1 / mse.item())
        self.psnr.append(avg_psnr / len(self.testing_data_loader))

    def checkpoint(self):
        model_out_path = io.BytesIO()
        torch.save(self.model.state_dict(), model_out_path)
        model_out_path.seek(0)
        loaded = copy.deepcopy(self.model)
        loaded.load_state_dict(torch.load(model_out_path))
        self.reloaded.append(loaded(self.testing_data_loader.dataset.tensors[0]).detach())

    def observed(self):
        return {"psnr": torch.tensor(self.psnr), **{f"checkpoint {i}": t for i, t in enumerate(self.reloaded)}}


def build() -> Setup:
    torch.manual_seed(123)
    model = Net(upscale_factor=UPSCALE_FACTOR)
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(dataset=dataset(0, 24), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(123))
    return Setup(model, optimizer, loader, loop=Train())
