"""Signals to `accel launch`: SIGTERM (scancel, Kubernetes, kill) and SIGINT ended the launcher alone and left
torchrun and the ranks running. Now it passes them on and exits with 128 + the signal once the ranks are gone;
and if the launcher itself is killed (SIGKILL), torchrun is told (SIGTERM) and stops them."""
import os
import signal
import subprocess
import sys
import time

import pytest
from scripts.launching import clean_env, free_port

RANK = """import os, pathlib, sys, time
pathlib.Path(sys.argv[1], "rank.pid").write_text(str(os.getpid()))
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["SIGTERM", "SIGINT",
                                                                                        "SIGKILL"])
def test_a_signal_to_accel_launch_stops_the_ranks(tmp_path, signum):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    launcher = subprocess.Popen([sys.executable, "-m", "accel", "launch", "--master-port", str(free_port()),
                                 str(script), str(tmp_path)], env=clean_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    rank = None
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "rank.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        rank = int((tmp_path / "rank.pid").read_text())
        launcher.send_signal(signum)
        status = launcher.wait(timeout=90)
        assert gone_within(rank, 60), "the rank outlived the launcher"
        if signum != signal.SIGKILL:
            assert status == 128 + signum, launcher.stdout.read()[-2000:]
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if rank is not None and alive(rank):
            os.kill(rank, signal.SIGKILL)
