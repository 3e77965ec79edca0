"""fsdp's FSDP2 surgery: shard the model and give it back whole, the optimizer on the shards, held gradients reduced."""
from __future__ import annotations

# torch.distributed's FSDP2 and DTensor are imported where they are used: accel imports on a torch without them
# (fsdp's check says why it cannot run there).
import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from accel.errors import LoopError

HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
              "_forward_hooks_always_called", "_backward_pre_hooks", "_backward_hooks", "_state_dict_hooks",
              "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


@dataclass
class Sharding:
    """Everything fully_shard changed on the model, recorded so run.close() can give the model back unsharded."""

    slots: list[tuple[nn.Module, str, nn.Parameter]] = field(default_factory=list)  # the original parameters
    classes: list[tuple[nn.Module, type]] = field(default_factory=list)  # classes before FSDP's was put first
    added: list[tuple[nn.Module, str, Any]] = field(default_factory=list)  # (module, dict or "__dict__", key)
    sharded: list[nn.Module] = field(default_factory=list)  # the modules fully_shard was called on


def _holders(module: nn.Module) -> dict[str, dict]:
    """The module's hook dicts and its __dict__, by name: where fully_shard adds keys."""
    return {where: module.__dict__ if where == "__dict__" else getattr(module, where, {})
            for where in (*HOOK_DICTS, "__dict__")}


def shard_model(model: nn.Module, blocks: list[nn.Module], float32: list[nn.Module], sum_reductions: bool,
                **kwargs) -> Sharding:
    """fully_shard each block, then the root, recording what changes (the model is changed in place); ``float32``:
    modules sharded on their own with float32 parameters under amp (one may be a block, the root, or hold one). Each
    module is sharded once, inside ones before those around them, as FSDP2 needs. ``sum_reductions``: gradients
    reduced with SUM and divided by the world size apart, never with ReduceOp.AVG."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    record = Sharding(slots=[(m, leaf, p) for m in model.modules() for leaf, p in m._parameters.items()
                             if p is not None],
                      classes=[(m, type(m)) for m in model.modules()])
    before = {(id(m), where): set(held) for m in model.modules() for where, held in _holders(m).items()}

    def recorded() -> Sharding:
        for m in model.modules():
            for where, held in _holders(m).items():
                record.added += [(m, where, key) for key in set(held) - before.get((id(m), where), set())]
        return record

    try:
        chosen = {*float32, *blocks, model}
        for module in [m for m in reversed(list(model.modules())) if m in chosen]:
            fully_shard(module, **{**kwargs, **({"mp_policy": MixedPrecisionPolicy()} if module in float32 else {})})
            record.sharded.append(module)
            if sum_reductions:
                module.set_force_sum_reduction_for_comms(True)
    except BaseException:  # a fully_shard that raised (a ModuleList named a block): those before it given back
        unshard_model(recorded())
        raise
    return recorded()


def param_groups(sharded: list[nn.Module]) -> list[Any]:
    """FSDP2's param groups of the sharded modules: torch 2.15 keeps a list of them per module, 2.8 one group."""
    states = [module._get_fsdp_state() for module in sharded if hasattr(module, "_get_fsdp_state")]
    return [g for state in states for g in getattr(state, "_fsdp_param_groups", None)
            or [getattr(state, "_fsdp_param_group", None)] if g is not None]


def let_go_of_fsdp(sharded: list[nn.Module]) -> None:
    """What FSDP2 keeps past the sharding it is taken off with: the state_dict pre-hooks it puts on the model only at
    its first forward (beyond what shard_model recorded), and the process group in its mesh infos. Left, each keeps
    the group and gloo's threads alive: in the user's model, or in FSDP's own cyclic state, garbage that a forked
    DataLoader worker would inherit (and whose destructor there joins threads the child does not have)."""
    for group in param_groups(sharded):
        for name in ("_module_to_pre_save_state_dict_hook_handle", "_module_to_pre_load_state_dict_hook_handle"):
            for handle in getattr(group, name, {}).values():
                handle.remove()
        for holder in [group, *getattr(group, "fsdp_params", [])]:
            for info in (getattr(holder, "mesh_info", None), getattr(holder, "post_forward_mesh_info", None)):
                for field_name in ("shard_process_group", "reduce_scatter_process_group", "replicate_process_group"):
                    if getattr(info, field_name, None) is not None:
                        setattr(info, field_name, None)


