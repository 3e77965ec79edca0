"""pytorch/tutorials advanced_source/static_quantization_tutorial.rst, "Quantization-aware training": the tutorial's
MobileNetV2 (ConvBNReLU, InvertedResidual with ``nn.quantized.FloatFunctional`` for the skip, QuantStub and
DeQuantStub), ``fuse_model(is_qat=True)``, SGD at lr 1e-4 built before ``prepare_qat`` (the fused modules keep the
parameters), the x86 QAT qconfig, then ``torch.ao.quantization.prepare_qat(qat_model, inplace=True)``; for each
epoch train_one_epoch (model.train(), then per batch output = model(image), loss, zero_grad, backward, step, at most
ntrain_batches), then past some epochs ``qat_model.apply(torch.ao.quantization.disable_observer)`` and
``qat_model.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)``, and every epoch ``convert(qat_model.eval(),
inplace=False)`` evaluated on the test images.

Smaller: inverted_residual_setting [[1, 8, 1, 1], [6, 8, 2, 2]], width_mult 0.25 and a last_channel of 64 (upstream
the seven stages of MobileNetV2 at 1.0, 1280 last), real digits at 16x16 on 3 channels in batches of 8 (upstream
ImageNet at 224), lr 0.05 (upstream fine-tunes a pretrained model at 1e-4: three steps would not move it), one batch
an epoch, the observers frozen after epoch 1 and BatchNorm after epoch 0 (upstream 3 and 2). An epoch's batches
are the harness's next ones (upstream iterates the loader anew each epoch). The run's calls: run.model,
run.autocast(), run.backward(loss), run.step(); the epoch's model.train(), the apply() calls and the conversion
are on the user's qat_model, as upstream."""
import torch
import torch.nn as nn
from torch.ao.quantization import DeQuantStub, QuantStub
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {"prune": ("no module of type", "torch.fx cannot trace", "cannot run")}
NTRAIN = 1


def _make_divisible(v, divisor, min_value=None):
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU(nn.Sequential):
    def __init__(self, in_planes, out_planes, kernel_size=3, stride=1, groups=1):
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_planes, out_planes, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_planes, momentum=0.1),
            nn.ReLU(inplace=False)
        )


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        self.stride = stride
        assert stride in [1, 2]
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = self.stride == 1 and inp == oup
        layers = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU(inp, hidden_dim, kernel_size=1))
        layers.extend([
            ConvBNReLU(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup, momentum=0.1),
        ])
        self.conv = nn.Sequential(*layers)
        self.skip_add = nn.quantized.FloatFunctional()

    def forward(self, x):
        if self.use_res_connect:
            return self.skip_add.add(x, self.conv(x))
        else:
            return self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes=1000, width_mult=1.0, inverted_residual_setting=None, round_nearest=8,
                 last_channel=1280):
        super().__init__()
        block = InvertedResidual
        input_channel = 32
        input_channel = _make_divisible(input_channel * width_mult, round_nearest)
        self.last_channel = _make_divisible(last_channel * max(1.0, width_mult), round_nearest)
        features = [ConvBNReLU(3, input_channel, stride=2)]
        for t, c, n, s in inverted_residual_setting:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                stride = s if i == 0 else 1
                features.append(block(input_channel, output_channel, stride, expand_ratio=t))
                input_channel = output_channel
        features.append(ConvBNReLU(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.quant = QuantStub()
        self.dequant = DeQuantStub()
        self.classifier = nn.Sequential(
            nn.Dropout(0.2),
            nn.Linear(self.last_channel, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_out')
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.quant(x)
        x = self.features(x)
        x = x.mean([2, 3])
        x = self.classifier(x)
        x = self.dequant(x)
        return x

    def fuse_model(self, is_qat=False):
        fuse_modules = torch.ao.quantization.fuse_modules_qat if is_qat else torch.ao.quantization.fuse_modules
        for m in self.modules():
            if type(m) is ConvBNReLU:
                fuse_modules(m, ['0', '1', '2'], inplace=True)
            if type(m) is InvertedResidual:
                for idx in range(len(m.conv)):
                    if type(m.conv[idx]) is nn.Conv2d:
                        fuse_modules(m.conv, [str(idx), str(idx + 1)], inplace=True)


class Train(Loop):
    """for nepoch in range(8): train_one_epoch(...); disable_observer, freeze_bn_stats; convert and evaluate."""

    name = "qat"

    def __init__(self):
        self.criterion = nn.CrossEntropyLoss()
        images, labels = digits(size=16, samples=64, channels=3)
        self.test = images[48:], labels[48:]
        self.evaluations = []

    def step(self, index, run, held, batch, loss_of):
        if index % NTRAIN == 0:
            held.model.train()  # train_one_epoch: model.train()
        image, target = batch
        with run.autocast():
            output = run.model(image)
            loss = self.criterion(output, target)
        run.backward(loss)
        run.step()  # optimizer.zero_grad(), loss.backward(), optimizer.step()
        return loss.detach()

    def after(self, index, held, run, loss):
        if (index + 1) % NTRAIN:
            return
        nepoch, qat_model = index // NTRAIN, held.model
        if nepoch > 1:
            qat_model.apply(torch.ao.quantization.disable_observer)
        if nepoch > 0:
            qat_model.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)
        quantized_model = torch.ao.quantization.convert(qat_model.eval(), inplace=False)
        quantized_model.eval()
        with torch.no_grad():
            self.evaluations.append(quantized_model(self.test[0]))

    def observed(self):
        return {f"quantized model's output after epoch {i}": out for i, out in enumerate(self.evaluations)}


def build() -> Setup:
    torch.manual_seed(191009)
    torch.backends.quantized.engine = "x86"
    qat_model = MobileNetV2(num_classes=10, width_mult=0.25, inverted_residual_setting=[[1, 8, 1, 1], [6, 8, 2, 2]],
                            last_channel=64)
    qat_model.fuse_model(is_qat=True)
    optimizer = torch.optim.SGD(qat_model.parameters(), lr=0.05)
    qat_model.qconfig = torch.ao.quantization.get_default_qat_qconfig('x86')
    torch.ao.quantization.prepare_qat(qat_model, inplace=True)
    images, labels = digits(size=16, samples=48, channels=3)
    loader = DataLoader(TensorDataset(images, labels), batch_size=8,
                        sampler=torch.utils.data.RandomSampler(TensorDataset(images, labels),
                                                               generator=torch.Generator().manual_seed(0)))
    return Setup(qat_model, optimizer, loader, loop=Train())
