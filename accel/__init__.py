"""accel: make PyTorch training faster, with every decision measured and explained.

    run = accel.accelerate(model, optimizer, loader, plan=["threads", "loader", "channels_last", "compile"])
"""
from accel.accelerator import Accelerator, Option, Stage, register, unregister
from accel.core import AccelerateError, accelerate
from accel.errors import PlanError, Problem, Skip
from accel.hardware import probe
from accel.plan import Plan
from accel.report import Report
from accel.run import Run
from accel.tune import tune

import accel.accelerators  # noqa: E402,F401  (registers the built-in accelerators)
import accel.checkpoint  # noqa: E402,F401
import accel.distributed  # noqa: E402,F401

__all__ = ["AccelerateError", "Accelerator", "Option", "Plan", "PlanError", "Problem", "Report", "Run", "Skip",
           "Stage", "accelerate", "probe", "register", "tune", "unregister"]
__version__ = "0.1.0"
