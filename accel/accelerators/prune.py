"""prune: NNI pruning made real, masks turned into a smaller model (ModelSpeedup), optimizer rebuilt on it.

The work happens on a deep copy, swapped in only on success, so the user's model is never left half-pruned.
NNI's own tracer fails on torch >= 2.2 (microsoft/nni#5768), so ModelSpeedup gets a torch.fx graph; a model
fx cannot trace is refused at plan time with the module that failed. The book's CNN at 50% conv sparsity (L1)
goes from 2,122,186 to 1,059,306 parameters (docs/accelerators/prune.md).
"""
from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel.accelerator import Accelerator, Keeps, Option, Stage, at_least, register
from accel.errors import Problem
from accel.optim import copy_with_optimizer, describe_optimizer, init_kwargs, rebuild_optimizer, same_params
from accel.run import move

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


def inputs_of(batch: Any) -> Any:
    """The model input of a (inputs, targets) batch, or the batch itself when it is a tensor."""
    return batch[0] if isinstance(batch, (list, tuple)) else batch


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


@register
class Prune(Accelerator):
    """Structured pruning with NNI, then real surgery: smaller layers, fewer parameters, faster steps."""

    name = "prune"
    stage = Stage.SURGERY
    requires = ("nni",)
    provides = ("model.structure",)
    keeps = Keeps("changed", structure=False, note="the channels it removes (a smaller model, its optimizer state reset)")
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
        for field, trains in (("warmup_steps", self.warmup_steps > 0), ("pruner", self.pruner == "taylor")):
            if trains and (ctx.loader is None or ctx.optimizer is None):
                problems.append(Problem(self.name, "needs the loader and the optimizer (it trains)", field=field,
                                        value=getattr(self, field), kind="missing"))
        try:
            fx_trace(ctx.model)
        except ValueError as error:
            problems.append(Problem(self.name, f"{error}; ModelSpeedup needs a torch.fx graph (the model was left "
                                    "as it was)", field="model", value=type(ctx.model).__name__))
        return problems

    def apply(self, ctx):
        import nni.compression.pruning as pruning
        from nni.compression.speedup import ModelSpeedup

        user_model = ctx.model
        model, optimizer = copy_with_optimizer(user_model, ctx.optimizer)  # swapped in only when all worked
        loss_fn = self.loss_fn or nn.functional.cross_entropy

        def loss_of(batch, model):  # NNI's training_step signature
            return loss_fn(model(batch[0]), batch[1])

        changes: dict[str, Any] = {"pruner": PRUNERS[self.pruner], "parameters_before": count(user_model)}
        if self.warmup_steps:
            self._train(model, optimizer, ctx, loss_of, self.warmup_steps)
            changes["warmup_steps"] = self.warmup_steps
        dummy = self.dummy_input if self.dummy_input is not None else inputs_of(next(iter(ctx.loader)))
        dummy = move(dummy, ctx.device, False)
        config_list = [{k: float(v) if k.endswith("sparse_ratio") else v for k, v in c.items()}
                       for c in self.config_list]
        nni_logger = logging.getLogger("nni")
        level = nni_logger.level
        nni_logger.setLevel(logging.WARNING)  # NNI logs every replaced module at INFO
        try:
            cls = getattr(pruning, PRUNERS[self.pruner])
            if self.pruner == "taylor":
                pruner = cls(model, config_list, self._evaluator(ctx, model, optimizer, loss_of), self.taylor_steps)
            else:
                pruner = cls(model, config_list)
            _, masks = pruner.compress()
            pruner.unwrap_model()
            was_training = model.training
            ModelSpeedup(model, dummy, masks, graph_module=fx_trace(model), logger=QUIET).speedup_model()
            model.train(was_training)
        finally:
            nni_logger.setLevel(level)
        ctx.model = model.to(ctx.device)
        changes["parameters_after"] = count(model)
        changes["parameters_ratio"] = round(changes["parameters_after"] / changes["parameters_before"], 4)
        changes["layers_changed"] = shape_changes(user_model, model)
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
