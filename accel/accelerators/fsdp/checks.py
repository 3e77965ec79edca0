"""What fsdp refuses besides the launch and its options: no FSDP2 in torch, a model sharded already, foreign tensors."""
from __future__ import annotations

from torch import nn

from accel.errors import Problem


def fsdp_available() -> str | None:
    """Why this torch cannot run FSDP2, or None."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401  (torch >= 2.6)
    except ImportError as error:
        return f"this torch has no FSDP2 (torch.distributed.fsdp.fully_shard): {error}"
    return None


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 manages this module (its class was given FSDPModule's)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


def foreign_parameter_problems(name: str, ctx, params: list[nn.Parameter]) -> list[Problem]:
    """An optimizer holding tensors that are not the model's parameters: fsdp could not shard them."""
    if ctx.optimizer is None:
        return []
    mine = {id(p) for p in params}
    foreign = [i for i, p in enumerate(p for g in ctx.optimizer.param_groups for p in g["params"])
               if id(p) not in mine]
    if not foreign:
        return []
    return [Problem(name, f"the optimizer holds {len(foreign)} parameter(s) that are not the model's (positions "
                          f"{foreign[:5]} in its param groups): fsdp replaces the model's parameters with their "
                          "shards and cannot shard those",
                    field="optimizer", allowed="an optimizer built over model.parameters()", kind="conflict")]
