"""Start real multi-process runs from tests: torchrun or accel launch, on loopback, on a free port."""
import json
import os
import select
import socket
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "OMP_NUM_THREADS", "ACCEL_CORE_MAP", "GOMP_CPU_AFFINITY")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_rank_env() -> dict:
    """The variables torchrun --nproc-per-node 1 gives its one rank, on a free loopback port."""
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}


def clean_env() -> dict:
    """The caller's variables without a launcher's; tests/ on the path, so scripts import the project's test
    helpers (the virtual clock, the zoo) as the tests do."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    path = os.pathsep.join(p for p in (str(SCRIPTS.parent), env.get("PYTHONPATH")) if p)
    return {**env, "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": path}


def run(command: list, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run without the caller's launcher variables; a hang raises TimeoutExpired instead of blocking the suite."""
    return subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def torchrun(script: str, *args, nproc: int = 2, restarts: int = 0, timeout: float = 120):
    return run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                f"--max-restarts={restarts}", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                str(SCRIPTS / script), *map(str, args)], timeout)


def accel_launch(script: str, *args, launch_args=(), timeout: float = 120):
    return run([sys.executable, "-m", "accel", "launch", *launch_args, f"--master-port={free_port()}",
                str(SCRIPTS / script), *map(str, args)], timeout)


def say(value) -> None:
    """A rank's report to its test: one JSON line on stdout, in one write. The ranks share torchrun's pipe, and
    print() writes a line and its newline apart where PYTHONUNBUFFERED is set (CI sets it), so two ranks' lines
    could join into one; a write of under PIPE_BUF bytes to a pipe is never split."""
    line = (json.dumps(value) + "\n").encode()
    assert len(line) <= select.PIPE_BUF, "a report this long can interleave: write it to a file instead"
    os.write(sys.stdout.fileno(), line)


def heard(result: subprocess.CompletedProcess) -> list:
    """What the ranks said (say()), in the order they said it."""
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith(("[", "{"))]


def output(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
