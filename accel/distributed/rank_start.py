"""One rank's start under ``accel launch``: torchrun runs this file by its path, as a plain script that imports only
the standard library, so that the rank pins itself to its cores before torch (and its OpenMP runtime) loads; then it
runs the training script. It sets no GOMP_CPU_AFFINITY: libgomp would bind the main thread, and the DataLoader
workers forked from it, to one CPU, while the process mask confines the OpenMP threads already.
"""
from __future__ import annotations

import os
import runpy
import sys

if __name__ == "__main__":  # this file's folder must not shadow standard modules
    del sys.path[0]

CORE_MAP = "ACCEL_CORE_MAP"  # = accel.hardware.launcher.CORE_MAP_VARIABLE (a test holds them equal)


def rank_main(argv: list[str]) -> None:
    """Pin to this rank's cores (``accel launch``'s map, by local rank), then run the user's script."""
    shares = os.environ.get(CORE_MAP, "").split(";")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank < len(shares) and shares[local_rank]:
        os.sched_setaffinity(0, {int(cpu) for cpu in shares[local_rank].split(",")})
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    rank_main(sys.argv[1:])
