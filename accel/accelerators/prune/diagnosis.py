"""Why ModelSpeedup would leave a layer no channel (values alike for every input, groups), named before surgery."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

NNI_BATCH = 8  # ModelSpeedup's batch_size: the samples of its random batch, and what it takes for a batched tensor
NNI_SAME = 1e-6  # ModelSpeedup.STD_DELTA: a value whose std over the batch is below this counts as pruned
CHANNEL_DIM = {"Conv1d": 1, "Conv2d": 1, "ConvTranspose2d": 1, "BatchNorm1d": 1, "BatchNorm2d": 1,
               "InstanceNorm2d": 1, "GroupNorm": 1, "Linear": -1, "LayerNorm": -1, "Embedding": -1}
SETS_OUTPUT = ("Conv1d", "Conv2d", "ConvTranspose2d", "Linear", "Embedding")  # output channels of their own
TRAIN_FIRST = ("weights that vary across channels and inputs: trained ones (a fresh initialization sets such "
               "constants), or warmup_steps to train these first")


def _same_along_first(tensor: torch.Tensor) -> torch.Tensor:
    """Where a tensor's values are equal along its first dimension (ModelSpeedup.direct_calc_mask's test)."""
    if tensor.is_floating_point():
        return tensor.detach().float().std(dim=0) < NNI_SAME
    return (tensor == tensor[:1]).all(dim=0)


def same_for_every_input(graph: torch.fx.GraphModule, dummy: Any) -> dict[str, tuple[str, str]]:
    """{node: (kind, what)} for the values NNI's mask inference will find the same for every sample, and so take
    for pruned, whatever the masks. ModelSpeedup runs the model on a random batch of 8 (weights redrawn between their
    minimum and maximum, integer inputs between the dummy's) and takes any tensor a function reads whose size is a
    multiple of 8 for a batch. So these vary for no input: "tensor", a get_attr tensor equal along its first
    dimension (a fresh norm weight of ones); "layer", the output of a layer whose weight is all zero (torchvision's
    ViT head); "input", an integer input that is one number everywhere in the dummy."""
    found: dict[str, tuple[str, str]] = {}
    inputs = [n for n in graph.graph.nodes if n.op == "placeholder"]
    for node, value in zip(inputs, dummy if isinstance(dummy, tuple) else (dummy,)):
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.numel() > 1 \
                and value.min() == value.max():
            found[node.name] = ("input", f"{node.name!r} ({value.flatten()[0].item()} everywhere)")
    for node in graph.graph.nodes:
        if node.op == "get_attr":
            owner, _, name = node.target.rpartition(".")  # (the GraphModule holds its own copy of each)
            value = getattr(graph.get_submodule(owner), name, None)
            # (ModelSpeedup.tensor_propagate_check: a tensor of more than 8 values, a multiple of 8, is a batch)
            if isinstance(value, torch.Tensor) and value.dim() and value.size(0) > 1 and value.numel() > NNI_BATCH \
                    and value.numel() % NNI_BATCH == 0 and _same_along_first(value).all():
                what = (f"{value.flatten()[0].item():g} everywhere" if value.min() == value.max()
                        else "the same along its first dimension")
                found[node.name] = ("tensor", f"{node.target!r} ({what})")
        elif node.op == "call_module":
            weight = getattr(graph.get_submodule(node.target), "weight", None)
            if isinstance(weight, torch.Tensor) and weight.numel() and not weight.detach().any():
                found[node.name] = ("layer", f"{node.target!r}")
    return found


CAUSES = {
    "input": "integer inputs that are one number everywhere in the dummy input, between whose minimum and maximum "
             "NNI draws its batch: {}",
    "tensor": "tensors that functions read, which NNI takes for batches along their first dimension: {}",
    "layer": "layers whose weight is all zero, so that they give the same output for every input: {}",
}


def _kept(mask: Any, dim: int) -> torch.Tensor | None:
    """Which channels along dim a mask keeps (some value of the channel not masked), as NNI's coarse masks do."""
    if not isinstance(mask, torch.Tensor) or mask.dim() == 0:
        return None
    dim = dim % mask.dim()
    return mask.sum(dim=[d for d in range(mask.dim()) if d != dim]) != 0 if mask.dim() > 1 else mask != 0


def empty_layers(graph: torch.fx.GraphModule, node_infos: Mapping) -> list[tuple[str, str, str, bool]]:
    """(layer, its class and groups, what it keeps no channel of, whether a group of a grouped convolution did) for
    the layers ModelSpeedup would rebuild with no channel on a side, from the masks it inferred (NNI's
    convert_to_coarse_mask: a channel is kept where any of its values is): no input channel; no output channel for
    a layer that makes its own (Conv, Linear, Embedding); or a group of a grouped convolution that keeps channels
    on one side only. NNI cannot build those: EmptyLayerError or UnBalancedGroupError for a convolution, and a
    Linear(0, 0) or LayerNorm((0,)) that breaks the model otherwise."""
    found, seen = [], set()
    for node in graph.graph.nodes:
        if node.op != "call_module" or node.target in seen:
            continue
        seen.add(node.target)  # NNI rebuilds a shared layer once, from its first call
        module = graph.get_submodule(node.target)
        kind = type(module).__name__
        if (dim := CHANNEL_DIM.get(kind)) is None:
            continue
        source = next((a for a in node.args if isinstance(a, torch.fx.Node)), None)
        kept_in = _kept(node_infos[source].output_masks, dim) if source is not None and kind != "Embedding" else None
        kept_out = _kept(node_infos[node].output_masks, dim)
        sides = [("input", kept_in)] + ([("output", kept_out)] if kind in SETS_OUTPUT else [])
        lost = [f"no {side} channel (0 of {len(kept)} kept)" for side, kept in sides
                if kept is not None and len(kept) and not kept.any()]
        groups = getattr(module, "groups", 1)
        kind += f", groups={groups}" if groups > 1 else ""
        if lost:
            found.append((node.target, kind, " and ".join(lost), False))
        elif groups > 1 and kept_in is not None and kept_out is not None:
            per_in, per_out = kept_in.view(groups, -1).sum(1), kept_out.view(groups, -1).sum(1)
            if bad := [g for g in range(groups) if (per_in[g] > 0) != (per_out[g] > 0)]:
                found.append((node.target, kind, f"group {bad[0]} keeping {int(per_in[bad[0]])} input and "
                              f"{int(per_out[bad[0]])} output channels ({len(bad)} such group(s))", True))
    return found


def _masked(mask: Any) -> bool:
    return isinstance(mask, torch.Tensor) and mask.numel() > 0 and not mask.any()


def _some(items: list[str], quote: bool = True, shown: int = 4) -> str:
    text = ", ".join(repr(i) if quote else i for i in items[:shown])
    return text + (f" and {len(items) - shown} more" if len(items) > shown else "")


def empty_message(speedup: Any) -> tuple[str, str]:
    """(what is wrong, what is allowed): which layer NNI's ModelSpeedup (its mask inference run, ``.empty`` found)
    would empty, and why: the values it takes for pruned because they vary for no input, a grouped convolution whose
    groups lose their channels apart, or masks that leave a layer nothing."""
    graph, node_infos = speedup.graph_module, speedup.node_infos
    causes = same_for_every_input(graph, speedup.dummy_input)
    (layer, kind, lost, grouped), *others = speedup.empty
    text = f"pruning would leave layer {layer!r} ({kind}) with {lost}"
    if others:
        text += f", and {len(others)} more layer(s) too: {_some([other[0] for other in others])}"
    nodes = {n.name: n for n in graph.graph.nodes}
    if hit := {node: cause for node, cause in causes.items()
               if node in nodes and _masked(node_infos[nodes[node]].output_masks)}:
        kinds = {each: [what for cause, what in hit.values() if cause == each] for each, _ in hit.values()}
        text += (". NNI's ModelSpeedup takes for pruned every value that is the same for all the samples of its "
                 "random batch; these are: " + "; ".join(CAUSES[k].format(_some(v, quote=False))
                                                         for k, v in kinds.items()))
        output = next(n for n in graph.graph.nodes if n.op == "output")
        if all(_masked(m) for m in tree_leaves(node_infos[output].output_masks) if isinstance(m, torch.Tensor)):
            text += "; so the model's whole output counts as pruned, and NNI spreads that back to the layers that " \
                    "feed it"
        return text, TRAIN_FIRST
    if grouped:
        return (text + ": a grouped convolution keeps or loses each group's input and output channels together, "
                "but its inputs follow the layers before it and its outputs its own mask (or the layers after it)",
                f"grouped convolutions left out of config_list (exclude_op_names=[{layer!r}, ...]), so that "
                "their outputs follow their inputs")
    return (text + ": the masks of the layers around it leave it nothing",
            "fewer layers selected, or a lower sparse_ratio")

