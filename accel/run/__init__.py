"""The run and its checkpoints: the object the training loop talks to (``run``), what it works on (``context``,
the undo ``journal`` and its ``shared_settings``), its loader (``device_loader``, which also rebuilds a user's
DataLoader), what it notices (``watch``) and reports (``report``), and what it saves: its state (``state``) in one
file (``checkpoint``) or sharded per rank (``sharded_checkpoint``), each rank's part shared by both
(``checkpoint_fit``)."""
from accel.run.run import Run, open_run

__all__ = ["Run", "open_run"]