def unshard_model(record: Sharding) -> None:
    """Gather the trained weights into the original parameters and take FSDP off the modules (a collective)."""
    for module in reversed(record.sharded):
        module.reshard()  # a forward without backward (eval) may have left a module unsharded
    full: dict[int, torch.Tensor] = {}
    for module, leaf, original in record.slots:  # in the model's order on every rank: the gathers pair up
        if id(original) not in full:
            full[id(original)] = gather_state(module._parameters.get(leaf)).detach()
    let_go_of_fsdp(record.sharded)
    for module, where, key in reversed(record.added):
        _holders(module)[where].pop(key, None)
    with contextlib.suppress(ImportError):
        from torch.distributed._composable_state import _module_state_mapping
        for module in record.sharded:
            _module_state_mapping.pop(module, None)
    for module, cls in record.classes:
        module.__class__ = cls
    with torch.no_grad():
        for module, leaf, original in record.slots:
            current = module._parameters.get(leaf)
            if current is not original:
                value = full[id(original)]
                original.copy_(value.to(original.device, original.dtype))
                original.requires_grad_(current.requires_grad)  # unfrozen (or frozen) through the model meanwhile
                module._parameters[leaf] = original
                original.grad = None


def shard_like(value: Any, param: nn.Parameter) -> Any:
    """An optimizer state tensor of the parameter's full shape, sharded as the parameter is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and isinstance(param, DTensor) \
            and tuple(value.shape) == tuple(param.shape):
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
    return value


def gather_state(value: Any) -> Any:
    """A DTensor shard gathered whole (a collective); anything else as it is."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def swap_parameters(optimizer: torch.optim.Optimizer, mapping: dict[int, nn.Parameter], convert) -> None:
    """Put mapping[id(p)] in place of each p in the optimizer's groups and state, converting the state's tensors."""
    for group in optimizer.param_groups:
        for i, param in enumerate(group["params"]):
            new = mapping.get(id(param))
            if new is None:
                continue
            group["params"][i] = new
            if param in optimizer.state:
                optimizer.state[new] = {k: convert(v, new) for k, v in optimizer.state.pop(param).items()}


