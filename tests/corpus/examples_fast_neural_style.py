"""pytorch/examples fast_neural_style/neural_style/neural_style.py (train()), with transformer_net.py's TransformerNet,
vgg.py's Vgg16 and utils.py's gram_matrix and normalize_batch: a TransformerNet (reflection-padded convolutions,
InstanceNorm2d, five ResidualBlocks, nearest upsampling) trained against a frozen VGG16 that is not the model (the
loss network, outside accelerate(), called in the loop); Adam at 1e-3; content loss on relu2_2 and style loss on the
Gram matrices of four VGG layers, weighted 1e5 and 1e10.

normalize_batch divides its batch by 255 *in place*: the loop hands run.model the batch x, then normalizes x
itself (x.div_(255)) and the model's output y too. TransformerNet as upstream; images of 16x16 (upstream 256) from
real digits over 3 channels, scaled to [0, 255] as transforms.Lambda(lambda x: x.mul(255)) does; the style image
a digit too. Vgg16 is built on an untrained VGG16 (upstream loads ImageNet weights), once per process: it is
frozen, and every run reads the same.

--lr 1e-5 (upstream's default 1e-3): each convolution's bias before an InstanceNorm (and each ResidualBlock's in2.bias,
which the next InstanceNorms take away) has no gradient in exact arithmetic, only rounding noise of 1e-7 to 1e-5, and
a few weights have gradients as small; Adam's first step turns each into +-lr, and the style loss (weighted 1e10) is
steep enough that the second step's gradients move with them. At 1e-3 any other summation order of the same math
(channels_last, fused Adam) put those biases 4e-3 apart in two steps, and Adam's state 0.4%: beyond the float card,
with or without accel. (With another random VGG16, drawn without its classifier, the same happened at 1e-5.)"""
import functools
from collections import namedtuple

import torch
import torchvision.models as models
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}
IMAGE_SIZE, BATCH_SIZE, CONTENT_WEIGHT, STYLE_WEIGHT, LR = 16, 4, 1e5, 1e10, 1e-5


class TransformerNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # Initial convolution layers
        self.conv1 = ConvLayer(3, 32, kernel_size=9, stride=1)
        self.in1 = torch.nn.InstanceNorm2d(32, affine=True)
        self.conv2 = ConvLayer(32, 64, kernel_size=3, stride=2)
        self.in2 = torch.nn.InstanceNorm2d(64, affine=True)
        self.conv3 = ConvLayer(64, 128, kernel_size=3, stride=2)
        self.in3 = torch.nn.InstanceNorm2d(128, affine=True)
        # Residual layers
        self.res1 = ResidualBlock(128)
        self.res2 = ResidualBlock(128)
        self.res3 = ResidualBlock(128)
        self.res4 = ResidualBlock(128)
        self.res5 = ResidualBlock(128)
        # Upsampling Layers
        self.deconv1 = UpsampleConvLayer(128, 64, kernel_size=3, stride=1, upsample=2)
        self.in4 = torch.nn.InstanceNorm2d(64, affine=True)
        self.deconv2 = UpsampleConvLayer(64, 32, kernel_size=3, stride=1, upsample=2)
        self.in5 = torch.nn.InstanceNorm2d(32, affine=True)
        self.deconv3 = ConvLayer(32, 3, kernel_size=9, stride=1)
        # Non-linearities
        self.relu = torch.nn.ReLU()

    def forward(self, X):
        y = self.relu(self.in1(self.conv1(X)))
        y = self.relu(self.in2(self.conv2(y)))
        y = self.relu(self.in3(self.conv3(y)))
        y = self.res1(y)
        y = self.res2(y)
        y = self.res3(y)
        y = self.res4(y)
        y = self.res5(y)
        y = self.relu(self.in4(self.deconv1(y)))
        y = self.relu(self.in5(self.deconv2(y)))
        y = self.deconv3(y)
        return y


class ConvLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super().__init__()
        reflection_padding = kernel_size // 2
        self.reflection_pad = torch.nn.ReflectionPad2d(reflection_padding)
        self.conv2d = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        out = self.reflection_pad(x)
        out = self.conv2d(out)
        return out


