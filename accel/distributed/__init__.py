"""The distributed half of accel: the process group (joined and left through the run's journal), the base that
ddp and fsdp share (``data_parallel``), and helpers for training scripts, which work in a single process too."""
from accel.hardware.launcher import all_reduce_mean, barrier, is_main_process, rank, world_size

__all__ = ["all_reduce_mean", "barrier", "is_main_process", "rank", "world_size"]
