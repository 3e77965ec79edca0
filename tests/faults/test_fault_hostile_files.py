"""Hostile files, generated: a checkpoint whose parts are anything torch can load (its checksum made to match), a
plan file of any YAML, a cache entry of any JSON. Each is read or refused with accel's own error, naming the file,
and a refused load changes nothing; no file makes accel raise anything else, hang, or grow without bound."""
import json
import os
import string
import subprocess
import sys

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from injectors import objects, train

import accel
import accel.search.cache as plancache
from accel.errors import CheckpointError, PlanError
from accel.run.checkpoint import checksum
from accel.run.state import saved_plan
from accel.testing import snapshot

KEYS = ("plan", "model", "optimizer", "optimizer_class", "accelerators", "step", "optimizer_steps", "epoch", "sampler",
        "loader_generators", "rng", "world_size", "accelerators_per_rank", "format")
TENSORS = [torch.zeros(0), torch.ones(3, dtype=torch.uint8), torch.arange(5)]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 2**40), st.floats(allow_nan=True),
                    st.text(string.printable, max_size=12), st.sampled_from(TENSORS))
NAMES = st.text(string.ascii_lowercase, max_size=6)
PLAIN = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                                      st.dictionaries(NAMES, inner, max_size=4)), max_leaves=12)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def places(value, path=(), depth=3):
    """Every place in a nested state, down to depth: where a part can be replaced."""
    yield path
    if depth and isinstance(value, dict):
        for key in list(value)[:6]:
            yield from places(value[key], (*path, key), depth - 1)
    elif depth and isinstance(value, (list, tuple)):
        for index in range(min(len(value), 3)):
            yield from places(value[index], (*path, index), depth - 1)


def replaced(state, path, new):
    if not path:
        return new
    copy = list(state) if isinstance(state, (list, tuple)) else dict(state)
    copy[path[0]] = replaced(state[path[0]], path[1:], new)
    return type(state)(copy) if isinstance(state, tuple) else copy


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    model, optimizer, loader = objects()
    run = accel.accelerate(model, optimizer, loader, plan={"grad_clipping": {"max_norm": 1.0}}, device="cpu")
    train(run)
    run.save(folder / "real.pt")
    run.close()
    return torch.load(folder / "real.pt", weights_only=True)


@SETTINGS
@given(data=st.data(), new=PLAIN)
def test_any_part_of_a_checkpoint_replaced_is_loaded_or_refused_by_name(real_checkpoint, tmp_path, data, new):
    state = real_checkpoint
    path = data.draw(st.sampled_from([p for p in places(state) if p and p[0] in KEYS]))
    hostile = replaced(state, path, new)
    if isinstance(hostile, dict):
        hostile["checksum"] = checksum(hostile) if isinstance(hostile, dict) else None
    torch.save(hostile, tmp_path / "hostile.pt")
    model, optimizer, loader = objects(seed=1)
    run = accel.accelerate(model, optimizer, loader, plan={"grad_clipping": {"max_norm": 1.0}}, device="cpu")
    before = snapshot(model, optimizer)
    try:
        try:
            saved_plan(tmp_path / "hostile.pt")
        except CheckpointError as error:
            assert "hostile.pt" in str(error) and len(str(error)) < 2000
        try:
            run.load(tmp_path / "hostile.pt")
        except CheckpointError as error:
            assert "hostile.pt" in str(error) and len(str(error)) < 2000
            assert before.changes(snapshot(model, optimizer)) == [] and run.steps == 0
    finally:
        run.close()


def test_a_checkpoint_that_unfolds_to_billions_is_refused_at_once(real_checkpoint, tmp_path):
    """pickle's shared references: 30 levels of a list holding one list ten times, a few hundred bytes."""
    bomb = ["x"]
    for _ in range(30):
        bomb = [bomb] * 10
    deep = []
    for _ in range(400):  # deeper than any walk of accel's may recurse (pickle itself saves it)
        deep = [deep]
    for part, name in ((bomb, "sampler"), (deep, "accelerators"), (bomb, "plan")):
        hostile = {**real_checkpoint, name: part}
        hostile["checksum"] = "0"
        torch.save(hostile, tmp_path / "bomb.pt")
        with pytest.raises(CheckpointError, match="unfolds to more than|nests deeper"):
            saved_plan(tmp_path / "bomb.pt")


YAML_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 100), st.sampled_from(
    ["amp", "threads", "compile", "bf16", "fp16", "auto", "nope", "grad_clipping", "loader"]))
YAML_PLANS = st.recursive(YAML_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(YAML_SCALARS.filter(lambda v: v is not None), inner, max_size=4)),
    max_leaves=10)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=YAML_PLANS, twice=st.booleans())
