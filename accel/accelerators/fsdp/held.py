"""The gradients FSDP2 holds unreduced while accumulating: found in its state, reduced into the shards on demand."""
from __future__ import annotations

# torch.distributed's DTensor is imported where it is used: accel imports on a torch without it
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def held_by_parameter(sharded: list[nn.Module]) -> Iterator[tuple[Any, list[torch.Tensor]]]:
    """Each FSDPParam of the sharded modules with the unsharded gradients it holds (FSDP2's state: torch 2.15 keeps
    one list of param groups per module, 2.8 one group; the gradient sits on the unsharded parameter, or in
    ``_unsharded_accumulated_grad`` where it accumulates in another dtype)."""
    for module in sharded:
        fsdp_state = module._get_fsdp_state()
        groups = getattr(fsdp_state, "_fsdp_param_groups", None) or [getattr(fsdp_state, "_fsdp_param_group", None)]
        for fsdp_param in (p for group in groups if group is not None for p in group.fsdp_params):
            param = getattr(fsdp_param, "_unsharded_param", None)
            grads = [getattr(param, "grad", None), getattr(fsdp_param, "_unsharded_accumulated_grad", None)]
            held = list({id(g): g for g in grads if g is not None}.values())
            if held:
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
