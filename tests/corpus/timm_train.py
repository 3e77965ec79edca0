"""timm's train.py (train_one_epoch): a model from timm.create_model, --grad-checkpointing
(model.set_grad_checkpointing()), Mixup (mixup and cutmix, label smoothing) with SoftTargetCrossEntropy,
create_optimizer_v2 (AdamW, weight decay off the norms and biases), ModelEmaV3 updated after every optimizer step,
create_scheduler_v2 stepped per update (step_update(num_updates)), gradients clipped (dispatch_clip_grad, norm 1.0)
before the step; its loss scaler's place taken by the run (run.backward, run.unscale_gradients(), run.step()).

timm's own test_resnet at 32x32 on real digits over 3 channels, ten classes. The model checkpoints its own stages
(timm's checkpoint_seq), which recomputes its BatchNorm statistics in backward: activation_checkpointing stands
aside, and says so; compile is refused for the whole model (its recomputation would count the batches once)."""
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {"compile": ("checkpoints its own activations",)}
SKIPS = {"activation_checkpointing": "checkpoints its own activations"}


class Train(Loop):
    name = "timm_train"

    def start(self, held, run):
        from timm.data import Mixup
        from timm.loss import SoftTargetCrossEntropy
        from timm.scheduler import create_scheduler_v2
        from timm.utils import ModelEmaV3

        np.random.seed(0)  # Mixup draws its lambda from numpy
        self.mixup_fn = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)
        self.train_loss_fn = SoftTargetCrossEntropy()
        self.model_ema = ModelEmaV3(held.model, decay=0.9)
        self.lr_scheduler, _ = create_scheduler_v2(run.optimizer, sched="cosine", num_epochs=4, warmup_epochs=1,
                                                   step_on_epochs=False, updates_per_epoch=2)
        self.num_updates = 0

    def step(self, index, run, held, batch, loss_of):
        from timm.utils import dispatch_clip_grad

        input, target = batch
        input, target = self.mixup_fn(input, target)
        with run.autocast():
            output = run.model(input)
            loss = self.train_loss_fn(output, target)
        run.backward(loss)
        run.unscale_gradients()
        dispatch_clip_grad(held.model.parameters(), value=1.0, mode="norm")
        run.step()
        self.num_updates += 1
        self.model_ema.update(held.model, step=self.num_updates)
        self.lr_scheduler.step_update(num_updates=self.num_updates)
        return loss.detach()

    def observed(self):
        return {f"ema {k}": v for k, v in self.model_ema.module.state_dict().items()}


def build() -> Setup:
    import timm
    from timm.optim import create_optimizer_v2

    torch.manual_seed(42)
    model = timm.create_model("test_resnet", num_classes=10)
    model.set_grad_checkpointing(enable=True)
    optimizer = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    images, labels = digits(size=32, samples=12, channels=3)
    loader = DataLoader(TensorDataset(images, labels), batch_size=4, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(42))
    return Setup(model, optimizer, loader, loop=Train())
