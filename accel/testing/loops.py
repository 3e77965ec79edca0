"""The loop side of ordinary user code: what a training loop does with the objects it holds, around its steps.

Real loops do more than step: a scheduler built before or after ``accelerate()``, learning rates written into
``param_groups``, unfreezing, their own checkpoints, validation passes, a frozen BatchNorm, hooks, an EMA, and
``accelerate()`` once per epoch. Each ``Loop`` here is one of those behaviours, a zoo entry that
``check_equivalence`` runs in the plain loop and in the accelerated one, with the objects the user holds: their
own model, optimizer and loader (``Held``), or, where the report names one stale, what it says to use instead.

    result = check_equivalence(["fused_optimizer"], Case(loop="onecycle").build)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import nn
from torch.optim import lr_scheduler
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import accel
import accel.accelerator


@dataclass
class Held:
    """The objects the user's loop holds after accelerate(), and the user's own evaluation of a model."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    evaluate: Callable[[nn.Module], torch.Tensor]


class Loop:
    """A plain loop: nothing but the steps. Subclasses do what real loops do, at the same points every time.

    ``wrap`` is what the user's code does to its model and loader before anything else (compile them, stream the
    data), ``prepare`` runs before accelerate() (on the user's objects), ``start`` after it, ``before``/``after``
    around each step, whose body is ``step``; ``before`` may return a new run (accelerate() again). ``observed`` is
    what the loop built that the harness compares as well as the weights (an EMA's weights, validation outputs);
    ``finish`` runs once the run is closed.
    """

    name: ClassVar[str] = "plain"
    holds_from_before: ClassVar[bool] = False  # it keeps an object built before accelerate() (a scheduler)

    def wrap(self, model: nn.Module, loader: Any) -> tuple[nn.Module, Any]:
        return model, loader

    def prepare(self, held: Held) -> None:
        pass

    def step(self, index: int, run: accel.Run, held: Held, batch: Any,
             loss_of: Callable[[accel.Run, Any], torch.Tensor]) -> torch.Tensor:
        """One batch, as the README loop writes it."""
        with run.autocast():
            loss = loss_of(run, batch)
        run.backward(loss)
        run.step()
        return loss.detach()

    def finish(self) -> None:
        pass

    def start(self, held: Held, run: accel.Run) -> None:
        pass

    def before(self, step: int, held: Held, run: accel.Run) -> accel.Run:
        return run

    def after(self, step: int, held: Held, run: accel.Run, loss: float) -> None:
        pass

    def observed(self) -> dict[str, torch.Tensor]:
        return {}


class Scheduler(Loop):
    """A learning-rate scheduler stepped after every batch, as the PyTorch docs show."""

    def after(self, step, held, run, loss):
        self.scheduler.step()


class OneCycle(Scheduler):
    name, holds_from_before = "onecycle", True

    def prepare(self, held):  # built before accelerate(), on the user's optimizer
        groups = held.optimizer.param_groups
        self.scheduler = lr_scheduler.OneCycleLR(  # it cycles momentum where the optimizer has one (not Adagrad)
            held.optimizer, max_lr=[2 * g["lr"] for g in groups], total_steps=100,
            cycle_momentum=all("betas" in g or g.get("momentum") for g in groups))


class LambdaDecay(Scheduler):
    name, holds_from_before = "lambda", True

    def prepare(self, held):
        self.scheduler = lr_scheduler.LambdaLR(held.optimizer, lambda step: 1.0 / (1 + step))


class Plateau(Loop):
    name, holds_from_before = "plateau", True

    def prepare(self, held):
        self.scheduler = lr_scheduler.ReduceLROnPlateau(held.optimizer, factor=0.5, patience=0, threshold=10.0)

    def after(self, step, held, run, loss):
        self.scheduler.step(loss)


class Warmup(Scheduler):
    """Built after accelerate(), on run.optimizer: warm-up, then exponential decay."""

    name = "warmup"

    def start(self, held, run):
        optimizer = run.optimizer
        self.scheduler = lr_scheduler.SequentialLR(optimizer, [lr_scheduler.LinearLR(optimizer, 0.25, total_iters=2),
                                                               lr_scheduler.ExponentialLR(optimizer, 0.7)], milestones=[2])


class LrWrites(Loop):
    """nanoGPT's loop: it writes the learning rate (and other hyper-parameters) into param_groups every step."""

    name = "lr_writes"

    def start(self, held, run):
        self.base = [group["lr"] for group in held.optimizer.param_groups]

    def before(self, step, held, run):
        for base, group in zip(self.base, held.optimizer.param_groups):
            group["lr"] = base * max(0.1, 1 - 0.15 * step)  # a decay to a floor, as nanoGPT's cosine to min_lr
            # (without the floor, the rate turned negative at step 7 and a 24-step run diverged)
            if "weight_decay" in group:
                group["weight_decay"] = 0.001 * step
            if group.get("momentum"):
                group["momentum"] = 0.8
            if "betas" in group:
                group["betas"] = (0.8, 0.99)
        return run


