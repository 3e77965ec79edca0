"""compile keeps what inductor compiled in accel's cache folder (accel/accelerators/compile/cache.py): a second process
compiling the same model starts warm, and the run puts the process's TORCHINDUCTOR_CACHE_DIR back when it closes or
fails."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import accel
import accel.accelerators.compile.cache as compile_cache
from accel.accelerators.compile import has_compiler

ROOT = Path(__file__).resolve().parents[1]
needs_compiler = pytest.mark.skipif(not has_compiler(), reason="inductor on a CPU needs a C++ compiler on PATH")

# One short training run with compile in a fresh process: what the report said of the cache, torch's own cache
# counters after the first step (AOTAutograd's hits and misses: the forward and backward graphs of the step), and
# the first step's time.
CHILD = """
import json, os, time
import torch
import accel
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None, ["compile"], device="cpu")
during = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
times = []
for _ in range(2):
    started = time.perf_counter()
    run.backward(run.model(torch.randn(4, 8)).square().mean())
    run.step()
    times.append(time.perf_counter() - started)
print(json.dumps({"changes": run.report.row("compile").changes, "during": during, "first_s": times[0],
                  "aot": dict(counters["aot_autograd"]), "fxgraph": dict(counters["inductor"])}))
"""


def tiny():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def child_env(cache: Path) -> dict[str, str]:
    """The environment of a user's fresh process with accel's cache folder here: no inductor cache settings of
    the test process's own (torch writes its default folder into the environment once it looked it up)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    env["ACCEL_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.mark.slow
@needs_compiler
def test_a_second_process_compiling_the_same_model_starts_warm(tmp_path):
    """Measured here: the cold first step 12-13 s (dynamo, AOTAutograd, inductor and g++), the warm one about 1 s
    (dynamo only; the graphs and kernels load)."""
    cache = tmp_path / "accel-cache"
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=child_env(cache), capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    folder = os.path.abspath(cache / "compile")
    assert cold["during"] == warm["during"] == folder
    assert cold["changes"]["compile cache"] == warm["changes"]["compile cache"] == folder
    # the first process compiled and wrote its graphs into accel's folder; the second loaded them
    assert cold["changes"]["warm start"].startswith("no") and warm["changes"]["warm start"].startswith("yes")
    assert cold["aot"].get("autograd_cache_miss", 0) >= 1 and cold["aot"].get("autograd_cache_saved", 0) >= 1
    assert warm["aot"].get("autograd_cache_hit", 0) >= 1 and not warm["aot"].get("autograd_cache_miss")
    assert (cache / "compile" / "aotautograd").is_dir() and (cache / "compile" / "fxgraph").is_dir()
    assert len(compile_cache.graph_entries(cache / "compile")) >= 2  # a forward and a backward graph at least
    print(f"first step: cold {cold['first_s']:.1f} s, warm {warm['first_s']:.1f} s")


