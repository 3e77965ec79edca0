"""pytorch/examples siamese_network/main.py: SiameseNetwork (torchvision's resnet18, its first convolution over one
channel, its fc dropped; the two images' features concatenated into two linear layers and a Sigmoid; xavier-uniform
linear layers, biases 0.01), APP_MATCHER (a pair of images drawn with Python's ``random`` in __getitem__: the same
class for even indices, another class for odd ones, target 1.0 or 0.0), nn.BCELoss on the squeezed sigmoid, Adadelta
at lr 1.0 and StepLR(step_size=1, gamma=0.7) stepped per epoch; train() as upstream, with the run's calls.

Real digits at 28x28 stand in for MNIST, 40 of them, 4 of each digit, in batches of 4 (upstream 64); an epoch is 2
batches here. Each digit at least twice: upstream draws a same-class pair until the two images differ, forever on a
digit with one image (the first 40 digits have one 1: the workers' seeds decided whether a run hung, as it did in CI).
Python's random is seeded where the loop starts (upstream leaves it unseeded: each run draws other pairs).

--lr 0.1 (upstream's default 1.0): resnet18's BatchNorms see 1x1 maps over 4 pairs at layer4, and Adadelta's first
steps at 1.0 turn rounding noise into weights 9e-3 apart in two steps between the plain loop on 1 and on 2 threads,
without accel (beyond the float card with or without it); at 0.1 the two are 2e-5 apart. Even so, the plain loop in
channels_last (model and batches converted by hand, without accel) ends 9e-4 from the plain loop in NCHW: those maps
leave no room for another summation order, nor for bf16. The port runs the plans that keep the order (LEAVES_OUT)."""
import random

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import torchvision
from torch.utils.data import DataLoader, Dataset

from accel.testing import Setup

from . import digits, examples_mnist

REFUSES = {}
LEAVES_OUT = ("channels_last", "amp", "stack")  # beyond their cards without accel too (above)
ONLY = ("loader", "prune")  # what this port adds to the corpus: pairs drawn with Python's random in the workers, and
# a model of two inputs for NNI; the other plans cost a resnet18 each (seconds) and the CNN ports hold them


class SiameseNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.resnet = torchvision.models.resnet18(weights=None)
        self.resnet.conv1 = nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
        self.fc_in_features = self.resnet.fc.in_features
        self.resnet = torch.nn.Sequential(*(list(self.resnet.children())[:-1]))
        self.fc = nn.Sequential(
            nn.Linear(self.fc_in_features * 2, 256),
            nn.ReLU(inplace=True),
            nn.Linear(256, 1),
        )
        self.sigmoid = nn.Sigmoid()
        self.resnet.apply(self.init_weights)
        self.fc.apply(self.init_weights)

    def init_weights(self, m):
        if isinstance(m, nn.Linear):
            torch.nn.init.xavier_uniform_(m.weight)
            m.bias.data.fill_(0.01)

    def forward_once(self, x):
        output = self.resnet(x)
        output = output.view(output.size()[0], -1)
        return output

    def forward(self, input1, input2):
        output1 = self.forward_once(input1)
        output2 = self.forward_once(input2)
        output = torch.cat((output1, output2), 1)
        output = self.fc(output)
        output = self.sigmoid(output)
        return output


class APP_MATCHER(Dataset):
    def __init__(self, images, labels):
        super().__init__()
        self.data = images.clone()
        np_arr = np.array(labels.clone())
        self.grouped_examples = {}
        for i in range(0, 10):
            self.grouped_examples[i] = np.where(np_arr == i)[0]

    def __len__(self):
        return self.data.shape[0]

    def __getitem__(self, index):
        selected_class = random.randint(0, 9)
        random_index_1 = random.randint(0, self.grouped_examples[selected_class].shape[0] - 1)
        index_1 = self.grouped_examples[selected_class][random_index_1]
        image_1 = self.data[index_1].clone().float()
        if index % 2 == 0:
            random_index_2 = random.randint(0, self.grouped_examples[selected_class].shape[0] - 1)
            while random_index_2 == random_index_1:
                random_index_2 = random.randint(0, self.grouped_examples[selected_class].shape[0] - 1)
            index_2 = self.grouped_examples[selected_class][random_index_2]
            image_2 = self.data[index_2].clone().float()
            target = torch.tensor(1, dtype=torch.float)
        else:
            other_selected_class = random.randint(0, 9)
            while other_selected_class == selected_class:
                other_selected_class = random.randint(0, 9)
            random_index_2 = random.randint(0, self.grouped_examples[other_selected_class].shape[0] - 1)
            index_2 = self.grouped_examples[other_selected_class][random_index_2]
            image_2 = self.data[index_2].clone().float()
            target = torch.tensor(0, dtype=torch.float)
        return image_1, image_2, target


class Train(examples_mnist.Train):
    """train() as mnist's (siamese_network/main.py grew from it): StepLR per epoch on run.optimizer; the batch a pair
    and its target, outputs = model(images_1, images_2).squeeze(), BCELoss."""

    name = "siamese_network"

    def start(self, held, run):
        super().start(held, run)
        random.seed(1)
        self.criterion = nn.BCELoss()

    def step(self, index, run, held, batch, loss_of):
        images_1, images_2, targets = batch
        with run.autocast():
            outputs = run.model(images_1, images_2).squeeze()
        loss = self.criterion(outputs.float(), targets)
        run.backward(loss)
        run.step()
        return loss.detach()


def build() -> Setup:
    torch.manual_seed(1)
    images, labels = digits(size=28, samples=200)
    balanced = torch.cat([torch.nonzero(labels == digit).flatten()[:4] for digit in range(10)])
    images, labels = images[balanced], labels[balanced]  # 4 of each: a same-class pair needs two images of it
    model = SiameseNetwork()
    optimizer = optim.Adadelta(model.parameters(), lr=0.1)
    loader = DataLoader(APP_MATCHER(images, labels), batch_size=4)
    return Setup(model, optimizer, loader, loop=Train())