def layer(model: nn.Module) -> list[nn.Parameter]:
    """The parameters a progressive-unfreezing loop releases late: the second convolution's."""
    return list(model.conv2.parameters())


class Unfreeze(Loop):
    """Progressive unfreezing: a layer frozen before accelerate(), unfrozen with requires_grad_() at step 1."""

    name = "unfreeze"

    def prepare(self, held):
        held.model.conv2.requires_grad_(False)

    def before(self, step, held, run):
        if step == 1:
            held.model.conv2.requires_grad_(True)
        return run


class AddGroup(Loop):
    """Unfreezing with a new param group: the layer is not in the optimizer until step 1."""

    name = "add_group"

    def prepare(self, held):
        late = {id(p) for p in layer(held.model)}
        for group in held.optimizer.param_groups:  # as if the optimizer had been built without the layer
            group["params"] = [p for p in group["params"] if id(p) not in late]
        for param in layer(held.model):
            held.optimizer.state.pop(param, None)  # Adagrad makes its state in __init__
        held.model.conv2.requires_grad_(False)

    def before(self, step, held, run):
        if step == 1:
            self.unfreeze(held)
            held.optimizer.add_param_group({"params": self.late_params(held)})  # the optimizer's defaults
            if isinstance(held.optimizer, torch.optim.Adagrad):  # torch 2.8's Adagrad makes its state only in
                group = held.optimizer.param_groups[-1]  # __init__ (KeyError 'sum' otherwise): as __init__ does
                for param in group["params"]:
                    held.optimizer.state.setdefault(param, {
                        "step": torch.tensor(0.0), "sum": torch.full_like(param, group["initial_accumulator_value"],
                                                                          memory_format=torch.preserve_format)})
        return run


    def unfreeze(self, held: Held) -> None:
        held.model.conv2.requires_grad_(True)

    def late_params(self, held: Held) -> list[nn.Parameter]:
        return layer(held.model)


class LateGroup(AddGroup):
    """AddGroup over the Parameter objects the script took before accelerate() (``backbone =
    list(model.backbone.parameters())``), unfrozen there: under fsdp, the tensors it replaced by their shards."""

    name, holds_from_before = "late_group", True

    def prepare(self, held):
        super().prepare(held)
        self.late = layer(held.model)

    def unfreeze(self, held):
        for param in self.late:
            param.requires_grad_(True)

    def late_params(self, held):
        return self.late


class OwnCheckpoint(Loop):
    """The user's own checkpoint code: state_dict() of model and optimizer at step 1, loaded back at step 2."""

    name = "own_checkpoint"

    def before(self, step, held, run):
        if step == 1:
            self.saved = copy.deepcopy({"model": held.model.state_dict(), "optimizer": held.optimizer.state_dict()})
        if step == 2:
            held.model.load_state_dict(self.saved["model"])
            held.optimizer.load_state_dict(self.saved["optimizer"])
        return run


class Validation(Loop):
    """A validation pass before steps 1 and 2: model.eval(), no_grad, model.train(); through the user's model,
    then through run.model."""

    name = "validation"

    def start(self, held, run):
        self.outputs = {}

    def before(self, step, held, run):
        if step in (1, 2):
            model = held.model if step == 1 else run.model
            model.eval()
            with torch.no_grad():
                self.outputs[f"validation {step}"] = held.evaluate(model).float()
            model.train()
        return run

    def observed(self):
        return self.outputs


class FrozenNorm(Loop):
    """A detector's habit: the backbone's BatchNorm kept in eval mode (a submodule's eval()) while training."""

    name = "frozen_norm"

    def start(self, held, run):
        held.model.norm.eval()


class Hooks(Loop):
    """A forward hook and a gradient hook registered after accelerate(), on the user's modules and parameters."""

    name = "hooks"

    def start(self, held, run):
        held.model.fc.register_forward_hook(lambda module, args, output: output * 0.5)
        weight = held.model.conv2.weight
        if weight.requires_grad:
            weight.register_hook(lambda grad: grad * 0.25)


class Ema(Loop):
    """An exponential moving average of the user's model, updated after every step, then evaluated."""

    name = "ema"

    def average(self, model: nn.Module) -> AveragedModel:
        return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.8))

    def start(self, held, run):
        self.held = held
        self.model = self.average(held.model)

    def after(self, step, held, run, loss):
        self.model.update_parameters(held.model)

    def observed(self):
        self.model.eval()
        with torch.no_grad():
            output = self.held.evaluate(self.model).float()
        return {**{f"average {k}": v.detach().float() for k, v in self.model.module.state_dict().items()},
                "average's output": output}


class Swa(Ema):
    """Stochastic weight averaging (the mean of the weights seen), buffers averaged too."""

    name = "swa"

    def average(self, model):
        return AveragedModel(model, use_buffers=True)


