"""prune: structured pruning with NNI 3.0, made real: NNI's masks become a smaller model (ModelSpeedup).

What it does: on a deep copy of the model, swapped in only when everything worked, optional warm-up or Taylor
steps train the copy on the loader, an NNI pruner (L1, L2, FPGM, Taylor) chooses whole channels of the layers
the config list selects, and ModelSpeedup rebuilds the layers without them: fewer parameters and FLOPs, not
zeros. The optimizer is rebuilt on the new parameters (same class and hyperparameters, state reset). NNI's own
tracer fails on torch >= 2.2 (microsoft/nni#5768), so ModelSpeedup gets a torch.fx graph; a model fx cannot
trace is refused at plan time, naming the module that failed.

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
import logging
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel.accelerator import Accelerator, Keeps, Option, Stage, at_least, register
from accel.errors import Problem
from accel.optim import copy_with_optimizer, describe_optimizer, init_kwargs, rebuild_optimizer, same_params
from accel import randomness
from accel.randomness import first_batch
from accel.modules import tied_groups
from accel.run import describe_batch, map_tensors, move

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
        if dummy is not None:
            problems += self._run_problems(ctx, dummy)
        try:
            graph = fx_trace(ctx.model)
        except ValueError as error:
            problems.append(Problem(self.name, f"{error}; ModelSpeedup needs a torch.fx graph (the model was left "
                                    "as it was)", field="model", value=type(ctx.model).__name__))
            return problems
        if not found:
            problems += [Problem(self.name, message, field="config_list")
                         for message in structure_problems(self.config_list, ctx.model, graph)]
        return problems

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
        from nni.compression.speedup import ModelSpeedup

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
            config_list = [{k: float(v) if k.endswith("sparse_ratio") else v for k, v in c.items()}
                           for c in self.config_list]
            config_list, kept = keep_outputs(config_list, model, fx_trace(model))
            cls = getattr(pruning, PRUNERS[self.pruner])
            if self.pruner == "taylor":
                pruner = cls(model, config_list, self._evaluator(ctx, model, optimizer, loss_of), self.taylor_steps)
            else:
                pruner = cls(model, config_list)
            _, masks = pruner.compress()
            pruner.unwrap_model()
            surgery(model, dummy, masks, ModelSpeedup)
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