@pytest.mark.parametrize("before", ["unset", "torch's default"])
def test_the_run_points_torch_at_accel_folder_and_closing_puts_the_variable_back(tmp_path, monkeypatch, before):
    """No training (compiling happens on the first step): the variable is the run's from accelerate() on. torch's
    default folder is not a user's choice (torch writes it into the environment at its first look-up)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    value = None if before == "unset" else os.path.abspath(default_cache_dir())
    if value is None:
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    else:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", value)
    model, optimizer = tiny()
    run = accel.accelerate(model, optimizer, None, ["compile"], device="cpu")
    changes = run.report.row("compile").changes
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == changes["compile cache"] == os.path.abspath(tmp_path / "compile")
    assert changes["warm start"].startswith("no")
    run.close()
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == value


def test_a_plan_that_fails_after_compile_pointed_the_cache_puts_the_variable_back(tmp_path, monkeypatch):
    """torch.compile refuses an unknown inductor option in apply, after the cache folder was set: the rollback
    takes the variable back with everything else."""
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    model, optimizer = tiny()
    with pytest.raises(accel.AccelerateError, match="no_such_inductor_option"):
        accel.accelerate(model, optimizer, None, [{"compile": {"options": {"no_such_inductor_option": 1}}}],
                         device="cpu")
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_a_cache_folder_of_your_own_is_left_as_it_is(tmp_path, monkeypatch):
    mine = str(tmp_path / "mine")
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "accel"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", mine)
    model, optimizer = tiny()
    run = accel.accelerate(model, optimizer, None, ["compile"], device="cpu")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == mine
    assert run.report.row("compile").changes["compile cache"].startswith(f"{mine} (your TORCHINDUCTOR_CACHE_DIR")
    run.close()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == mine and not (tmp_path / "accel").exists()


def test_graph_caches_turned_off_are_said_and_left_off(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    # torch's own patch, not monkeypatch: undoing a monkeypatch deletes the setting from torch's config module
    with torch.compiler.config.patch(force_disable_caches=True):
        model, optimizer = tiny()
        run = accel.accelerate(model, optimizer, None, ["compile"], device="cpu")
        warm = run.report.row("compile").changes["warm start"]
        assert warm.startswith("off (torch.compiler.config.force_disable_caches is True)"), warm
        assert torch.compiler.config.force_disable_caches
        run.close()
    assert not torch.compiler.config.force_disable_caches


def test_a_setup_is_warm_only_once_graphs_were_written_after_its_first_run(tmp_path):
    """A run that stopped before its first step (nothing compiled) leaves its marker, but the next run of the
    setup is not called warm; once graph entries appear in the folder, it is."""
    facts = {"model": "Tiny abc", "compile": {"backend": "inductor"}}
    assert compile_cache.warm_before(tmp_path, facts) == (False, 0)  # first run: its marker is written
    assert compile_cache.warm_before(tmp_path, facts) == (False, 0)  # it compiled nothing
    (tmp_path / "aotautograd" / "akey" / "entry").mkdir(parents=True)  # what torch writes for a compiled step
    (tmp_path / "fxgraph" / "ab" / "fabkey").mkdir(parents=True)
    assert compile_cache.warm_before(tmp_path, facts) == (True, 2)
    assert compile_cache.warm_before(tmp_path, {**facts, "model": "Other def"}) == (False, 2)  # another setup


# A cache folder may be shared (ACCEL_CACHE_DIR on a cluster's disk): a symbolic link in place of compile/ or of one
# of its entries pointed torch's compiled kernels, accel's tag and markers, and `accel cache clear` at another folder.
# accel follows no link there: it says so in a warning naming the link, and torch keeps its graphs in its own folder.
@pytest.fixture
def elsewhere(tmp_path):
    """Another folder of compiled graphs, tagged as accel's (as accel once tagged a folder it reached by a link)."""
    other = tmp_path / "elsewhere"
    for name in ("fxgraph/ab/fabkey/entry", "accel-setups/marker.json", "notes.txt"):
        (other / name).parent.mkdir(parents=True, exist_ok=True)
        (other / name).write_bytes(b"x" * 100)
    (other / compile_cache.TAG).write_text(compile_cache.TAG_TEXT)
    return other


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in folder.rglob("*")}


def compile_run(cache: Path, monkeypatch, link: Path) -> dict[str, str]:
    """What the compile row says of its cache with accel's cache folder here, a link warned of and followed by no
    write; torch's own folder stays in use."""
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(cache))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    model, optimizer = tiny()
    with pytest.warns(UserWarning, match=f"{link} in compile's cache is a symbolic link"):
        run = accel.accelerate(model, optimizer, None, ["compile"], device="cpu")
    assert not os.environ.get("TORCHINDUCTOR_CACHE_DIR", "").startswith(str(cache))  # torch's default, or unset
    run.close()
    return run.report.row("compile").changes


def test_a_linked_compile_folder_is_neither_used_nor_cleared(tmp_path, elsewhere, monkeypatch, capsys):
    from accel.cli import main

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "compile").symlink_to(elsewhere)
    before = contents(elsewhere)
    changes = compile_run(cache, monkeypatch, cache / "compile")
    assert changes["compile cache"].startswith(f"torch's own ({cache / 'compile'} is a symbolic link"), changes
    with pytest.warns(UserWarning, match="symbolic link"):
        assert compile_cache.compile_usage(cache) == (0, 0)  # none of these files are accel's artifacts
    with pytest.warns(UserWarning, match="symbolic link"):
        assert compile_cache.clear_compile(cache) == (0, 0)  # nothing removed, none said to be
    with pytest.warns(UserWarning, match="symbolic link") as said:
        assert main(["cache", "clear"]) == 0
    assert len([w for w in said if "compile's cache is a symbolic link" in str(w.message)]) == 1  # said once
    out = capsys.readouterr().out
    assert f"left {cache / 'compile'} as it is: a symbolic link, not followed" in out, out  # not "no CACHEDIR.TAG"
    assert "removed compile's artifacts" not in out
    assert contents(elsewhere) == before and (cache / "compile").is_symlink()


