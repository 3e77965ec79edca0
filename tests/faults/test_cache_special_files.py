"""Files in the plan cache folder that bear an entry's name but are not regular files of a plan's size: a named pipe,
a file of a terabyte (sparse: it takes no room), a folder. A cache folder may be shared (ACCEL_CACHE_DIR on a
cluster's disk, two jobs writing one entry): what lies in it is a hostile file like any other, which the contract
says gets accel's own answer, never a hang, a traceback or all the memory. accel/search/cache.py reads an entry
whole with Path.read_text() (a pipe blocks it for ever, a terabyte is one allocation; a symlink to /dev/zero reads
until memory runs out), and ``clear`` unlinks whatever matches the name (a folder raises IsADirectoryError)."""
import os
import threading

import pytest

import accel.search.cache as plancache
from accel.cli import main

FACTS = {"model": "the same setup", "settings": {}}
NAME = "0123456789abcdef01234567.json"  # an entry's name (cache.ENTRY)


def kept(folder) -> str:
    """A real entry beside the hostile file: its key."""
    return plancache.store(FACTS, {"plan": {"channels_last": {}}}, folder)


def test_a_named_pipe_with_an_entry_name_is_listed_unreadable_without_waiting(tmp_path):
    key = kept(tmp_path)
    pipe = tmp_path / NAME
    os.mkfifo(pipe)
    listed: list = []
    reader = threading.Thread(target=lambda: listed.extend(plancache.entries(tmp_path)), daemon=True)
    reader.start()
    reader.join(timeout=60)  # a busy machine may take seconds; a pipe waits for ever
    if reader.is_alive():  # set the reader free: open the pipe's other end and close it (end of file)
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=5)
        pytest.fail("accel waited on a named pipe in the cache folder")
    assert {e["key"]: e["plan"] for e in listed} == {key: {"channels_last": {}}, NAME[:-5]: None}


def test_a_terabyte_file_with_an_entry_name_is_listed_unreadable(tmp_path):
    key = kept(tmp_path)
    with open(tmp_path / NAME, "wb") as huge:
        huge.truncate(1 << 40)  # sparse: no room taken
    listed = {e["key"]: e["plan"] for e in plancache.entries(tmp_path)}
    assert listed == {key: {"channels_last": {}}, NAME[:-5]: None}


def test_accel_cache_clear_with_a_folder_named_as_an_entry_removes_the_entries_and_leaves_the_folder(tmp_path,
                                                                                                     monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    (tmp_path / NAME).mkdir()
    (tmp_path / NAME / "yours.txt").write_text("yours")
    kept(tmp_path)
    assert main(["cache", "clear"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME]
    assert (tmp_path / NAME / "yours.txt").read_text() == "yours"


def test_accel_cache_clear_with_a_terabyte_tag_in_compile_leaves_that_folder_and_clears_the_entries(tmp_path,
                                                                                                    monkeypatch):
    from accel.accelerators.compile.cache import TAG

    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    (tmp_path / "compile").mkdir()
    with open(tmp_path / "compile" / TAG, "wb") as huge:
        huge.truncate(1 << 40)
    kept(tmp_path)
    assert main(["cache", "clear"]) == 0
    assert plancache.entries(tmp_path) == [] and (tmp_path / "compile" / TAG).exists()


def test_accel_cache_clear_with_a_named_pipe_as_compiles_tag_answers(tmp_path, monkeypatch):
    from accel.accelerators.compile.cache import TAG

    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    (tmp_path / "compile").mkdir()
    os.mkfifo(tmp_path / "compile" / TAG)
    answered: list = []
    clearing = threading.Thread(target=lambda: answered.append(main(["cache", "clear"])), daemon=True)
    clearing.start()
    clearing.join(timeout=60)  # a busy machine may take seconds; a pipe waits for ever
    if clearing.is_alive():
        os.close(os.open(tmp_path / "compile" / TAG, os.O_WRONLY | os.O_NONBLOCK))
        clearing.join(timeout=5)
        pytest.fail("accel cache clear waited on a named pipe")
    assert answered == [0]
