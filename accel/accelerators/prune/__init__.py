"""prune: structured pruning with NNI 3.0, made real: NNI's masks become a smaller model (ModelSpeedup).

What it does: on a deep copy, an NNI pruner chooses whole channels of the layers the config list selects and
ModelSpeedup rebuilds them without; the optimizer is rebuilt, its state reset; what NNI would break is refused by
name first. When it helps: a model wider than its task; it costs accuracy at a high ratio, and setup time.

What it keeps: everything but its declared change (the channels removed): names, frozen flags, ties, the output's
shape, BatchNorm statistics, random states. Its card: docs/accelerators/prune.md.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import accel.accelerators.prune.selection as selection
from accel import randomness
from accel.accelerators.prune.diagnosis import empty_message, same_for_every_input
from accel.accelerators.prune.speedup import count, nni_quiet, output_shapes, shape_changes, speed_up, surgery
from accel.batches import describe_batch, move
from accel.errors import Problem
from accel.optim import copy_with_optimizer, describe_optimizer, init_kwargs, rebuild_optimizer, same_params
from accel.plan.contract import Accelerator, Capability, Keeps, Stage, State, register
from accel.plan.options import Options, at_least, option
from accel.randomness import first_batch

__all__ = ["Prune", "PruneOptions"]


def model_input(batch: Any) -> torch.Tensor | None:
    """The model's input in a batch: the batch itself when it is a tensor, or the first item of an (inputs, ...)
    tuple or list; None for anything else (a dict of a tokenizer, say), which needs a dummy_input."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    return None


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


@dataclass(frozen=True, kw_only=True)
class PruneOptions(Options):
    pruner: str = option("l1", (str,), choices=tuple(selection.PRUNERS),
                         help="l1/l2 norm, fpgm, or taylor (trains to score)")
    config_list: list = option(selection.DEFAULT_CONFIG, (list,),
                               help="NNI config dicts (op_types, op_names, sparse_ratio, ...)")
    warmup_steps: int = option(0, (int,), check=at_least(0), help="train this many steps on the loader first")
    taylor_steps: int = option(20, (int,), check=at_least(1), help="taylor: training steps that score the channels")
    dummy_input: torch.Tensor | tuple | None = option(None, (torch.Tensor, tuple, type(None)),
                                                      help="None: the first batch of the loader")
    loss_fn: Callable | None = option(None, (type(None), object), check=lambda f: None if f is None or callable(f)
                                      else "is not callable", allowed="None (cross entropy) or loss_fn(output, target)")


