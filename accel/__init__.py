"""accel: make PyTorch training faster, with every decision measured and explained.

    run = accel.accelerate(model, optimizer, loader, plan=["threads", "loader", "channels_last", "compile"])
    run = accel.accelerate(model, optimizer, loader, plan="auto")      # measured on your model, remembered

The layout (docs/contract.md has the contract): ``api`` (accelerate, decide); ``plan/`` (the plan and the
accelerator contract); ``run/`` (the run and its checkpoints); ``accelerators/`` (one module or folder each);
``hardware/`` (the machine, and where this process sits in a launched job); ``distributed/`` (the process group,
the base of ddp and fsdp, helpers for scripts); ``measure/``; ``search/`` (tune, plan="auto", the plan cache);
``workloads/``; ``testing/``; ``cli/``.
"""
import accel.accelerators  # noqa: F401  (registers the built-in accelerators)
from accel.api import decide
from accel.errors import (
                          AccelerateError,
                          AccelError,
                          BypassWarning,
                          CheckpointError,
                          LoopError,
                          LoopWarning,
                          MeasureError,
                          PlanError,
                          Problem,
                          Skip,
                          StaleWarning,
)
from accel.hardware import Hardware, probe
from accel.plan import Plan
from accel.plan.contract import Accelerator, Capability, Keeps, Stage, State, register, unregister
from accel.plan.options import Option, Options, option
from accel.run import Run
from accel.run.context import Context
from accel.run.report import Report
from accel.search import Auto, TuneResult, accelerate, tune
from accel.version import __version__

__all__ = ["__version__", "AccelError", "AccelerateError", "Accelerator", "Auto", "Capability", "BypassWarning",
           "CheckpointError", "Context", "Hardware", "LoopError", "LoopWarning", "Keeps", "MeasureError", "Option",
           "Options", "Plan", "PlanError", "Problem", "Report", "Run", "Skip", "Stage", "State", "StaleWarning",
           "TuneResult", "accelerate", "decide", "probe", "option", "register", "tune", "unregister"]
