"""What accelerators need to know of a user's module tree: whether it is compiled (and how long compiling took),
which parameters are tied, which train, which modules are its repeated blocks (what activation_checkpointing, fsdp
and compile work on) and whether it checkpoints itself."""
from __future__ import annotations

import collections
import hashlib
import sys

import torch
from torch import nn
from torch.ao.quantization.fake_quantize import FakeQuantizeBase
from torch.ao.quantization.observer import ObserverBase
from torch.nn.modules import module as torch_module
from torch.nn.utils import parametrize
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from accel.errors import Problem, brief


def compiled(module: nn.Module) -> bool:
    """A torch.compile wrapper (OptimizedModule), whose module tree cannot be copied and hooked."""
    dynamo = sys.modules.get("torch._dynamo")  # never imported: nothing can be compiled (and importing it is slow)
    return dynamo is not None and isinstance(module, dynamo.eval_frame.OptimizedModule)


def compile_seconds() -> float:
    """The seconds torch.compile has spent compiling in this process so far, recompiles included: the difference
    between two steps is compile time inside the step, not step time."""
    utils = sys.modules.get("torch._dynamo.utils")
    return sum(utils.compilation_time_metrics.get("_compile.compile_inner", ())) if utils is not None else 0.0


def tied_groups(model: nn.Module) -> list[list[str]]:
    """Names of the parameters that are one tensor (model.b.weight = model.a.weight), one list per tensor."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def trainable(params: list[nn.Parameter]) -> tuple[bool, ...]:
    """Which of these parameters require gradients now (what DDP and a compiled graph were built for: a change is an
    unfreezing they do not see). Checked every step, so over a list made once."""
    return tuple(p.requires_grad for p in params)


def qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def own_class(module: nn.Module) -> type:
    """The module's class as the user wrote it, under the subclasses torch makes of it: parametrize's (one per module)
    and FSDP2's (FSDPModule first), in either order (FSDPParametrizedResidual and ParametrizedFSDPResidual are both
    Residual)."""
    made = (parametrize.__name__, "torch.distributed.fsdp")
    return next(kind for kind in type(module).__mro__ if not kind.__module__.startswith(made))


def class_names(model: nn.Module) -> dict[type, str]:
    """Each class of the model's modules (``own_class``) by a name that names it alone: its own, or where two classes
    share it (peft's lora.Linear beside torch's Linear), its qualified name ('peft.tuners.lora.layer.Linear')."""
    kinds = {own_class(m) for m in model.modules()}
    shared = collections.Counter(k.__name__ for k in kinds)
    return {k: k.__name__ if shared[k.__name__] == 1 else qualified(k) for k in kinds}


QUANTIZING = (ObserverBase, FakeQuantizeBase)  # what quantization-aware training hangs on a layer: no layers


def has_layers(module: nn.Module) -> bool:
    """Whether the module holds layers: child modules besides a parametrized layer's ``parametrizations``
    (spectral_norm, weight_norm) and the observers and fake quantizers QAT's prepare_qat hangs on a layer
    (``activation_post_process``, ``weight_fake_quant``, a FakeQuantize's own observer)."""
    return any(name != "parametrizations" and not isinstance(child, QUANTIZING)
               for name, child in module.named_children())


def repeated_blocks(model: nn.Module, least: int = 2) -> set[str]:
    """Names of the classes of blocks occurring at least ``least`` times, each class counted apart (by ``class_names``:
    two classes of one name are two names). A block is a module of layers (``has_layers``) and no container: a
    parametrized layer, a layer QAT observes, a FakeQuantize stay one layer each."""
    counts = collections.Counter(own_class(m) for m in model.modules() if m is not model and not isinstance(
        m, (nn.Sequential, nn.ModuleList, nn.ModuleDict)) and has_layers(m))
    names = class_names(model)
    return {names[kind] for kind, count in counts.items() if count >= least}


def names_of(module: nn.Module) -> set[str]:
    """The names the module's class answers to, own and qualified: its class's and its ``own_class``'s."""
    return {n for kind in (type(module), own_class(module)) for n in (kind.__name__, qualified(kind))}


def of_class(module: nn.Module, classes: set[str]) -> bool:
    """Whether the module's class answers to one of these names (``names_of``)."""
    return not names_of(module).isdisjoint(classes)


def chosen_classes(model: nn.Module, names: str | list[str]) -> tuple[set[str], list[str]]:
    """The classes of blocks an accelerator works on in the model (``names`` "auto": its repeated blocks; else these
    class names, own or qualified), and the names given that no module of the model has."""
    if names == "auto":
        return repeated_blocks(model), []
    present = set().union(*map(names_of, model.modules()))
    return set(names) & present, sorted(set(names) - present)


def absent_classes(owner: str, field: str, names: str | list[str], model: nn.Module) -> list[Problem]:
    """The problem of class names given that no module of the model has, suggesting its repeated blocks (or, with
    none, its classes of blocks: names the model has, never an example it lacks)."""
    if not (missing := chosen_classes(model, names)[1]):
        return []
    blocks = repeated_blocks(model) or repeated_blocks(model, 1) or class_names(model).values()
    return [Problem(owner, f"no module of class {brief(missing)} in the model", field=field,
                    value=names, allowed="class names of the model's modules, e.g. " + listed(sorted(blocks)))]


# flags by which a model checkpoints its own activations, and who sets them
SELF_CHECKPOINTING = {"grad_checkpointing": "timm's set_grad_checkpointing()",
                      "gradient_checkpointing": "Hugging Face's gradient_checkpointing_enable() (diffusers' "
                                                "enable_gradient_checkpointing())",
                      "use_checkpoint": "use_checkpoint=True",
                      "memory_efficient": "torchvision's memory_efficient=True"}


def checkpoints_itself(model: nn.Module) -> list[str]:
    """Where the model recomputes its own activations already: 'name.flag (who sets it)' for every module whose
    flag is on (timm, Hugging Face, diffusers, torchvision's DenseNet, Swin's use_checkpoint)."""
    return [f"{name or type(model).__name__}.{flag} ({who})" for name, module in model.named_modules()
            for flag, who in SELF_CHECKPOINTING.items() if module.__dict__.get(flag) is True]


def running_statistics(model: nn.Module) -> list[str]:
    """Modules whose forward updates buffers in training: BatchNorm's (and InstanceNorm's) running statistics."""
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats]


