"""prune's surgery: NNI's ModelSpeedup failing by name, then ties, frozen flags and BatchNorm statistics put back."""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from accel.accelerators.prune.diagnosis import empty_layers, empty_message
from accel.accelerators.prune.selection import fx_trace
from accel.batches import map_tensors
from accel.modules import buffer_values, put_back_buffers, tied_groups

QUIET = logging.getLogger("accel.prune.nni")  # ModelSpeedup logs every node at INFO by default
QUIET.setLevel(logging.WARNING)


def shape_changes(before: nn.Module, after: nn.Module) -> dict[str, str]:
    """{layer: 'weight (32, 3, 3, 3) -> (16, 3, 3, 3)'} for every layer whose weight shape changed."""
    old = {n: tuple(p.shape) for n, p in before.named_parameters()}
    return {name.rpartition(".")[0] or name: f"weight {old.get(name)} -> {tuple(param.shape)}"
            for name, param in after.named_parameters()
            if name.rpartition(".")[2] == "weight" and old.get(name) != tuple(param.shape)}


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


_quieting = threading.Lock()  # nni_quiet's: how many blocks are inside now (threads pruning at once), NNI's logger
_inside, _saved = 0, (logging.NOTSET, [], True)  # before the first


@contextlib.contextmanager
def nni_quiet():
    """NNI's log inside the block goes to accel's (QUIET): its warnings about its own mask bookkeeping at debug level,
    its errors as errors, never to the user's stdout, where NNI's own handler writes. NNI is imported first, since
    its import sets that logger up (a first import inside the block would undo this). The first block in saves NNI's
    logger and the last out restores it: two threads pruning at once leave it as it was, each quiet throughout."""
    import nni  # noqa: F401

    global _inside, _saved
    logger = logging.getLogger("nni")
    with _quieting:
        if not _inside:
            _saved = logger.level, logger.handlers, logger.propagate
            logger.setLevel(logging.WARNING)  # NNI logs every replaced module at INFO
            logger.handlers, logger.propagate = [_ToAccel()], False
        _inside += 1
    try:
        yield
    finally:
        with _quieting:
            _inside -= 1
            if not _inside:
                level, handlers, propagate = _saved
                logger.setLevel(level)
                logger.handlers, logger.propagate = handlers, propagate


class _ToAccel(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:  # a record that cannot be formatted is the handler's to report (handleError), never NNI's call to raise
            level = record.levelno if record.levelno >= logging.ERROR else logging.DEBUG
            QUIET.log(level, "NNI: %s", record.getMessage(), exc_info=record.exc_info)
        except Exception:
            self.handleError(record)


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


def nothing_to_shrink(model: nn.Module) -> Callable[[logging.LogRecord], bool]:
    """A log filter dropping NNI's error for a module type it has no replacer for where no such module holds a
    parameter (timm's and torchvision's Identity): left as it is, which is right, it asks the user to report an issue
    to NNI."""
    empty = {m._get_name() for m in model.modules()} - {m._get_name() for m in model.modules()
                                                       if next(m.parameters(), None) is not None}
    prefix = "Has not supported replacing module with type: "
    return lambda record: not (record.getMessage().startswith(prefix)
                               and record.getMessage()[len(prefix):].partition(",")[0] in empty)


class OwnPrints:
    """sys.stdout while NNI works: what this thread prints is kept (for the log); every other thread of the user's
    prints on the stdout it had (redirect_stdout alone swaps it for the whole process)."""

    def __init__(self, stdout):
        self.stdout, self.kept, self.thread = stdout, io.StringIO(), threading.get_ident()

    def write(self, text: str) -> int:
        return (self.kept if threading.get_ident() == self.thread else self.stdout).write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stdout, name)


