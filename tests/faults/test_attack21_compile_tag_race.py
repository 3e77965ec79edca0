"""Two processes starting plan=["compile"] on one fresh cache folder (two jobs of an array, two ranks' first runs):
the first tags compile/ as accel's (CACHEDIR.TAG, written whole through a temporary file that is renamed over it),
and a second that looks while that temporary is there finds "files accel did not write", leaves the folder to torch's
own and says so. A real second process, stopped in the middle of writing the tag."""
import os
import subprocess
import sys
import warnings

import pytest
from injectors import objects

import accel
from accel.accelerators.compile import has_compiler

WRITER = """
import sys
from pathlib import Path
from accel.accelerators.compile.cache import TAG, TAG_TEXT
from accel.files import write_atomically

def write(file):
    file.write(TAG_TEXT.encode())
    print("writing", flush=True)
    sys.stdin.readline()  # (held here, in the middle of its write, until the test goes on)

place = Path(sys.argv[1])
place.mkdir(parents=True)
write_atomically(place / TAG, write)
"""


@pytest.mark.slow
def test_a_second_process_while_the_first_tags_the_compile_folder_keeps_its_graphs_in_accels_folder(tmp_path,
                                                                                                   monkeypatch):
    if not has_compiler():
        pytest.skip("inductor on a CPU needs a C++ compiler")
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    first = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "compile")], env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert first.stdout.readline().strip() == "writing"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = accel.accelerate(*objects(), plan=["compile"], device="cpu")
        try:
            place = run.report.row("compile").changes["compile cache"]
        finally:
            run.close()
        first.communicate("go\n", timeout=60)
        assert first.returncode == 0
        assert place == str(tmp_path / "compile"), place
    finally:
        first.kill()
