"""accel.testing.loops: the zoo's loop behaviours, which live in accel.workloads.loops beside the zoo."""
from accel.workloads.loops import *  # noqa: F401,F403  (every loop and LOOPS)
