"""Module paths moved by 0.3's layout (issue 24) still import until 0.4: each old path is the new module object
itself, warns once, and pickles naming a class by its old module still load. Nothing in accel imports an old path."""
import importlib
import pickle
import pickletools
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import accel
from accel._moved import MOVED, new_name

PACKAGE = Path(accel.__file__).parent


@pytest.fixture
def forgotten():
    """Old names dropped from sys.modules (and from their parents), put back as they were afterwards."""
    saved = {name: module for name, module in sys.modules.items() if new_name(name) is not None}
    for name in saved:
        del sys.modules[name]
    yield
    for name in [n for n in sys.modules if new_name(n) is not None]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_path_imports_warns_once_and_is_the_new_module(old, forgotten):
    with pytest.warns(DeprecationWarning, match=rf"{old} is {MOVED[old]} since 0\.3; the old path goes in 0\.4"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old]) and sys.modules[old] is module
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(old) is module  # once: the second import is the cached module


def test_a_moved_packages_submodules_move_with_it(forgotten):
    with pytest.warns(DeprecationWarning, match="accel.autotune is accel.search"):
        importlib.import_module("accel.autotune")
    with pytest.warns(DeprecationWarning, match="accel.autotune.inloop is accel.search.inloop"):
        inloop = importlib.import_module("accel.autotune.inloop")
    import accel.search.inloop
    assert inloop is accel.search.inloop
    with pytest.warns(DeprecationWarning, match="accel.autotune.results is accel.search.results"):
        from accel.autotune.results import TuneResult
    assert TuneResult is accel.TuneResult


def test_monkeypatching_through_the_old_path_patches_the_new_module(forgotten, monkeypatch):
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("accel.core")
    monkeypatch.setattr(old, "probe", "patched")
    assert accel.api.probe == "patched"


def test_the_warning_points_at_the_import_line(forgotten):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import accel.plancache  # noqa: F401
    assert [Path(w.filename).name for w in caught] == [Path(__file__).name]


def old_pickle(obj, old_module: str) -> bytes:
    """obj pickled as 0.2/0.3 would have named its class: from its old module."""
    data = pickle.dumps(obj, protocol=2)  # protocol 2 names the class by a GLOBAL opcode: module and name
    new = type(obj).__module__
    ops = [op for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL" and arg.startswith(new + " ")]
    assert ops, "the pickle names the class"
    return data.replace(f"{new}\n".encode(), f"{old_module}\n".encode())


def test_pickles_that_name_an_old_module_still_load(forgotten):
    from accel.run.report import Report, Row
    from accel.search.results import TuneResult

    plan = accel.Plan(["channels_last", {"grad_clipping": {"max_norm": 1.0}}])
    assert pickle.loads(old_pickle(plan, "accel.plan")).names() == plan.names()  # accel.plan: the plan's face
    report = Report(device="cpu", hardware="a CPU", rows=[Row("amp", "compute", "applied")])
    with pytest.warns(DeprecationWarning, match="accel.report is accel.run.report"):
        again = pickle.loads(old_pickle(report, "accel.report"))
    assert type(again) is Report and again.rows[0].name == "amp"
    result = TuneResult.__new__(TuneResult)
    with pytest.warns(DeprecationWarning, match="accel.autotune.results is accel.search.results"):
        assert type(pickle.loads(old_pickle(result, "accel.autotune.results"))) is TuneResult


def test_nothing_in_accel_imports_an_old_path():
    """Every module of accel imported in a fresh process, deprecation warnings as errors."""
    code = ("import pkgutil, importlib, accel\n"
            "for m in pkgutil.walk_packages(accel.__path__, 'accel.'):\n"
            "    if m.name not in ('accel.__main__',) and not m.name.startswith('accel.testing.'):\n"
            "        importlib.import_module(m.name)\n"
            "import accel.testing\n")
    out = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-W", "ignore::DeprecationWarning:nni",
                          "-c", code], capture_output=True, text=True, timeout=300, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-3000:]
