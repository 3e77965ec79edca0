"""A warning accel gives inside a torch.fx GraphModule's forward (torchvision's create_feature_extractor and timm's
feature nets are GraphModules) named the module's generated code, ``<eval_with_key>.0 from ... in forward``, not the
loop's line: loops_level stopped at the first frame outside accel's and torch's folders, and torch.fx's generated
forwards have no file there."""
import warnings

import torch
from torch import nn

import accel
from accel.testing import tiny_loader


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.linear(x)) + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.block, self.head = nn.Linear(64, 32), Block(32), nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.block(self.stem(x.flatten(1))))


class BlocksAsLeaves(torch.fx.Tracer):
    def is_leaf_module(self, module, name):
        return isinstance(module, Block) or super().is_leaf_module(module, name)


def test_a_warning_inside_a_graph_modules_forward_names_the_loops_line():
    net = Net()
    model = torch.fx.GraphModule(net, BlocksAsLeaves().trace(net))
    model.block.linear.register_forward_hook(lambda module, args, output: None)  # checkpointing falls back, said
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = accel.accelerate(model, optimizer, tiny_loader(), [{"activation_checkpointing": {"modules": ["Block"]}}],
                           device="cpu")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for x, y in run.loader:
                run.backward(nn.functional.cross_entropy(run.model(x), y))  # the loop's line
                run.step()
    finally:
        run.close()
    said = [w for w in caught if "activation_checkpointing" in str(w.message)]
    assert said and {w.filename for w in said} == {__file__}, [(w.filename, str(w.message)[:60]) for w in caught]