def buffer_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every buffer of the model, by name: for `put_back_buffers` once a tool has set the model up."""
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}


def put_back_buffers(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Put back the buffers a tool changed while it set the model up (IPEX reading a spectral_norm weight, NNI
    tracing BatchNorm): setting up must not train. Matched by name and shape: the model may be the tool's copy."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in values and values[name].shape == buffer.shape:
                buffer.copy_(values[name])


def hands_blocks_a_cache(model: nn.Module) -> bool:
    """A Hugging Face decoder whose config.use_cache is on (GPT-2's default, kept in training): its forward hands
    every block the KV cache, which each block appends to (an encoder keeps none whatever use_cache says)."""
    config = getattr(model, "config", None)
    return getattr(config, "use_cache", None) is True and (getattr(config, "is_decoder", None) is not False
                                                            or getattr(config, "is_encoder_decoder", None) is True)


RECOMPUTABLE_HOOKS: set = set()  # forward hooks, or their classes, that compute only from their arguments


def recomputable(hook):
    """Mark a forward hook (or the class of such hooks) as computing only from its arguments: running it again (in a
    recomputation) changes nothing. Returns the hook (a decorator)."""
    RECOMPUTABLE_HOOKS.add(hook)
    return hook


def rerun_hooks(block: nn.Module) -> list[str]:
    """The forward hooks a recomputation of ``block`` would run twice (its layers' and the global ones), less those
    that compute only from the module's tensors (``recomputable``; spectral_norm, weight_norm, prune)."""
    def rerun(hook) -> bool:
        return not any(hook is h or type(hook) is h for h in RECOMPUTABLE_HOOKS) and not isinstance(hook, (
            SpectralNorm, WeightNorm, BasePruningMethod))

    hooks = [(m, hook) for m in block.modules() if m is not block
             for hook in (*m._forward_pre_hooks.values(), *m._forward_hooks.values()) if rerun(hook)]
    hooks += [(None, hook) for hook in (*torch_module._global_forward_pre_hooks.values(),
                                        *torch_module._global_forward_hooks.values()) if rerun(hook)]
    names = {id(m): name for name, m in block.named_modules()} if hooks else {}
    return [f"{names.get(id(m), '(every module)')}: {getattr(hook, '__qualname__', type(hook).__name__)}"
            for m, hook in hooks]


def listed(names: list[str], most: int = 8) -> str:
    """'layer1.0, layer1.1, ... (12 in all)': which modules, without a wall of text."""
    shown = ", ".join(names[:most])
    return shown + (f", ... ({len(names)} in all)" if len(names) > most else "")


def outermost(model: nn.Module, classes: set[str] | type) -> list[nn.Module]:
    """The modules under the root of these classes (names, as ``of_class`` reads them, or a class they are instances
    of) that are not inside another one of them, in the model's order."""
    found: list[nn.Module] = []
    for child in model.children():
        hit = isinstance(child, classes) if isinstance(classes, type) else of_class(child, classes)
        found += [child] if hit else outermost(child, classes)
    return found


def fingerprint(model: nn.Module) -> str:
    """A digest of the model's structure: its modules' classes, its parameters' and buffers' names, shapes, dtypes
    and which train (not their values): what the plan cache and compile's markers key a model by."""
    digest = hashlib.sha256()
    for name, module in model.named_modules():
        digest.update(f"{name}:{qualified(type(module))};".encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{tensor.requires_grad};".encode())
    return digest.hexdigest()[:16]
