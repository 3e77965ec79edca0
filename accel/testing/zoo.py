"""accel.testing.zoo: the zoo of ordinary user code, which lives in accel.workloads.zoo with every other workload."""
from accel.workloads.zoo import *  # noqa: F401,F403  (every name of the zoo)