def speed_up(model: nn.Module, dummy: Any, masks: dict, dry_run: bool = False) -> Any:
    """NNI's ModelSpeedup (``speedup_class``) run on the model in place; with ``dry_run`` it only infers the masks
    (its ``.empty``: the layers it would leave no channel). What NNI prints (its mask conflicts' axes, '0 Filter')
    goes to the log at debug level, not to the user's stdout."""
    nothing = nothing_to_shrink(model)
    QUIET.addFilter(nothing)
    try:
        with contextlib.redirect_stdout(OwnPrints(sys.stdout)) as printed:
            speedup = speedup_class()(model, dummy, masks, graph_module=fx_trace(model), logger=QUIET)
            speedup.dry_run = dry_run
            speedup.speedup_model()
    finally:
        QUIET.removeFilter(nothing)
    if printed.kept.getvalue():
        QUIET.debug("NNI printed: %s", printed.kept.getvalue().strip())
    return speedup


def surgery(model: nn.Module, dummy: Any, masks: dict) -> None:
    """ModelSpeedup in place, then put back what its new modules lose: ties, frozen flags and buffers of unchanged
    shape (BatchNorm statistics: NNI's first probe would update them, and new modules reset the batch count). The
    model is left in eval mode, so that no probe updates the statistics NNI copies for the kept channels."""
    tied = tied_groups(model)
    shapes = {n: p.shape for n, p in model.named_parameters(remove_duplicate=False)}
    trainable = {n: p.requires_grad for n, p in model.named_parameters(remove_duplicate=False)}
    buffers = buffer_values(model)
    model.eval()
    expected = output_shapes(model, dummy)
    speed_up(model, dummy, masks)
    found = output_shapes(model.eval(), dummy)  # NNI's new modules are made in training mode
    if found != expected:
        raise ValueError(f"pruning changed the model's output shape from {expected} to {found}: keep the layers "
                         "that produce the output out of config_list")
    retie(model, tied, shapes)
    for name, flag in trainable.items():
        model.get_parameter(name).requires_grad_(flag)
    put_back_buffers(model, buffers)


@functools.cache
def speedup_class() -> type:
    """NNI's ModelSpeedup, checking the masks it inferred before it rebuilds anything (``dry_run``: nothing after):
    a layer it would empty is a ValueError naming the layer and why, and any failure to rebuild a layer names it."""
    from nni.compression.speedup import ModelSpeedup
    from nni.compression.speedup.replacement import replace_module
    from nni.compression.speedup.replacer import DefaultReplacer

    class Speedup(ModelSpeedup):
        dry_run = False

        def __init__(self, model, dummy_input, masks, **kwargs):
            super().__init__(model, dummy_input, masks, **kwargs)
            names = {id(m): n for n, m in model.named_modules()}

            def rebuild(module, masks, replace):
                try:
                    return replace(module, masks)
                except Exception as error:
                    name = names.get(id(module), type(module).__name__)
                    raise ValueError(f"NNI cannot rebuild layer {name!r} ({module}) with the channels its masks "
                                     f"keep: {type(error).__name__}: {error}") from error

            self.replacers = [DefaultReplacer({kind: functools.partial(rebuild, replace=fn)
                                               for kind, fn in replace_module.items()})]

        def speedup_model(self):
            """NNI's mask propagation loses the gradient of an in-place activation (a LeakyReLU(inplace=True) right
            after a convolution, DCGAN's discriminator: rand_like of None); they run out of place meanwhile."""
            inplace = [m for m in self.graph_module.modules() if getattr(m, "inplace", None) is True]
            for module in inplace:
                module.inplace = False
            try:
                return super().speedup_model()
            except (TypeError, AttributeError, IndexError, KeyError, RuntimeError) as error:  # inside NNI's passes
                raise ValueError(f"NNI's ModelSpeedup could not carry the masks through this model "
                                 f"({type(error).__name__}: {error}); leave the layers around it out of config_list "
                                 "(exclude_op_names), or prune a plain copy of the model by hand") from error
            finally:
                for module in inplace:
                    module.inplace = True

        def replace_compressed_modules(self):
            self.empty = empty_layers(self.graph_module, self.node_infos)
            if self.dry_run:
                return
            if self.empty:
                message, allowed = empty_message(self)
                raise ValueError(f"{message} (allowed: {allowed})")
            super().replace_compressed_modules()

    return Speedup

