"""Hostile plan files (the user's own path, maybe from a shared repository): nesting deeper than any parser's stack,
a byte-order mark, bytes that are no UTF-8, YAML's tags (python objects, binary, sets, timestamps), recursive
aliases and merges, numbers beyond floats and ints of thousands of digits, NUL and control characters, a homoglyph
of an accelerator's name. Each is a Plan or one PlanError, whose text stays short enough to read (the suite's
bound for a plan file's error, tests/faults/test_fault_hostile_files.py).

Found: an accelerator's name is repeated whole in the error (the names of options and their values are cut): a
name of 900,000 characters is a PlanError of 900,000 characters."""
import pytest

import accel
from accel.errors import PlanError

FILES = {
    "deep.yaml": "a: " + "[" * 50000 + "]" * 50000,
    "deep.toml": "a = " + "[" * 50000 + "]" * 50000,
    "deep-inline.toml": "a = " + "{b = " * 20000 + "1" + "}" * 20000,
    "bom.toml": "\ufeff[threads]\n",
    "not-utf8.yaml": b"threads: {threads: \xff}",
    "digits.toml": "[threads]\nthreads = " + "9" * 5000 + "\n",
    "digits.yaml": "threads: {threads: " + "9" * 5000 + "}\n",
    "nan.yaml": "grad_clipping: {max_norm: .nan}\n",
    "binary.yaml": "threads: !!binary aGVsbG8=\n",
    "set.yaml": "threads: !!set {a, b}\n",
    "timestamp.yaml": "threads: {threads: 2001-12-14}\n",
    "datetime.toml": "[threads]\nthreads = 1979-05-27T07:32:00Z\n",
    "recursive.yaml": "a: &a [*a]\n",
    "recursive-merge.yaml": "threads: &a {<<: *a}\n",
    "python.yaml": "threads: !!python/object/apply:os.system [echo hostile]\n",
    "list-key.yaml": "? [a]\n: 1\n",
    "homoglyph.yaml": "thr\u0435ads: {}\n",
    "nul.yaml": "threads: {}\x00\n",
    "exponent.yaml": "grad_clipping: {max_norm: 1e99999}\n",
    "long-option.yaml": "threads: {" + "b" * 900000 + ": 1}\n",
    "long-value.yaml": "amp: {dtype: " + "c" * 900000 + "}\n",
}
LIMIT = 5000


def read(tmp_path, name: str, text) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        accel.Plan(path)
    except PlanError as error:
        return str(error)
    return ""


@pytest.mark.parametrize("name", list(FILES))
def test_a_hostile_plan_file_is_a_plan_or_one_short_plan_error(tmp_path, name):
    assert len(read(tmp_path, name, FILES[name])) < LIMIT


@pytest.mark.parametrize("name, text", [("long-name.yaml", "? " + "a" * 900000 + "\n: 1\n"),
                                        ("long-name.toml", "[" + "a" * 900000 + "]\n")])
def test_an_accelerator_name_of_900_000_characters_is_a_short_plan_error(tmp_path, name, text):
    assert len(read(tmp_path, name, text)) < LIMIT
