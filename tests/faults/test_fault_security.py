"""Nothing let in: a checkpoint or a cache entry makes accel import nothing, and run nothing, that your own code did
not name. A checkpoint's plan names functions as ``{"__callable__": "module:name"}``; accel used to import that
module (running its top-level code) through saved_plan(path) and through run.load under plan="auto"."""
import sys
import uuid

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from injectors import objects

import accel
import accel.search.cache as plancache
from accel.errors import CheckpointError
from accel.run.checkpoint import checksum, resolve
from accel.run.state import saved_plan

NOT_IMPORTED_STDLIB = ("this", "turtledemo.minimal_hanoi", "idlelib.idle_test.mock_tk")  # print or touch when imported


def loss_here(output, target):  # an importable function of this module: found, never imported
    return torch.nn.functional.cross_entropy(output, target)


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module on sys.path, not imported, whose top-level code leaves a file: the proof that it ran."""
    name = f"planted_{uuid.uuid4().hex[:8]}"
    proof = tmp_path / "it ran"
    (tmp_path / f"{name}.py").write_text(f"open({str(proof)!r}, 'w').close()\ndef loss(o, t):\n    return o.sum()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, proof
    sys.modules.pop(name, None)


def saved(tmp_path, plan=()):
    model, optimizer, loader = objects()
    run = accel.accelerate(model, optimizer, loader, plan=list(plan), device="cpu")
    run.save(tmp_path / "ckpt.pt")
    run.close()
    return tmp_path / "ckpt.pt"


def crafted(path, **replace):
    """The checkpoint with parts replaced, its checksum made to match (anyone can compute it: it is not a seal)."""
    state = torch.load(path, weights_only=True)
    state.update(replace)
    state["checksum"] = checksum(state)
    torch.save(state, path)
    return path


def test_a_checkpoint_naming_a_module_never_imports_it(tmp_path, planted):
    name, proof = planted
    path = crafted(saved(tmp_path), plan={"grad_clipping": {"max_norm": 1.0},
                                          "prune": {"loss_fn": {"__callable__": f"{name}:loss"}}})
    with pytest.raises(CheckpointError, match=f"its module '{name}' is not imported, and accel imports nothing"):
        saved_plan(path)
    assert not proof.exists() and name not in sys.modules


def test_run_load_under_auto_imports_nothing_a_checkpoint_names(tmp_path, planted):
    name, proof = planted
    path = crafted(saved(tmp_path), plan={"prune": {"loss_fn": {"__callable__": f"{name}:loss"}}})
    model, optimizer, loader = objects()
    run = accel.accelerate(model, optimizer, loader, plan=accel.Auto(cache=False), device="cpu")
    try:
        with pytest.raises(CheckpointError):
            run.load(path)
    finally:
        run.close()
    assert not proof.exists() and name not in sys.modules


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(module=st.sampled_from(("planted", *NOT_IMPORTED_STDLIB, "os", "subprocess", "builtins", "accel.cli.demo")),
       qualname=st.sampled_from(("loss", "system", "run", "main", "Popen.__init__", "x.y.z", "<lambda>", "")),
       where=st.sampled_from(("option", "list", "nested")))
def test_no_reference_in_a_checkpoint_imports_or_reaches_anything_but_your_functions(tmp_path, planted, module,
                                                                                     qualname, where):
    name, proof = planted
    module = name if module == "planted" else module
    before = set(sys.modules)
    reference = {"__callable__": f"{module}:{qualname}"}
    value = {"option": reference, "list": [1, reference], "nested": {"a": {"b": reference}}}[where]
    path = crafted(saved(tmp_path) if not (tmp_path / "ckpt.pt").exists() else tmp_path / "ckpt.pt",
                   plan={"prune": {"loss_fn": value}})
    with pytest.raises(CheckpointError):
        saved_plan(path)  # a function of the standard library (os.system, subprocess.run) is never handed out
    assert not proof.exists() and not (set(sys.modules) - before) & {module, name}


def test_your_own_functions_are_found_without_importing_or_running_anything(monkeypatch, tmp_path):
    assert resolve(f"{__name__}:loss_here") is loss_here
    assert resolve("torch.nn.functional:cross_entropy") is torch.nn.functional.cross_entropy
    proof = tmp_path / "getattr ran"
    lazy = type(sys)("lazy_module_of_yours")

    def __getattr__(attribute):  # a lazy module (transformers' kind) imports in its __getattr__
        proof.touch()
        return loss_here

    lazy.__getattr__ = __getattr__
    lazy.alias = loss_here  # reached through another name: not the function defined there
    monkeypatch.setitem(sys.modules, "lazy_module_of_yours", lazy)
    assert resolve("lazy_module_of_yours:anything") is None and not proof.exists()
    assert resolve("lazy_module_of_yours:alias") is None
    assert resolve("os:system") is None and resolve("subprocess:run") is None  # the standard library: never
    assert resolve("accel.cli.launch:supervise") is None  # nor accel's own (found by the test above, once imported)


def test_a_checkpoint_plan_that_would_run_a_program_is_refused(tmp_path):
    path = crafted(saved(tmp_path), plan={"compile": {"options": {"cpp.cxx": [str(tmp_path / "not-a-compiler")]}}})
    with pytest.raises(CheckpointError, match="sets compile.options .* only from your own code"):
        saved_plan(path)


def test_a_cache_entry_that_would_run_a_program_is_not_taken(tmp_path):
    facts = {"model": "m", "settings": {}}
    key = plancache.store(facts, {"plan": {"compile": {}}, "why": "measured"}, tmp_path)
    assert plancache.lookup(facts, tmp_path)["plan"] == {"compile": {}}
    entry = (tmp_path / f"{key}.json")
    entry.write_text(entry.read_text().replace('"compile": {}', '"compile": {"options": {"cpp.cxx": "/tmp/x"}}'))
    assert plancache.lookup(facts, tmp_path) is None  # measured again, never applied
    assert plancache.entries(tmp_path)[0]["why"] == "unreadable entry"
