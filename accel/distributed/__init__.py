"""The distributed half of accel: the process group (``group``: joined and left through the run's journal), the
base that ddp and fsdp share (``data_parallel``), one rank's start under ``accel launch`` (``rank_start``), and
helpers for training scripts, which also work in a single process. Where this process sits in a launched job is
accel.hardware.launcher's."""
from accel.distributed.group import all_reduce_mean, is_main_process
from accel.hardware.launcher import barrier, rank, world_size

__all__ = ["all_reduce_mean", "barrier", "is_main_process", "rank", "world_size"]
