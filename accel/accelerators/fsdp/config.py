"""fsdp's options, and the state its run holds: the model's sharding and what the hooks follow."""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from accel.accelerators.fsdp.surgery import Originals, Sharding
from accel.distributed.data_parallel import DataParallelOptions
from accel.plan.contract import State
from accel.plan.options import module_classes, option

REDUCE_DTYPES = ("float32", "compute")


@dataclass(frozen=True, kw_only=True)
class FSDPOptions(DataParallelOptions):
    blocks: str | list[str] = module_classes("class names of the modules to shard one by one; auto = the repeated "
                                             "blocks")
    reshard_after_forward: bool = option(True, help="free each block's gathered weights after its forward "
                                                    "(gathered again for backward): less memory, more traffic")
    reduce_dtype: str = option("float32", choices=REDUCE_DTYPES,
                               help="with amp: reduce gradients in fp32, or in the compute dtype")
    cpu_offload: bool = option(False, help="keep shards and optimizer state in host memory (accelerators only)")


@dataclass
class FSDPState(State):
    """The model's sharding while the run holds it (None once run.close() or a later plan took it off; a failed
    later plan puts it back, redone), and what the hooks follow."""

    sharding: Sharding | None = None  # what fully_shard changed, to give the model back (surgery.py)
    originals: Originals | None = None  # your own parameters while their shards train
    params: list[tuple[str, nn.Parameter]] = field(default_factory=list)  # the shards, checked for gradient hooks
    sync: bool = True  # reduce-scatter gradients in backward (False while a step schedule accumulates)
    warned: bool = False  # the StaleWarning about a gradient hook on a shard was given