class Again(Loop):
    """accelerate() once per epoch: the same objects accelerated again at step 2; the optimizer's state and the
    run's counters go on."""

    name = "again"

    def __init__(self):
        self.done, self.stepped, self.boundary = False, 0, False

    def after(self, step, held, run, loss):
        self.boundary, self.stepped = run.optimizer_steps > self.stepped, run.optimizer_steps

    def before(self, step, held, run):
        # at an epoch's end that is also an optimizer step's, as accel asks under fsdp (a new run cannot take over
        # gradients FSDP holds unreduced in the middle of accumulating); without accumulation: at step 2
        if step >= 2 and not self.done and self.boundary:
            self.done = True
            return accel.accelerate(held.model, held.optimizer, held.loader, plan=run.plan, device=run.device)
        return run


class HalfMigrated(Loop):
    """The first thing people do when they migrate: run.loader, run.model and run.autocast(), but their own
    loss.backward(), optimizer.step() and zero_grad(). accel notices it (accel/watch.py): what relies on
    run.backward()/run.step() stands aside, named in the report, and the loop trains as it did without accel."""

    name = "half_migrated"

    def step(self, index, run, held, batch, loss_of):
        with run.autocast():
            loss = loss_of(run, batch)
        loss.backward()
        held.optimizer.step()
        held.optimizer.zero_grad()
        return loss.detach()


class OwnAccumulation(Loop):
    """transformers' run_glue_no_trainer: the loss divided by N and backward every batch, the optimizer stepped
    every N batches, by the loop itself. With grad_accumulation in the plan as well, accel notices the second batch
    drawn before run.step() and grad_accumulation stands aside: the loop's own accumulation trains."""

    name = "own_accumulation"
    every = 2

    def step(self, index, run, held, batch, loss_of):
        with run.autocast():
            loss = loss_of(run, batch)
        run.backward(loss / self.every)
        if (index + 1) % self.every == 0:
            run.step()
        return loss.detach()


class TwoModels(Loop):
    """A second model trained beside the first on the same batches (a GAN's critic, a student beside its
    teacher), with its own optimizer and its own accelerate() with the same plan (what needs a loader aside), closed
    after the first: the runs compose, and the process is as it was once both are closed."""

    name = "two_models"

    def prepare(self, held):
        self.model = copy.deepcopy(held.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.run = None

    def start(self, held, run):
        plan = [{name: options} for name, options in run.plan.to_dict().items()
                if "loader" not in accel.accelerator.REGISTRY[name].needs]
        try:
            self.run = accel.accelerate(self.model, self.optimizer, None, plan=plan, device=run.device)
        except accel.PlanError as error:  # what needs data without needing the loader (prune's dummy input)
            refused = {problem.accelerator for problem in error.problems}
            plan = [entry for entry in plan if next(iter(entry)) not in refused]
            self.run = accel.accelerate(self.model, self.optimizer, None, plan=plan, device=run.device)

    def step(self, index, run, held, batch, loss_of):
        loss = super().step(index, run, held, batch, loss_of)
        super().step(index, self.run, held, batch, loss_of)
        return loss

    def observed(self):
        return {f"second model's {k}": v for k, v in self.run.unwrap().state_dict().items()}

    def finish(self):
        if self.run is not None:
            self.run.close()


class SelfSharding(IterableDataset):
    """A map-style dataset streamed and split between the DataLoader's workers, as torch documents it."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __iter__(self):
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for index in range(start, len(self.dataset), step):
            yield self.dataset[index]


class Stream(Loop):
    """The user's own DataLoader of two workers over a stream that shards itself between them: which samples share
    a batch depends on the number of workers, so the run keeps the user's."""

    name = "stream"

    def wrap(self, model, loader):
        if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
            return model, loader  # already a stream, or batched by the dataset: as it is
        return model, DataLoader(SelfSharding(loader.dataset), batch_size=loader.batch_size,
                                 collate_fn=loader.collate_fn, num_workers=2)


class Precompiled(Loop):
    """``model = torch.compile(model)`` before accelerate(), as many scripts do (dynamo's eager backend: the
    wrapper, not the kernels, is what accel must see through). run.unwrap() is the module inside it."""

    name = "precompiled"

    def wrap(self, model, loader):
        import torch._dynamo  # what torch.compile imports anyway; not at import of accel.testing (1 s)

        torch._dynamo.reset()  # every case compiles a new instance of the same classes: a fresh cache each time
        return torch.compile(model, backend="eager"), loader


LOOPS: dict[str, type[Loop]] = {loop.name: loop for loop in (
    Loop, OneCycle, LambdaDecay, Plateau, Warmup, LrWrites, Unfreeze, AddGroup, LateGroup, OwnCheckpoint, Validation,
    FrozenNorm, Hooks, Ema, Swa, Again, HalfMigrated, OwnAccumulation, TwoModels, Stream, Precompiled)}
