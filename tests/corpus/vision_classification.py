"""torchvision's references/classification/train.py (train_one_epoch and main): a torchvision model (--model
densenet121's class, DenseNet, at its smallest), CrossEntropyLoss(label_smoothing=0.1), parameters split by
torchvision.ops._utils.split_normalization_params (no weight decay on the norms), SGD with momentum, warm-up then
cosine (SequentialLR of LinearLR and CosineAnnealingLR), RandomMixup/RandomCutmix in the collate function,
clip_grad_norm_, and the ExponentialMovingAverage of its utils (an AveragedModel over parameters and buffers) every
step; with the run's calls (the scheduler on run.optimizer).

DenseNet hands each layer the list of every earlier feature map and appends to it afterwards: activation
checkpointing recomputes each layer from the list as it was. Real digits at 32x32 over 3 channels, ten classes."""
import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """references/classification/utils.py: an EMA of the parameters and buffers (use_buffers=True)."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def mixup_cutmix(num_classes: int):
    """main(): RandomChoice of MixUp and CutMix (torchvision.transforms.v2) over default_collate's batch."""
    from torchvision.transforms import v2

    choice = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=num_classes), v2.CutMix(alpha=1.0,
                                                                                     num_classes=num_classes)])
    return lambda batch: choice(*default_collate(batch))


class Train(Loop):
    name = "torchvision_classification"

    def start(self, held, run):
        self.criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
        warmup = torch.optim.lr_scheduler.LinearLR(run.optimizer, start_factor=0.01, total_iters=2)
        main = torch.optim.lr_scheduler.CosineAnnealingLR(run.optimizer, T_max=4)
        self.lr_scheduler = torch.optim.lr_scheduler.SequentialLR(run.optimizer, [warmup, main], milestones=[2])
        self.model_ema = ExponentialMovingAverage(held.model, decay=0.9)

    def step(self, index, run, held, batch, loss_of):
        image, target = batch
        with run.autocast():
            output = run.model(image)
            loss = self.criterion(output, target)
        run.backward(loss)
        run.unscale_gradients()
        nn.utils.clip_grad_norm_(held.model.parameters(), 1.0)
        run.step()
        self.model_ema.update_parameters(held.model)
        self.lr_scheduler.step()  # (per epoch upstream)
        return loss.detach()

    def observed(self):
        return {f"ema {k}": v for k, v in self.model_ema.module.state_dict().items()}


def build() -> Setup:
    torch.manual_seed(0)
    model = torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2,
                                        num_classes=10)
    param_groups = torchvision.ops._utils.split_normalization_params(model)
    parameters = [{"params": p, "weight_decay": w} for p, w in zip(param_groups, [0.0, 1e-4]) if p]
    optimizer = torch.optim.SGD(parameters, lr=0.05, momentum=0.9, weight_decay=1e-4)
    images, labels = digits(size=32, samples=12, channels=3)
    loader = DataLoader(TensorDataset(images, labels), batch_size=4, shuffle=True, collate_fn=mixup_cutmix(10),
                        generator=torch.Generator().manual_seed(0))
    return Setup(model, optimizer, loader, loop=Train())