def test_any_yaml_plan_file_is_a_plan_or_one_plan_error(tmp_path, spec, twice):
    text = yaml.safe_dump(spec)
    if twice and isinstance(spec, dict) and spec:  # the same key again, as a person editing the file may write it
        text += yaml.safe_dump({next(iter(spec)): None})
    (tmp_path / "plan.yaml").write_text(text)
    try:
        accel.Plan(tmp_path / "plan.yaml")
    except PlanError as error:
        assert len(str(error)) < 5000
    else:
        assert not (twice and isinstance(spec, dict) and spec), "a key given twice was accepted"


BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"] + [
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi")]) + "\n"


def test_a_yaml_alias_bomb_is_one_plan_error_in_bounded_memory(tmp_path):
    """349 bytes that unfold to 9**9 strings: the error used to repr() the unfolded value (MemoryError)."""
    (tmp_path / "bomb.yaml").write_text(BOMB)
    (tmp_path / "list.yaml").write_text(BOMB.replace("i: &i", "accelerators: &i"))
    for name in ("bomb.yaml", "list.yaml"):
        with pytest.raises(PlanError, match="unfolds to more than") as refused:
            accel.Plan(tmp_path / name)
        assert len(refused.value.problems) == 1


def test_a_yaml_plan_naming_an_accelerator_twice_is_refused_as_the_list_and_toml_are(tmp_path):
    (tmp_path / "twice.yaml").write_text("amp: {dtype: bf16}\ngrad_clipping: {max_norm: 1.0}\namp: {dtype: fp16}\n")
    with pytest.raises(PlanError, match=r"'amp' is given twice \(line 3\)"):
        accel.Plan(tmp_path / "twice.yaml")
    (tmp_path / "options.yaml").write_text("amp: {dtype: bf16, dtype: fp16}\n")
    with pytest.raises(PlanError, match="'dtype' is given twice"):
        accel.Plan(tmp_path / "options.yaml")
    (tmp_path / "merge.yaml").write_text("base: &base {max_norm: 1.0}\ngrad_clipping: {<<: *base, max_norm: 2.0}\n")
    with pytest.raises(PlanError, match="base: unknown accelerator"):  # a merge may be overridden, as YAML says
        accel.Plan(tmp_path / "merge.yaml")
    (tmp_path / "twice.toml").write_text("[amp]\ndtype = 'bf16'\n[amp]\ndtype = 'fp16'\n")
    with pytest.raises(PlanError, match="cannot be read"):
        accel.Plan(tmp_path / "twice.toml")


JSON_KEYS = st.sampled_from(["key", "result", "plan", "seconds", "why", "amp", "compile", "x"])
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)),
                    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(JSON_KEYS, inner, max_size=4)),
                    max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=JSON, where=st.sampled_from(["whole", "result", "plan", "key"]))
def test_any_json_cache_entry_is_listed_and_looked_up_without_a_traceback(tmp_path, entry, where):
    facts = {"model": "m"}
    valid = {"key": facts, "result": {"plan": {"amp": {}}, "why": "measured", "seconds": 1.0}}
    hostile = entry if where == "whole" else (
        {**valid, where: entry} if where == "key" else
        {**valid, "result": entry if where == "result" else {**valid["result"], "plan": entry}})
    name = f"{plancache.key_of(facts)}.json"
    (tmp_path / name).write_text(json.dumps(hostile))
    plancache.remember_warmup(facts, {"compile": {}}, 1.0, tmp_path)  # then hostile, under the name it took
    (warmup,) = tmp_path.glob(f"{plancache.WARMUP}*.json")
    warmup.write_text(json.dumps(hostile))
    found = plancache.lookup(facts, tmp_path)
    assert found is None or isinstance(found["plan"], dict)
    seconds = plancache.known_warmup(facts, {"compile": {}}, tmp_path)
    assert seconds is None or seconds >= 0
    assert [e["key"] for e in plancache.entries(tmp_path)] == [name[:-5]]


def test_accel_cache_list_survives_entries_of_every_shape(tmp_path):
    for index, text in enumerate(["null", "[]", '"a string"', '{"key": [1], "result": {"plan": []}}', "{",
                                  '{"key": {}, "result": {"plan": {"amp": {}}, "measured_at": [1], "why": {}}}']):
        (tmp_path / f"{index:024x}.json").write_text(text)
    done = subprocess.run([sys.executable, "-m", "accel", "cache", "list"], capture_output=True, text=True,
                          env={**os.environ, "ACCEL_CACHE_DIR": str(tmp_path)}, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "6 remembered plan(s)" in done.stdout
