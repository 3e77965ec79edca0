"""prune: structured pruning with NNI 3.0, made real: NNI's masks become a smaller model (ModelSpeedup).

What it does: on a deep copy of the model, swapped in only when everything worked, optional warm-up or Taylor
steps train the copy on the loader, an NNI pruner (L1, L2, FPGM, Taylor) chooses whole channels of the layers
the config list selects, and ModelSpeedup rebuilds the layers without them: fewer parameters and FLOPs, not
zeros. The optimizer is rebuilt on the new parameters (same class and hyperparameters, state reset). NNI's own
tracer fails on torch >= 2.2 (microsoft/nni#5768), so ModelSpeedup gets a torch.fx graph; a model fx cannot
trace is refused at plan time, naming the module that failed. ModelSpeedup takes every value that is the same
for all the samples of its random batch for pruned, so the constants of a fresh initialization (a ViT's zero
head, ConvNeXt's LayerNorm2d weights and layer_scale) would empty layers: a layer it would leave with no channel
is named with the values that caused it, at plan time when nothing trains before pruning (its mask inference
runs on a copy, only for models holding such constants), else while applying, before NNI rebuilds anything.

When it helps: a model wider than its task, whose time goes into the pruned layers. Here (Zen 4, 2 cores,
Adam, batch 64, 3x32x32, L1 at 0.5 on every Conv2d) the book's CNN went from 2,122,186 to 1,059,306 parameters
and took 0.34 of the unpruned step time, resnet18 0.54 (docs/accelerators/prune.md). When it hurts: accuracy,
when the ratio is too high (it removes capacity: fine-tune after it); setup time (NNI runs the model several
times to propagate masks); and little gain where the time is spent outside the pruned layers.

What it keeps exactly: parameter names; which parameters are frozen; tied parameters (one tensor: a tie that
pruning would reshape is refused at plan time); the shape of the model's output (the layers producing it are
never pruned unless named in op_names); the weights and BatchNorm statistics of the channels kept; each
module's train/eval mode; tensors the optimizer trains beside the model; the user's objects and random states
(taking a batch from the loader advances neither the loader's generator nor torch's). What it changes, as
declared: the channels it removes and the shapes of the layers they fed, the copy's weights trained by warm-up
or Taylor steps, and the optimizer's state (reset).
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import logging
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from accel.accelerator import Accelerator, Keeps, Option, Stage, at_least, register
from accel.errors import Problem
from accel.optim import copy_with_optimizer, describe_optimizer, init_kwargs, rebuild_optimizer, same_params
from accel import randomness
from accel.randomness import first_batch
from accel.modules import tied_groups
from accel.batches import describe_batch, map_tensors, move

PRUNERS = {"l1": "L1NormPruner", "l2": "L2NormPruner", "fpgm": "FPGMPruner", "taylor": "TaylorPruner"}
QUIET = logging.getLogger("accel.prune.nni")  # ModelSpeedup logs every node at INFO by default
QUIET.setLevel(logging.WARNING)
DEFAULT_CONFIG = [{"op_types": ["Conv2d"], "sparse_ratio": 0.5}]
SELECTORS = ("op_types", "op_names", "op_names_re")
NAME_LISTS = (*SELECTORS, "exclude_op_names", "exclude_op_types", "exclude_op_names_re")
GRANULARITIES = ("default", "in_channel", "out_channel", "per_channel")
CONFIG_KEYS = (*NAME_LISTS, "sparse_ratio", "sparse_threshold", "max_sparse_ratio", "min_sparse_ratio",
               "global_group_id", "dependency_group_id", "granularity", "align", "target_names", "target_settings")


def config_problems(config_list: Any, model: nn.Module) -> list[str]:
    """What is wrong with an NNI pruning config list (NNI 3.0's schema), checked against the model's modules."""
    if not isinstance(config_list, list) or not config_list:
        return ["must be a non-empty list of NNI config dicts"]
    modules = dict(model.named_modules())
    types = {type(m).__name__ for m in modules.values()}
    found = []
    for i, config in enumerate(config_list):
        where = f"config_list[{i}]"
        if not isinstance(config, Mapping):
            found.append(f"{where}: {config!r} is not a dict")
            continue
        for key in config:
            if key not in CONFIG_KEYS:
                hint = difflib.get_close_matches(str(key), CONFIG_KEYS, n=1)
                found.append(f"{where}: unknown key {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
        if not any(config.get(k) for k in SELECTORS):
            found.append(f"{where}: names no layers (give op_types, op_names or op_names_re)")
        for key in NAME_LISTS:
            value = config.get(key)
            if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                found.append(f"{where}.{key}: {value!r} is not a list of strings")
            elif value and key in ("op_names", "exclude_op_names"):
                missing = [v for v in value if v not in modules]
                if missing:
                    found.append(f"{where}.{key}: no module named {missing} in the model")
            elif value and key.endswith("_re"):
                bad = [f"{v!r} ({regex_error(v)})" for v in value if regex_error(v)]
                if bad:
                    found.append(f"{where}.{key}: not regular expressions: {', '.join(bad)}")
            elif value and key in ("op_types", "exclude_op_types"):
                missing = [v for v in value if v not in types]
                if missing:
                    found.append(f"{where}.{key}: no module of type {missing} in the model "
                                 f"(types are class names, e.g. 'Conv2d')")
        if "sparse_ratio" in config and "sparse_threshold" in config:
            found.append(f"{where}: give sparse_ratio or sparse_threshold, not both")
        if not any(k in config for k in ("sparse_ratio", "sparse_threshold", "target_settings")):
            found.append(f"{where}: says how much to prune nowhere (give sparse_ratio, e.g. 0.5)")
        for key in ("sparse_ratio", "max_sparse_ratio", "min_sparse_ratio"):
            value = config.get(key)
            if key in config and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1):
                found.append(f"{where}.{key}: {value!r} must be a number in [0, 1)")
        granularity = config.get("granularity")
        if granularity is not None and granularity not in GRANULARITIES and not isinstance(granularity, list):
            found.append(f"{where}.granularity: {granularity!r} is not one of {GRANULARITIES} or a list")
    return found


def regex_error(pattern: str) -> str | None:
    """Why a pattern is not a regular expression (None if it is): selected() must not fail on it."""
    try:
        re.compile(pattern)
    except re.error as error:
        return str(error)
    return None


def selected(config: Mapping, model: nn.Module) -> set[str]:
    """Names of the modules an NNI config dict selects (the rules of nni.compression.base.config, NNI 3.0)."""
    modules = dict(model.named_modules(remove_duplicate=False))

    def by_type(types):
        return {n for n, m in modules.items() if type(m).__name__ in types}

    def by_regex(patterns):
        return {n for n in modules if any(re.match(p, n) for p in patterns)}

    named = config.get("op_names") or config.get("op_names_re")
    names = set(config.get("op_names") or ()) | by_regex(config.get("op_names_re") or ())
    if config.get("op_types"):
        names = names & by_type(config["op_types"]) if named else by_type(config["op_types"])
    return (names - set(config.get("exclude_op_names") or ()) - by_regex(config.get("exclude_op_names_re") or ())
            - by_type(config.get("exclude_op_types") or ()))


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, remembering which module it was inside, so a failure can name it."""

    def __init__(self):
        super().__init__()
        self.path: list[str] = []

    def call_module(self, m, forward, args, kwargs):
        self.path.append(self.path_of_module(m))
        result = super().call_module(m, forward, args, kwargs)
        self.path.pop()
        return result


def fx_trace(model: nn.Module) -> torch.fx.GraphModule:
    """A GraphModule of the model, or a ValueError naming the module where torch.fx failed and why."""
    tracer = _Tracer()
    try:
        graph = tracer.trace(model)
    except Exception as error:
        name = tracer.path[-1] if tracer.path else ""  # the innermost module entered and not left
        where = (f"module {name!r} ({type(model.get_submodule(name)).__name__})" if name
                 else f"{type(model).__name__}.forward")
        raise ValueError(f"torch.fx cannot trace {where}: {type(error).__name__}: {error}") from error
    return torch.fx.GraphModule(tracer.root, graph)


def shape_changes(before: nn.Module, after: nn.Module) -> dict[str, str]:
    """{layer: 'weight (32, 3, 3, 3) -> (16, 3, 3, 3)'} for every layer whose weight shape changed."""
    old = {n: tuple(p.shape) for n, p in before.named_parameters()}
    changed = {}
    for name, param in after.named_parameters():
        layer, _, kind = name.rpartition(".")
        if kind == "weight" and old.get(name) != tuple(param.shape):
            changed[layer or name] = f"weight {old.get(name)} -> {tuple(param.shape)}"
    return changed


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def sets_features(module: nn.Module) -> bool:
    """Whether a layer decides its own output features (a weight of 2+ dims: Conv, Linear): a change of its input
    channels stops there. Norms, activations and pooling pass their input's channels on."""
    return any(p.dim() > 1 for p in module.parameters())


def output_layers(graph: torch.fx.GraphModule) -> list[str]:
    """Layers whose output reaches the model's output through ops that keep its channels (activations, pooling,
    flatten, additions, BatchNorm): pruning their channels would change the output's shape."""
    modules = dict(graph.named_modules())
    found, seen = set(), set()
    stack = [node for node in graph.graph.nodes if node.op == "output"]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "call_module" and sets_features(modules[node.target]):
            found.add(node.target)
        else:
            stack.extend(node.all_input_nodes)
    return sorted(found)


def reshaped(graph: torch.fx.GraphModule, pruned: set[str]) -> dict[str, str]:
    """{module or parameter: the pruned layer that may reshape it}: the pruned layers themselves, and what their
    outputs reach up to (and including) the next layers that decide their own features (their inputs shrink)."""
    modules = dict(graph.named_modules())
    found: dict[str, str] = {}
    for node in graph.graph.nodes:
        if node.op != "call_module" or node.target not in pruned:
            continue
        found.setdefault(node.target, node.target)
        stack, seen = list(node.users), set()
        while stack:
            user = stack.pop()
            if user in seen:
                continue
            seen.add(user)
            if user.op == "call_module":
                module = modules[user.target]
                if next(module.parameters(), None) is not None:
                    found.setdefault(user.target, node.target)
                if sets_features(module):
                    continue
            for arg in user.all_input_nodes:  # weights a function reads (F.linear(x, self.weight))
                if arg.op == "get_attr":
                    found.setdefault(arg.target, node.target)
            stack.extend(user.users)
    return found


def keep_outputs(config_list: list[dict], model: nn.Module, graph: torch.fx.GraphModule) -> tuple[list[dict],
                                                                                                    list[str]]:
    """The config list with the layers producing the model's output excluded (unless a config names them in
    op_names), and those layers."""
    outputs = output_layers(graph)
    configs, kept = [], set()
    for config in config_list:
        hit = [n for n in outputs if n in selected(config, model) and n not in (config.get("op_names") or ())]
        if hit:
            config = {**config, "exclude_op_names": [*(config.get("exclude_op_names") or ()), *hit]}
            kept.update(hit)
        configs.append(config)
    return configs, sorted(kept)


def structure_problems(config_list: list[dict], model: nn.Module, graph: torch.fx.GraphModule) -> list[str]:
    """Ties that pruning would reshape, and a config list that selects nothing once the output layers are kept."""
    configs, kept = keep_outputs(config_list, model, graph)
    pruned = set().union(*(selected(c, model) for c in configs))
    found = []
    if kept and not pruned:
        found.append(f"selects only {kept}, which produce the model's output and are kept so that its shape does "
                     "not change: select other layers (or name these in op_names, if pruning keeps their outputs)")
    at_risk = reshaped(graph, pruned)
    for group in tied_groups(model):
        for name in group:
            owner = name.rpartition(".")[0]
            source = at_risk.get(owner) or at_risk.get(name)
            if source:
                why = "selected by config_list" if source == owner else f"fed by the pruned layer {source!r}"
                found.append(f"parameters {group} are one tensor (tied) and pruning may reshape {owner or name!r} "
                             f"({why}); the surgery would untie them: add {source!r} to exclude_op_names, or untie "
                             "them")
                break
    return found


def model_input(batch: Any) -> torch.Tensor | None:
    """The model's input in a batch: the batch itself when it is a tensor, or the first item of an (inputs, ...)
    tuple or list; None for anything else (a dict of a tokenizer, say), which needs a dummy_input."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    return None


def trainable_batch(batch: Any) -> bool:
    """Warm-up and Taylor steps compute loss_fn(model(batch[0]), batch[1])."""
    return isinstance(batch, (list, tuple)) and len(batch) >= 2 and isinstance(batch[0], torch.Tensor)


@contextlib.contextmanager
def foreign_kept(optimizer: torch.optim.Optimizer | None, model: nn.Module):
    """Tensors the optimizer trains beside the model (a learned temperature) are the user's own objects, shared by
    the copy's optimizer: training the copy must leave their values and gradients as they were."""
    owned = {id(p) for p in model.parameters()}
    groups = optimizer.param_groups if optimizer is not None else []
    saved = [(p, p.detach().clone(), p.grad) for group in groups for p in group["params"] if id(p) not in owned]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value, grad in saved:
                tensor.copy_(value)
                tensor.grad = grad


@contextlib.contextmanager
def nni_quiet():
    logger = logging.getLogger("nni")
    level = logger.level
    logger.setLevel(logging.WARNING)  # NNI logs every replaced module at INFO
    try:
        yield
    finally:
        logger.setLevel(level)


def output_shapes(model: nn.Module, dummy: Any) -> Any:
    with torch.no_grad():
        output = model(*dummy) if isinstance(dummy, tuple) else model(dummy)
    return map_tensors(lambda t: tuple(t.shape), output)


def retie(model: nn.Module, tied: list[list[str]], shapes: dict[str, torch.Size]) -> None:
    """Make tied parameters one tensor again: the surgery builds a new module per layer, so a tie comes back as
    equal copies. A tie whose shapes or values differ now cannot be restored (ValueError: the plan rolls back)."""
    for group in tied:
        params = [model.get_parameter(name) for name in group]
        if all(p is params[0] for p in params):
            continue
        if any(p.shape != shapes[n] for n, p in zip(group, params)) or not all(torch.equal(p, params[0])
                                                                              for p in params):
            raise ValueError(f"pruning untied the parameters {group} (one tensor before, now of shapes "
                             f"{[tuple(p.shape) for p in params]}): exclude their layers from config_list")
        for name in group[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, params[0])


def surgery(model: nn.Module, dummy: Any, masks: dict, speedup: Any) -> None:
    """ModelSpeedup in place, then put back what its new modules lose: ties, frozen flags and buffers of unchanged
    shape (BatchNorm statistics: NNI's first probe would update them, and new modules reset the batch count). The
    model is left in eval mode, so that no probe updates the statistics NNI copies for the kept channels."""
    tied = tied_groups(model)
    shapes = {n: p.shape for n, p in model.named_parameters(remove_duplicate=False)}
    trainable = {n: p.requires_grad for n, p in model.named_parameters(remove_duplicate=False)}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    model.eval()
    expected = output_shapes(model, dummy)
    speedup(model, dummy, masks, graph_module=fx_trace(model), logger=QUIET).speedup_model()
    found = output_shapes(model.eval(), dummy)  # NNI's new modules are made in training mode
    if found != expected:
        raise ValueError(f"pruning changed the model's output shape from {expected} to {found}: keep the layers "
                         "that produce the output out of config_list")
    retie(model, tied, shapes)
    for name, flag in trainable.items():
        model.get_parameter(name).requires_grad_(flag)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in buffers and buffers[name].shape == buffer.shape:
                buffer.copy_(buffers[name])


NNI_BATCH = 8  # ModelSpeedup's batch_size: the samples of its random batch, and what it takes for a batched tensor
NNI_SAME = 1e-6  # ModelSpeedup.STD_DELTA: a value whose std over the batch is below this counts as pruned
CHANNEL_DIM = {"Conv1d": 1, "Conv2d": 1, "ConvTranspose2d": 1, "BatchNorm1d": 1, "BatchNorm2d": 1,
               "InstanceNorm2d": 1, "GroupNorm": 1, "Linear": -1, "LayerNorm": -1, "Embedding": -1}
SETS_OUTPUT = ("Conv1d", "Conv2d", "ConvTranspose2d", "Linear", "Embedding")  # output channels of their own
TRAIN_FIRST = ("weights that vary across channels and inputs: trained ones (a fresh initialization sets such "
               "constants), or warmup_steps to train these first")


def _as_batch(tensor: torch.Tensor) -> bool:
    """Whether ModelSpeedup treats a tensor as a batch of samples (ModelSpeedup.tensor_propagate_check)."""
    return tensor.numel() > NNI_BATCH and tensor.numel() % NNI_BATCH == 0


def _same_along_first(tensor: torch.Tensor) -> torch.Tensor:
    """Where a tensor's values are equal along its first dimension (ModelSpeedup.direct_calc_mask's test)."""
    if tensor.is_floating_point():
        return tensor.detach().float().std(dim=0) < NNI_SAME
    return (tensor == tensor[:1]).all(dim=0)


def same_for_every_input(graph: torch.fx.GraphModule, dummy: Any) -> dict[str, tuple[str, str]]:
    """{node: (kind, what)} for the values NNI's mask inference will find the same for every sample, and so take
    for pruned, whatever the masks.

    ModelSpeedup runs the model on a random batch of 8 and removes whatever does not vary across it. It redraws
    each layer's weights uniformly between their minimum and maximum (a constant stays constant), draws integer
    inputs between the dummy's minimum and maximum, and takes any tensor a function reads whose size is a
    multiple of 8 (and more than 8) for a batch along its first dimension. So these vary for no input:
    - "tensor": a tensor read by a function (a get_attr node: LayerNorm2d's weight given to F.layer_norm, a
      layer_scale) whose values are equal along its first dimension (a fresh norm weight of ones);
    - "layer": the output of a layer whose weight is all zero (torchvision's ViT head starts so);
    - "input": an integer input that is the same number everywhere in the dummy.
    """
    found: dict[str, tuple[str, str]] = {}
    inputs = [n for n in graph.graph.nodes if n.op == "placeholder"]
    for node, value in zip(inputs, dummy if isinstance(dummy, tuple) else (dummy,)):
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.numel() > 1 \
                and value.min() == value.max():
            found[node.name] = ("input", f"{node.name!r} ({value.flatten()[0].item()} everywhere)")
    for node in graph.graph.nodes:
        if node.op == "get_attr":
            value = _attribute(graph, node.target)
            if isinstance(value, torch.Tensor) and value.dim() and value.size(0) > 1 and _as_batch(value) \
                    and _same_along_first(value).all():
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


def _attribute(graph: torch.fx.GraphModule, target: str) -> Any:
    owner, _, name = target.rpartition(".")
    try:
        return getattr(graph.get_submodule(owner), name)
    except AttributeError:
        return None


def _kept(mask: Any, dim: int) -> torch.Tensor | None:
    """Which channels along dim a mask keeps (some value of the channel not masked), as NNI's coarse masks do."""
    if not isinstance(mask, torch.Tensor) or mask.dim() == 0:
        return None
    dim = dim % mask.dim()
    return mask.sum(dim=[d for d in range(mask.dim()) if d != dim]) != 0 if mask.dim() > 1 else mask != 0


class Empty(NamedTuple):
    layer: str
    kind: str  # the module's class, with its groups when it has several
    lost: str  # what it would keep no channel of
    grouped: bool  # a group of a grouped convolution with channels on one side only


def empty_layers(graph: torch.fx.GraphModule, node_infos: Mapping) -> list[Empty]:
    """The layers ModelSpeedup would rebuild with no channel on a side, from the masks it inferred (NNI's
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
        if kind not in CHANNEL_DIM:
            continue
        dim = CHANNEL_DIM[kind]
        source = next((a for a in node.args if isinstance(a, torch.fx.Node)), None)
        kept_in = _kept(node_infos[source].output_masks, dim) if source is not None and kind != "Embedding" else None
        kept_out = _kept(node_infos[node].output_masks, dim)
        sides = [("input", kept_in)] + ([("output", kept_out)] if kind in SETS_OUTPUT else [])
        lost = [f"no {side} channel (0 of {len(kept)} kept)" for side, kept in sides
                if kept is not None and len(kept) and not kept.any()]
        groups = getattr(module, "groups", 1)
        kind += f", groups={groups}" if groups > 1 else ""
        if lost:
            found.append(Empty(node.target, kind, " and ".join(lost), False))
        elif groups > 1 and kept_in is not None and kept_out is not None:
            per_in, per_out = kept_in.view(groups, -1).sum(1), kept_out.view(groups, -1).sum(1)
            bad = [g for g in range(groups) if (per_in[g] > 0) != (per_out[g] > 0)]
            if bad:
                found.append(Empty(node.target, kind, f"group {bad[0]} keeping {int(per_in[bad[0]])} input and "
                                   f"{int(per_out[bad[0]])} output channels ({len(bad)} such group(s))", True))
    return found


def _masked(mask: Any) -> bool:
    return isinstance(mask, torch.Tensor) and mask.numel() > 0 and not mask.any()


def _some(items: list[str], quote: bool = True, shown: int = 4) -> str:
    text = ", ".join(repr(i) if quote else i for i in items[:shown])
    return text + (f" and {len(items) - shown} more" if len(items) > shown else "")


def empty_message(empty: list[Empty], causes: dict[str, tuple[str, str]], graph: torch.fx.GraphModule,
                  node_infos: Mapping) -> tuple[str, str]:
    """(what is wrong, what is allowed): which layer NNI would empty, and why: the values it takes for pruned
    because they vary for no input, a grouped convolution whose groups lose their channels apart, or masks that
    leave a layer nothing."""
    first = empty[0]
    text = f"pruning would leave layer {first.layer!r} ({first.kind}) with {first.lost}"
    if len(empty) > 1:
        text += f", and {len(empty) - 1} more layer(s) too: {_some([e.layer for e in empty[1:]])}"
    nodes = {n.name: n for n in graph.graph.nodes}
    hit = {node: cause for node, cause in causes.items()
           if node in nodes and _masked(node_infos[nodes[node]].output_masks)}
    if hit:
        kinds: dict[str, list[str]] = {}
        for kind, what in hit.values():
            kinds.setdefault(kind, []).append(what)
        text += (". NNI's ModelSpeedup takes for pruned every value that is the same for all the samples of its "
                 "random batch; these are: " + "; ".join(CAUSES[k].format(_some(v, quote=False))
                                                         for k, v in kinds.items()))
        output = next(n for n in graph.graph.nodes if n.op == "output")
        if all(_masked(m) for m in tree_leaves(node_infos[output].output_masks) if isinstance(m, torch.Tensor)):
            text += "; so the model's whole output counts as pruned, and NNI spreads that back to the layers that " \
                    "feed it"
        return text, TRAIN_FIRST
    if first.grouped:
        return (text + ": a grouped convolution keeps or loses each group's input and output channels together, "
                "but its inputs follow the layers before it and its outputs its own mask (or the layers after it)",
                f"grouped convolutions left out of config_list (exclude_op_names=[{first.layer!r}, ...]), so that "
                "their outputs follow their inputs")
    return (text + ": the masks of the layers around it leave it nothing",
            "fewer layers selected, or a lower sparse_ratio")


@functools.lru_cache(maxsize=None)
def speedup_class() -> type:
    """NNI's ModelSpeedup, checking the masks it inferred before it rebuilds anything: a layer it would empty is a
    ValueError naming the layer and why, and any failure to rebuild a layer names the layer. With dry_run it infers
    the masks (``.empty``) and rebuilds nothing."""
    from nni.compression.speedup import ModelSpeedup
    from nni.compression.speedup.replacement import replace_module
    from nni.compression.speedup.replacer import DefaultReplacer

    class Speedup(ModelSpeedup):
        dry_run = False

        def __init__(self, model, dummy_input, masks, **kwargs):
            super().__init__(model, dummy_input, masks, **kwargs)
            names = {id(m): n for n, m in model.named_modules()}

            def named(replace):
                def rebuild(module, masks):
                    try:
                        return replace(module, masks)
                    except Exception as error:
                        name = names.get(id(module), type(module).__name__)
                        raise ValueError(f"NNI cannot rebuild layer {name!r} ({module}) with the channels its masks "
                                         f"keep: {type(error).__name__}: {error}") from error
                return rebuild

            self.replacers = [DefaultReplacer({kind: named(fn) for kind, fn in replace_module.items()})]

        def replace_compressed_modules(self):
            self.empty = empty_layers(self.graph_module, self.node_infos)
            if self.dry_run:
                return
            if self.empty:
                causes = same_for_every_input(self.graph_module, self.dummy_input)
                message, allowed = empty_message(self.empty, causes, self.graph_module, self.node_infos)
                raise ValueError(f"{message} (allowed: {allowed})")
            super().replace_compressed_modules()

    return Speedup


@register
class Prune(Accelerator):
    """Structured pruning with NNI, then real surgery: smaller layers, fewer parameters, faster steps."""

    name = "prune"
    stage = Stage.SURGERY
    requires = ("nni",)
    provides = ("model.structure",)
    keeps = Keeps("changed", structure=False, note="the channels it removes and the shapes of the layers they fed; "
                  "weights trained by warm-up or Taylor steps; the optimizer's state (reset)")
    options = {
        "pruner": Option("l1", (str,), choices=tuple(PRUNERS), help="l1/l2 norm, fpgm, or taylor (trains to score)"),
        "config_list": Option(DEFAULT_CONFIG, (list,), help="NNI config dicts (op_types, op_names, sparse_ratio, ...)"),
        "warmup_steps": Option(0, (int,), check=at_least(0), help="train this many steps on the loader first"),
        "taylor_steps": Option(20, (int,), check=at_least(1), help="taylor: training steps that score the channels"),
        "dummy_input": Option(None, (torch.Tensor, tuple, type(None)), help="None: the first batch of the loader"),
        "loss_fn": Option(None, (type(None), object), check=lambda f: None if f is None or callable(f) else
                          "is not callable", allowed="None (cross entropy) or loss_fn(output, target)"),
    }

    def check(self, ctx):
        found = config_problems(self.config_list, ctx.model)
        problems = [Problem(self.name, message, field="config_list") for message in found]
        if self.dummy_input is None and ctx.loader is None:
            problems.append(Problem(self.name, "needs a dummy_input or a loader to take one from", field="dummy_input",
                                    kind="missing"))
        trains = [f for f, on in (("warmup_steps", self.warmup_steps > 0), ("pruner", self.pruner == "taylor")) if on]
        for field in trains:
            if ctx.loader is None or ctx.optimizer is None:
                problems.append(Problem(self.name, "needs the loader and the optimizer (it trains)", field=field,
                                        value=getattr(self, field), kind="missing"))
        batch = None
        if ctx.loader is not None and (self.dummy_input is None or trains):
            batch = first_batch(ctx.loader)
            problems += self._batch_problems(batch, trains)
        dummy = self.dummy_input if self.dummy_input is not None else model_input(batch)
        runs = self._run_problems(ctx, dummy) if dummy is not None else []
        problems += runs
        try:
            graph = fx_trace(ctx.model)
        except ValueError as error:
            problems.append(Problem(self.name, f"{error}; ModelSpeedup needs a torch.fx graph (the model was left "
                                    "as it was)", field="model", value=type(ctx.model).__name__))
            return problems
        if not found:
            structure = structure_problems(self.config_list, ctx.model, graph)
            problems += [Problem(self.name, message, field="config_list") for message in structure]
            if not (structure or runs or trains) and dummy is not None:
                problems += self._empty_problems(ctx, graph, dummy)
        return problems

    def _empty_problems(self, ctx, graph, dummy):
        """A layer NNI's mask inference would leave with no channel, named before anything is touched.

        Only when something in the model varies for no input (``same_for_every_input``, cheap): then the pruner
        and ModelSpeedup's mask inference run on a copy, rebuilding nothing. Not when warm-up or Taylor steps train
        the weights first (they may no longer be constant): apply() names such a layer then."""
        if not same_for_every_input(graph, dummy):
            return []
        import nni.compression.pruning as pruning

        model = copy.deepcopy(ctx.model)
        device = next(model.parameters(), torch.empty(0)).device
        try:
            with randomness.kept(None), nni_quiet():
                speedup = self._masks_inferred(pruning, model, move(dummy, device, False))
        except Exception:  # anything else NNI cannot do shows (and is named) while applying
            return []
        if not speedup.empty:
            return []
        causes = same_for_every_input(speedup.graph_module, speedup.dummy_input)
        message, allowed = empty_message(speedup.empty, causes, speedup.graph_module, speedup.node_infos)
        return [Problem(self.name, message, field="config_list", allowed=allowed)]

    def _masks_inferred(self, pruning, model, dummy):
        """The pruner's masks on this (copied) model, then ModelSpeedup's mask inference, with no rebuilding."""
        config_list, _ = keep_outputs(self._float_ratios(), model, fx_trace(model))
        pruner = getattr(pruning, PRUNERS[self.pruner])(model, config_list)
        _, masks = pruner.compress()
        pruner.unwrap_model()
        speedup = speedup_class()(model.eval(), dummy, masks, graph_module=fx_trace(model), logger=QUIET)
        speedup.dry_run = True
        speedup.speedup_model()
        return speedup

    def _float_ratios(self):
        return [{k: float(v) if k.endswith("sparse_ratio") else v for k, v in c.items()} for c in self.config_list]

    def _batch_problems(self, batch, trains):
        if batch is None:
            return [Problem(self.name, "the loader yields no batch", field="dummy_input" if not trains else trains[0])]
        problems = []
        if self.dummy_input is None and model_input(batch) is None:
            problems.append(Problem(self.name, f"the loader's batches are {describe_batch(batch)}, not a tensor or an "
                                    "(inputs, ...) tuple: pass the model's input as dummy_input=...",
                                    field="dummy_input"))
        for field in trains if not trainable_batch(batch) else ():
            problems.append(Problem(self.name, f"trains with loss_fn(model(batch[0]), batch[1]), but the loader's "
                                    f"batches are {describe_batch(batch)}: use a loader of (inputs, targets) batches, or "
                                    "no warm-up and a pruner that does not train (l1, l2, fpgm)", field=field,
                                    value=getattr(self, field)))
        return problems

    def _run_problems(self, ctx, dummy):
        """NNI runs the model on the dummy input: a model that needs more than the batch's first item (a mask
        beside the image) fails there with an error about NNI's internals; here it names the input."""
        model = copy.deepcopy(ctx.model).eval()
        device = next(model.parameters(), torch.empty(0)).device
        try:
            with randomness.kept(None):
                output_shapes(model, move(dummy, device, False))
        except Exception as error:
            what = "the dummy_input" if self.dummy_input is not None else "the first item of the loader's batches"
            return [Problem(self.name, f"the model cannot run on {what} ({type(error).__name__}: {error}): pass "
                            "its inputs as dummy_input=... (a tuple for several)", field="dummy_input")]
        return []

    def apply(self, ctx):
        import nni.compression.pruning as pruning

        user_model = ctx.model
        model, optimizer = copy_with_optimizer(user_model, ctx.optimizer)  # swapped in only when all worked
        loss_fn = self.loss_fn or nn.functional.cross_entropy

        def loss_of(batch, model):  # NNI's training_step signature
            return loss_fn(model(batch[0]), batch[1])

        changes: dict[str, Any] = {"pruner": PRUNERS[self.pruner], "parameters_before": count(user_model)}
        modes = {name: module.training for name, module in model.named_modules()}  # a frozen BatchNorm's eval
        with randomness.kept(ctx.loader), foreign_kept(optimizer, model), nni_quiet():
            if self.warmup_steps:
                self._train(model, optimizer, ctx, loss_of, self.warmup_steps)
                changes["warmup_steps"] = self.warmup_steps
            dummy = self.dummy_input if self.dummy_input is not None else model_input(first_batch(ctx.loader))
            dummy = move(dummy, ctx.device, False)
            config_list, kept = keep_outputs(self._float_ratios(), model, fx_trace(model))
            cls = getattr(pruning, PRUNERS[self.pruner])
            if self.pruner == "taylor":
                pruner = cls(model, config_list, self._evaluator(ctx, model, optimizer, loss_of), self.taylor_steps)
            else:
                pruner = cls(model, config_list)
            _, masks = pruner.compress()
            pruner.unwrap_model()
            surgery(model, dummy, masks, speedup_class())
        for name, module in model.named_modules():  # NNI's new modules, and training steps, set one mode for all
            module.training = modes.get(name, modes[""])
        ctx.model = model.to(ctx.device)
        changes["parameters_after"] = count(model)
        changes["parameters_ratio"] = round(changes["parameters_after"] / changes["parameters_before"], 4)
        changes["layers_changed"] = shape_changes(user_model, model)
        if kept:
            changes["output_layers_kept"] = kept
        if ctx.optimizer is not None:
            ctx.optimizer = rebuild_optimizer(ctx.optimizer, params=same_params(ctx.optimizer, user_model, model),
                                              keep_state=False)
            changes["optimizer"] = f"rebuilt on the new parameters: {describe_optimizer(ctx.optimizer)}; state reset"
        return changes

    def _batches(self, ctx):
        while True:
            for batch in ctx.loader:
                yield move(batch, ctx.device, False)

    def _train(self, model, optimizer, ctx, loss_of, steps):
        model.train()
        for _, batch in zip(range(steps), self._batches(ctx)):
            optimizer.zero_grad(set_to_none=True)
            loss_of(batch, model).backward()
            optimizer.step()

    def _evaluator(self, ctx, model, optimizer, loss_of):
        """NNI's TorchEvaluator over the user's loader: Taylor scores channels from gradients of real steps."""
        import nni
        from nni.compression import TorchEvaluator

        def training_func(model, optimizers, training_step, lr_schedulers=None, max_steps=None, max_epochs=None):
            self._train(model, optimizers, ctx, training_step, max_steps or self.taylor_steps)

        traced = nni.trace(type(optimizer))(model.parameters(), **init_kwargs(optimizer))
        return TorchEvaluator(training_func, traced, loss_of)
