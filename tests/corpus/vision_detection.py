"""torchvision's references/detection (engine.py's train_one_epoch at epoch 0; train.py's main: utils.collate_fn, a
BatchSampler over a RandomSampler, the trainable parameters into SGD with momentum 0.9 and weight decay 1e-4 at lr
0.02), on a Faster R-CNN built as torchvision.models.detection.FasterRCNN's docstring builds one on a classification
backbone (mobilenet_v2's features, an AnchorGenerator, MultiScaleRoIAlign on the feature map '0'), its BatchNorm
frozen as torchvision's detection builders freeze a pretrained backbone's (FrozenBatchNorm2d).

What makes it another kind of loop: batches are tuples of lists (images, and one dict of boxes, labels and an int
image_id per image), the model takes the targets and returns a dict of four losses, summed; proposals are sampled
with torch's generator (BalancedPositiveNegativeSampler's randperm); the first epoch warms the learning rate up per
iteration (LinearLR from 1/1000, stepped after every batch).

Small: mobilenet_v2(width_mult=0.25)'s first 8 features (stride 16, 16 channels out; upstream's docstring keeps all
19, 1280 channels), box head of 128 (TwoMLPHead's representation; fasterrcnn_* builders use 1024), fewer proposals and
sampled RoIs; images of 64x64 (min_size = max_size = 64) with one real digit each, at a random place, labelled 1-10.
(Training BatchNorm here, over the last 2x2 feature maps of two images (all 19 features), made the first gradients 10%
apart between two summation orders of the same math: no card below "changed" could hold it, with or without accel.)"""
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.rpn import AnchorGenerator

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}
OPTIONS = {"compile": {"backend": "aot_eager", "regional": True}}  # as plan="auto" tries it on repeated blocks: the
# whole model took 30-45 s to compile here (graph breaks in GeneralizedRCNNTransform, dynamo's recompile_limit on
# InvertedResidual.forward), then stepped slower than eager
CANVAS, DIGIT, NUM_CLASSES, REPRESENTATION = 64, 16, 11, 128


class Scenes(Dataset):
    """One digit per image at a random place, as a detection dataset gives (image, target)."""

    def __init__(self, samples: int, seed: int = 0):
        images, labels = digits(size=DIGIT, samples=samples, channels=3)
        generator = torch.Generator().manual_seed(seed)
        self.items = []
        for index, (image, label) in enumerate(zip(images, labels)):
            x0, y0 = (int(v) for v in torch.randint(0, CANVAS - DIGIT, (2,), generator=generator))
            canvas = torch.zeros(3, CANVAS, CANVAS)
            canvas[:, y0:y0 + DIGIT, x0:x0 + DIGIT] = image
            boxes = torch.tensor([[x0, y0, x0 + DIGIT, y0 + DIGIT]], dtype=torch.float32)
            self.items.append((canvas, {"boxes": boxes, "labels": label.view(1) + 1, "image_id": index,
                                        "area": (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]),
                                        "iscrowd": torch.zeros(1, dtype=torch.int64)}))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def collate_fn(batch):
    return tuple(zip(*batch))


class Train(Loop):
    """train_one_epoch(epoch=0) with the run's calls: the warm-up scheduler on run.optimizer, stepped every batch."""

    name = "torchvision_detection"

    def start(self, held, run):
        warmup_factor = 1.0 / 1000
        warmup_iters = min(1000, len(held.loader) - 1)
        self.lr_scheduler = torch.optim.lr_scheduler.LinearLR(run.optimizer, start_factor=warmup_factor,
                                                              total_iters=warmup_iters)

    def step(self, index, run, held, batch, loss_of):
        images, targets = batch
        images = list(image.to(run.device) for image in images)
        targets = [{k: v.to(run.device) if isinstance(v, torch.Tensor) else v for k, v in t.items()} for t in targets]
        with run.autocast():
            loss_dict = run.model(images, targets)
            losses = sum(loss for loss in loss_dict.values())
        run.backward(losses)
        run.step()
        self.lr_scheduler.step()
        return losses.detach()


def build() -> Setup:
    torch.manual_seed(0)
    backbone = torchvision.models.mobilenet_v2(weights=None, width_mult=0.25,
                                               norm_layer=torchvision.ops.FrozenBatchNorm2d).features[:8]
    backbone.out_channels = 16
    anchor_generator = AnchorGenerator(sizes=((16, 32),), aspect_ratios=((0.5, 1.0, 2.0),))
    roi_pooler = torchvision.ops.MultiScaleRoIAlign(featmap_names=['0'], output_size=7, sampling_ratio=2)
    model = FasterRCNN(backbone, rpn_anchor_generator=anchor_generator, box_roi_pool=roi_pooler,
                       box_head=TwoMLPHead(backbone.out_channels * 7 * 7, REPRESENTATION),
                       box_predictor=FastRCNNPredictor(REPRESENTATION, NUM_CLASSES), min_size=CANVAS, max_size=CANVAS,
                       rpn_pre_nms_top_n_train=100, rpn_post_nms_top_n_train=50, rpn_batch_size_per_image=64,
                       box_batch_size_per_image=32)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.02, momentum=0.9, weight_decay=1e-4)
    dataset = Scenes(samples=6)
    train_sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
    train_batch_sampler = torch.utils.data.BatchSampler(train_sampler, 2, drop_last=True)
    loader = DataLoader(dataset, batch_sampler=train_batch_sampler, num_workers=0, collate_fn=collate_fn)
    return Setup(model, optimizer, loader, loop=Train())