class ResidualBlock(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in1 = torch.nn.InstanceNorm2d(channels, affine=True)
        self.conv2 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in2 = torch.nn.InstanceNorm2d(channels, affine=True)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        residual = x
        out = self.relu(self.in1(self.conv1(x)))
        out = self.in2(self.conv2(out))
        out = out + residual
        return out


class UpsampleConvLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, upsample=None):
        super().__init__()
        self.upsample = upsample
        reflection_padding = kernel_size // 2
        self.reflection_pad = torch.nn.ReflectionPad2d(reflection_padding)
        self.conv2d = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        x_in = x
        if self.upsample:
            x_in = torch.nn.functional.interpolate(x_in, mode='nearest', scale_factor=self.upsample)
        out = self.reflection_pad(x_in)
        out = self.conv2d(out)
        return out


class Vgg16(torch.nn.Module):
    def __init__(self, requires_grad=False):
        super().__init__()
        vgg_pretrained_features = models.vgg16(weights=None).features  # (upstream: IMAGENET1K_V1)
        self.slice1 = torch.nn.Sequential()
        self.slice2 = torch.nn.Sequential()
        self.slice3 = torch.nn.Sequential()
        self.slice4 = torch.nn.Sequential()
        for x in range(4):
            self.slice1.add_module(str(x), vgg_pretrained_features[x])
        for x in range(4, 9):
            self.slice2.add_module(str(x), vgg_pretrained_features[x])
        for x in range(9, 16):
            self.slice3.add_module(str(x), vgg_pretrained_features[x])
        for x in range(16, 23):
            self.slice4.add_module(str(x), vgg_pretrained_features[x])
        if not requires_grad:
            for param in self.parameters():
                param.requires_grad = False

    def forward(self, X):
        h = self.slice1(X)
        h_relu1_2 = h
        h = self.slice2(h)
        h_relu2_2 = h
        h = self.slice3(h)
        h_relu3_3 = h
        h = self.slice4(h)
        h_relu4_3 = h
        vgg_outputs = namedtuple("VggOutputs", ['relu1_2', 'relu2_2', 'relu3_3', 'relu4_3'])
        out = vgg_outputs(h_relu1_2, h_relu2_2, h_relu3_3, h_relu4_3)
        return out


@functools.lru_cache(maxsize=1)
def vgg16() -> Vgg16:
    """The frozen loss network, built once (VGG16's classifier beside the features is 100M parameters to
    initialise)."""
    torch.manual_seed(0)
    return Vgg16(requires_grad=False)


def gram_matrix(y):
    (b, ch, h, w) = y.size()
    features = y.view(b, ch, w * h)
    features_t = features.transpose(1, 2)
    gram = features.bmm(features_t) / (ch * h * w)
    return gram


def normalize_batch(batch):
    # normalize using imagenet mean and std
    mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    batch = batch.div_(255.0)
    return (batch - mean) / std


class Train(Loop):
    """train()'s inner loop, with the run's calls; VGG runs under run.autocast() as it runs under upstream's device."""

    name = "fast_neural_style"

    def start(self, held, run):
        self.mse_loss = torch.nn.MSELoss()
        self.vgg = vgg16()
        style = digits(size=IMAGE_SIZE, samples=48, channels=3)[0][-1].mul(255)  # utils.load_image, style_transform
        style = style.repeat(BATCH_SIZE, 1, 1, 1).to(run.device)
        features_style = self.vgg(normalize_batch(style))
        self.gram_style = [gram_matrix(y) for y in features_style]

    def step(self, index, run, held, batch, loss_of):
        x, _ = batch
        n_batch = len(x)
        held.optimizer.zero_grad()
        with run.autocast():
            y = run.model(x)

            y = normalize_batch(y)
            x = normalize_batch(x)

            features_y = self.vgg(y)
            features_x = self.vgg(x)

            content_loss = CONTENT_WEIGHT * self.mse_loss(features_y.relu2_2, features_x.relu2_2)

            style_loss = 0.
            for ft_y, gm_s in zip(features_y, self.gram_style):
                gm_y = gram_matrix(ft_y)
                style_loss += self.mse_loss(gm_y, gm_s[:n_batch, :, :])
            style_loss *= STYLE_WEIGHT

            total_loss = content_loss + style_loss
        run.backward(total_loss)
        run.step()
        return total_loss.detach()


def build() -> Setup:
    torch.manual_seed(42)
    images, labels = digits(size=IMAGE_SIZE, samples=12, channels=3)
    transformer = TransformerNet()
    optimizer = Adam(transformer.parameters(), LR)
    loader = DataLoader(TensorDataset(images.mul(255), labels), batch_size=BATCH_SIZE)
    return Setup(transformer, optimizer, loader, loop=Train())