@register
class Prune(Accelerator[PruneOptions, State]):
    name = "prune"
    stage = Stage.SURGERY
    requires = ("nni",)
    provides = (Capability.MODEL_STRUCTURE, Capability.MODEL_COPY)
    keeps = Keeps("changed", structure=False, note="the channels it removes and the shapes of the layers they fed; "
                  "weights trained by warm-up or Taylor steps; the optimizer's state (reset)")

    def check(self, ctx):
        config = self.config
        found = selection.config_problems(config.config_list, ctx.model)
        problems = [Problem(self.name, message, field="config_list") for message in found]
        if config.dummy_input is None and ctx.loader is None:
            problems.append(Problem(self.name, "needs a dummy_input or a loader to take one from", field="dummy_input",
                                    kind="missing"))
        trains = [f for f, on in (("warmup_steps", config.warmup_steps > 0), ("pruner", config.pruner == "taylor"))
                  if on]
        if ctx.loader is None or ctx.optimizer is None:
            problems += [Problem(self.name, "needs the loader and the optimizer (it trains)", field=field,
                                 value=getattr(config, field), kind="missing") for field in trains]
        batch = None
        if ctx.loader is not None and (config.dummy_input is None or trains):
            batch = first_batch(ctx.loader)
            problems += self._batch_problems(batch, trains)
        dummy = config.dummy_input if config.dummy_input is not None else model_input(batch)
        runs = self._run_problems(ctx, dummy) if dummy is not None else []
        problems += runs
        try:
            graph = selection.fx_trace(ctx.model)
        except ValueError as error:
            problems.append(Problem(self.name, f"{error}; ModelSpeedup needs a torch.fx graph (the model was left "
                                    "as it was)", field="model", value=type(ctx.model).__name__))
            return problems
        if not found:
            structure = selection.structure_problems(config.config_list, ctx.model, graph)
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
        model = copy.deepcopy(ctx.model)
        device = next(model.parameters(), torch.empty(0)).device
        try:
            with randomness.kept(None), nni_quiet():
                masks, _ = self._masks(model)
                speedup = speed_up(model.eval(), move(dummy, device, False), masks, dry_run=True)
        except Exception:  # anything else NNI cannot do shows (and is named) while applying
            return []
        if not speedup.empty:
            return []
        message, allowed = empty_message(speedup)
        return [Problem(self.name, message, field="config_list", allowed=allowed)]

    def _masks(self, model, *evaluator):
        """The pruner's masks on the model (its layers producing the output kept, and named), the pruner unwrapped;
        ``evaluator``: Taylor's evaluator and its steps."""
        import nni.compression.pruning as pruning

        ratios = [{k: float(v) if k.endswith("sparse_ratio") else v for k, v in c.items()}
                  for c in self.config.config_list]
        config_list, kept = selection.keep_outputs(ratios, model, selection.fx_trace(model))
        pruner = getattr(pruning, selection.PRUNERS[self.config.pruner])(model, config_list, *evaluator)
        _, masks = pruner.compress()
        pruner.unwrap_model()
        return masks, kept

    def _batch_problems(self, batch, trains):
        if batch is None:
            return [Problem(self.name, "the loader yields no batch", field="dummy_input" if not trains else trains[0])]
        problems = [Problem(self.name, f"the loader's batches are {describe_batch(batch)}, not a tensor or an "
                            "(inputs, ...) tuple: pass the model's input as dummy_input=...", field="dummy_input")
                    ] if self.config.dummy_input is None and model_input(batch) is None else []
        trainable = isinstance(batch, (list, tuple)) and len(batch) >= 2 and isinstance(batch[0], torch.Tensor)
        return problems + [  # warm-up and Taylor steps: loss_fn(model(batch[0]), batch[1])
            Problem(self.name, f"trains with loss_fn(model(batch[0]), batch[1]), but the loader's batches are "
                    f"{describe_batch(batch)}: use a loader of (inputs, targets) batches, or no warm-up and a pruner "
                    "that does not train (l1, l2, fpgm)", field=field, value=getattr(self.config, field))
            for field in (trains if not trainable else ())]

    def _run_problems(self, ctx, dummy):
        """NNI runs the model on the dummy input: a model that needs more than the batch's first item (a mask
        beside the image) fails there with an error about NNI's internals; here it names the input."""
        try:
            model = copy.deepcopy(ctx.model).eval()
        except Exception as error:  # torch.nn.utils.weight_norm's weight, say: a tensor computed in forward
            return [Problem(self.name, f"prune rebuilds a copy of the model, and copy.deepcopy cannot copy it "
                            f"({type(error).__name__}: {str(error).splitlines()[0]})", field="model",
                            value=type(ctx.model).__name__)]
        device = next(model.parameters(), torch.empty(0)).device
        try:
            with randomness.kept(None):
                output_shapes(model, move(dummy, device, False))
        except Exception as error:
            what = ("the dummy_input" if self.config.dummy_input is not None
                    else "the first item of the loader's batches")
            return [Problem(self.name, f"the model cannot run on {what} ({type(error).__name__}: {error}): pass "
                            "its inputs as dummy_input=... (a tuple for several)", field="dummy_input")]
        return []

    def apply(self, ctx):
        config = self.config
        user_model = ctx.model
        model, optimizer = copy_with_optimizer(user_model, ctx.optimizer)  # swapped in only when all worked
        loss_fn = config.loss_fn or nn.functional.cross_entropy

        def loss_of(batch, model):  # NNI's training_step signature
            return loss_fn(model(batch[0]), batch[1])

        changes: dict[str, Any] = {"pruner": selection.PRUNERS[config.pruner], "parameters_before": count(user_model)}
        modes = {name: module.training for name, module in model.named_modules()}  # a frozen BatchNorm's eval
        with randomness.kept(ctx.loader), foreign_kept(optimizer, model), nni_quiet():
            if config.warmup_steps:
                self._train(model, optimizer, ctx, loss_of, config.warmup_steps)
                changes["warmup_steps"] = config.warmup_steps
            dummy = config.dummy_input if config.dummy_input is not None else model_input(first_batch(ctx.loader))
            dummy = move(dummy, ctx.device, False)
            taylor = (self._evaluator(ctx, model, optimizer, loss_of), config.taylor_steps) \
                if config.pruner == "taylor" else ()
            masks, kept = self._masks(model, *taylor)
            surgery(model, dummy, masks)
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

    def _train(self, model, optimizer, ctx, loss_of, steps):
        model.train()
        batches = (batch for _ in itertools.count() for batch in ctx.loader)  # the loader's epochs, one after another
        for _, batch in zip(range(steps), batches):
            optimizer.zero_grad(set_to_none=True)
            loss_of(move(batch, ctx.device, False), model).backward()
            optimizer.step()

    def _evaluator(self, ctx, model, optimizer, loss_of):
        """NNI's TorchEvaluator over the user's loader: Taylor scores channels from gradients of real steps."""
        import nni
        from nni.compression import TorchEvaluator

        def training_func(model, optimizers, training_step, lr_schedulers=None, max_steps=None, max_epochs=None):
            self._train(model, optimizers, ctx, training_step, max_steps or self.config.taylor_steps)

        traced = nni.trace(type(optimizer))(model.parameters(), **init_kwargs(optimizer))
        return TorchEvaluator(training_func, traced, loss_of)
