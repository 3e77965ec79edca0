"""accel: make PyTorch training faster, with every decision measured and explained.

    run = accel.accelerate(model, optimizer, loader, plan=["threads", "loader", "channels_last", "compile"])
    run = accel.accelerate(model, optimizer, loader, plan="auto")      # measured on your model, remembered
"""
from accel.accelerator import Accelerator, Capability, Keeps, Stage, State, register, unregister
from accel.autotune import Auto, TuneResult, tune
from accel.core import accelerate, decide
from accel.errors import (AccelerateError, AccelError, BypassWarning, CheckpointError, LoopError, MeasureError,
                          PlanError, Problem, Skip, StaleWarning)
from accel.hardware import probe
from accel.options import Option, Options, option
from accel.plan import Plan
from accel.report import Report
from accel.run import Run

import accel.accelerators  # noqa: E402,F401  (registers the built-in accelerators)
import accel.checkpoint  # noqa: E402,F401
import accel.distributed  # noqa: E402,F401

__all__ = ["AccelError", "AccelerateError", "Accelerator", "Auto", "Capability", "BypassWarning", "CheckpointError", "LoopError", "Keeps", "MeasureError", "Option", "Options", "Plan",
           "PlanError", "Problem", "Report", "Run", "Skip", "Stage", "State", "StaleWarning", "TuneResult", "accelerate", "decide", "probe",
           "option", "register", "tune", "unregister"]
__version__ = "0.3.0"