class Originals:
    """Your own parameters while the run holds their shards, kept live: ``requires_grad_`` on one of them reaches
    its shard, and one found in the optimizer's groups (a group added with ``add_param_group`` over Parameter objects
    taken before accelerate()) is swapped for its shard, with its state, as the first groups were."""

    def __init__(self, model: nn.Module, record: Sharding):
        self.shards = {id(original): module._parameters[leaf] for module, leaf, original in record.slots}
        self.pairs = [(o, self.shards[id(o)]) for o in {id(o): o for _, _, o in record.slots}.values()]
        self.seen = [o.requires_grad for o, _ in self.pairs]  # what the shards were given from your parameters
        self.names = {id(p): n for n, p in reversed(list(model.named_parameters(remove_duplicate=False)))}
        self.queued = False  # a backward will share the gradients at its end

    def share_grads(self) -> None:
        """Your own Parameters' ``.grad`` is their shard's gradient, the same DTensor: clip_grad_norm_ over
        Parameters taken before accelerate() scales what trains, as a norm over them reads it. Where the shard's
        lives on another device than yours (cpu_offload's host memory), yours stays as it was."""
        self.queued = False
        for original, shard in self.pairs:
            grad = shard.grad
            if original.grad is not grad and (grad is None or (grad.device, grad.dtype) == (original.device,
                                                                                             original.dtype)):
                original.grad = grad

    def after_backward(self, module: nn.Module, args: Any, output: Any) -> None:
        """A forward hook on the model: a backward through its output shares the gradients at its end, once per
        backward (the loop's own loss.backward() too)."""
        if not self.queued and torch.is_grad_enabled():
            for tensor in needing_grad(output):
                tensor.register_hook(self._queue)

    def _queue(self, grad: torch.Tensor) -> None:
        """At the end of this backward, after every callback queued in it (FSDP2's end of backward, which gives the
        shards their gradients): queued from a callback, which the engine runs after those queued before it."""
        if not self.queued:
            self.queued = True
            queue = torch.autograd.Variable._execution_engine.queue_callback
            queue(lambda: queue(self.share_grads))

    def follow(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Before every forward and every optimizer step: your unfreezing, then your optimizer's new groups, and
        your Parameters' gradients (None after a zero_grad)."""
        self.share_grads()
        for i, (original, shard) in enumerate(self.pairs):
            if original.requires_grad != self.seen[i]:
                self.seen[i] = original.requires_grad
                shard.requires_grad_(self.seen[i])
        if optimizer is None or all(id(p) in self.names for g in optimizer.param_groups for p in g["params"]):
            return
        held = [(i, j, p) for i, g in enumerate(optimizer.param_groups) for j, p in enumerate(g["params"])]
        if foreign := [f"group {i} position {j} (shape {tuple(p.shape)})" for i, j, p in held
                       if id(p) not in self.names and id(p) not in self.shards]:
            raise LoopError(f"fsdp: your optimizer holds {len(foreign)} parameter(s) that are not the model's, added "
                            f"after accelerate(): {', '.join(foreign[:5])}. fsdp trains the model's parameters as its "
                            "shards and cannot shard these; give add_param_group the model's parameters only (keep "
                            "another tensor in an optimizer of its own). The weights and the optimizer are as they "
                            "were")
        whose = Counter(id(self.shards.get(id(p), p)) for _, _, p in held)
        if twice := sorted(self.names[k] for k, count in whose.items() if count > 1):
            raise LoopError(f"fsdp: your optimizer holds the model's {twice[:5]} twice: once as the shard fsdp put in "
                            "its place and once as your own Parameter (added again with add_param_group); torch "
                            "refuses a parameter in more than one group. The weights and the optimizer are as they "
                            "were")
        swap_parameters(optimizer, self.shards, shard_like)


def needing_grad(output: Any) -> Iterator[torch.Tensor]:
    """The tensors of a forward's output (in tuples, lists and dicts: a model output) that a backward goes through."""
    if isinstance(output, torch.Tensor):
        if output.requires_grad:
            yield output
    elif isinstance(output, (list, tuple)):
        for item in output:
            yield from needing_grad(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from needing_grad(item)


def held_by_parameter(sharded: list[nn.Module]) -> Iterator[tuple[Any, list[torch.Tensor]]]:
    """Each FSDPParam of the sharded modules with the unsharded gradients it holds: on the unsharded parameter, or
    in ``_unsharded_accumulated_grad`` where it accumulates in another dtype."""
    for fsdp_param in (p for group in param_groups(sharded) for p in group.fsdp_params):
        param = getattr(fsdp_param, "_unsharded_param", None)
        grads = [getattr(param, "grad", None), getattr(fsdp_param, "_unsharded_accumulated_grad", None)]
        if held := list({id(g): g for g in grads if g is not None}.values()):
            yield fsdp_param, held


def reduce_into_shards(sharded: list[nn.Module]) -> None:
    """Reduce every held gradient as FSDP's reduce-scatter would (summed over the mesh's ranks, divided by their
    number, in the parameter's dtype), add this rank's shard to the sharded parameter's ``.grad``, and drop the
    unsharded one. A collective: every rank calls it, and FSDP's param order is the same on all."""
    from torch.distributed.tensor import DTensor, Replicate

    for fsdp_param, held in held_by_parameter(sharded):
        shard_param = fsdp_param.sharded_param
        full = sum(g.detach().to(shard_param.dtype) for g in held)
        mesh = shard_param.device_mesh
        if mesh.size() > 1:
            torch.distributed.all_reduce(full, group=mesh.get_group())
            full = full / mesh.size()
        shard = DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False).redistribute(
            mesh, shard_param.placements)
        if shard_param.grad is None:
            shard_param.grad = shard
        else:
            shard_param.grad += shard
        fsdp_param._unsharded_param.grad = None
        if getattr(fsdp_param, "_unsharded_accumulated_grad", None) is not None:
            fsdp_param._unsharded_accumulated_grad = None