@pytest.mark.parametrize("name", [compile_cache.TAG, compile_cache.MARKERS, "fxgraph"])
def test_a_linked_entry_in_the_compile_folder_keeps_torch_in_its_own(tmp_path, elsewhere, monkeypatch, name):
    """A linked tag would make another folder's word accel's, linked markers or graphs would be written there."""
    cache = tmp_path / "cache"
    (cache / "compile").mkdir(parents=True)
    if name != compile_cache.TAG:
        (cache / "compile" / compile_cache.TAG).write_text(compile_cache.TAG_TEXT)
    (cache / "compile" / name).symlink_to(elsewhere / name)
    before = contents(elsewhere)
    changes = compile_run(cache, monkeypatch, cache / "compile" / name)
    assert changes["compile cache"].startswith(f"torch's own ({cache / 'compile'} holds a symbolic link"), changes
    assert contents(elsewhere) == before


@pytest.mark.parametrize("name", [compile_cache.TAG, compile_cache.MARKERS])
def test_a_folder_with_a_linked_tag_or_markers_is_not_accels_to_clear(tmp_path, elsewhere, name):
    compiled = tmp_path / "compile"
    compiled.mkdir()
    (compiled / "yours.txt").write_text("yours")
    (compiled / name).symlink_to(elsewhere / name)
    assert not compile_cache.owns_compile_folder(tmp_path)
    assert compile_cache.clear_compile(tmp_path) == (0, 0)
    assert (compiled / "yours.txt").read_text() == "yours" and contents(elsewhere)


def test_a_cache_folder_you_name_by_a_link_is_used(tmp_path, monkeypatch):
    """The folder the user names (ACCEL_CACHE_DIR) may itself be a link: theirs to choose; accel follows none in it."""
    (tmp_path / "real").mkdir()
    (tmp_path / "named").symlink_to(tmp_path / "real")
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "named"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    model, optimizer = tiny()
    run = accel.accelerate(model, optimizer, None, ["compile"], device="cpu")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == os.path.abspath(tmp_path / "named" / "compile")
    run.close()
    assert (tmp_path / "real" / "compile" / compile_cache.TAG).is_file()
    assert compile_cache.clear_compile(tmp_path / "named")[0] >= 1 and not (tmp_path / "real" / "compile").exists()


def test_a_linked_marker_is_no_marker_and_is_replaced(tmp_path, elsewhere):
    """Another folder's marker, reached by a link, does not make this setup warm; this run's marker replaces it."""
    facts = {"model": "Tiny abc"}
    compile_cache.warm_before(elsewhere, facts)  # the other folder's marker of the same setup
    (marker,) = (elsewhere / compile_cache.MARKERS).glob("?" * 24 + ".json")
    (tmp_path / compile_cache.MARKERS).mkdir()
    (tmp_path / compile_cache.MARKERS / marker.name).symlink_to(marker)
    (tmp_path / "aotautograd" / "akey").mkdir(parents=True)
    before = marker.read_bytes()
    assert compile_cache.warm_before(tmp_path, facts) == (False, 1)
    assert not (tmp_path / compile_cache.MARKERS / marker.name).is_symlink() and marker.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root removes files from a read-only folder")
def test_clearing_says_only_what_was_removed(tmp_path):
    compiled = tmp_path / "compile"
    (compiled / "fxgraph" / "ab").mkdir(parents=True)
    (compiled / compile_cache.TAG).write_text(compile_cache.TAG_TEXT)
    (compiled / "fxgraph" / "ab" / "entry").write_bytes(b"x" * 100)
    (compiled / "fxgraph" / "ab").chmod(0o500)  # its entry cannot be removed
    try:
        assert compile_cache.clear_compile(tmp_path) == (1, len(compile_cache.TAG_TEXT))  # the tag only
    finally:
        (compiled / "fxgraph" / "ab").chmod(0o700)
    assert (compiled / "fxgraph" / "ab" / "entry").exists()
