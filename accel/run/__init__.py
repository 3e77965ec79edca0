"""The run and its checkpoints: the object the training loop talks to (``run``), what it works on (``context``,
``journal``), its loader, what it notices (``watch``) and reports, and what it saves (``state``, ``checkpoint``)."""
from accel.run.run import Run, open_run

__all__ = ["Run", "open_run"]
