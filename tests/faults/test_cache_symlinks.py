"""A plan cache folder may be shared (ACCEL_CACHE_DIR on a cluster's disk): a symbolic link in it, in place of an
entry or of the ``warmups`` folder warm-ups were once kept in, pointed accel's reads, writes and `accel cache clear` at
another folder (here another cache's, whose files bear accel's names). accel follows no link inside its cache: each
entry's is said in a warning naming it, and the search goes on without what it would have read there (the folder the
user names may itself be a link: that is theirs to choose)."""
import errno

import pytest

import accel.search.cache as plancache
from accel.cli import main
from accel.files import read_small

FACTS = {"model": "the same setup", "batch": "float32[16, 8]", "device": "cpu", "cpu": "x", "versions": "v"}
COMPILE = {"compile": {}}


def files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def elsewhere(tmp_path):
    """Another cache folder with a warm-up and an entry of its own, as accel wrote them."""
    other = tmp_path / "elsewhere"
    plancache.remember_warmup(FACTS, COMPILE, 12.0, other)
    plancache.store(FACTS, {"plan": {"channels_last": {}}}, other)
    assert plancache.known_warmup(FACTS, COMPILE, other) == 12.0
    return other


@pytest.mark.parametrize("subfolder", ["link", "folder"])
def test_a_warmups_subfolder_is_neither_read_written_nor_cleared(tmp_path, elsewhere, monkeypatch, subfolder):
    """Warm-ups are entries of the cache folder itself (no subfolder to swap): a ``warmups`` there, a link to another
    cache or a folder of accel-named files (where warm-ups once were), is no part of accel's cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    if subfolder == "link":
        (cache / "warmups").symlink_to(elsewhere)
    else:
        (cache / "warmups").mkdir()
        for name, text in files(elsewhere).items():
            (cache / "warmups" / name).write_bytes(text)
    before = files(cache / "warmups")
    assert plancache.known_warmup(FACTS, COMPILE, cache) is None  # the guess, not the other folder's 12 s
    plancache.remember_warmup(FACTS, COMPILE, 40.0, cache)
    assert plancache.known_warmup(FACTS, COMPILE, cache) == 40.0 and plancache.entries(cache) == []
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(cache))
    assert main(["cache", "clear"]) == 0
    assert files(cache / "warmups") == before and sorted(p.name for p in cache.iterdir()) == ["warmups"]


@pytest.mark.parametrize("kind", ["", plancache.WARMUP])
def test_a_linked_entry_is_not_read_and_a_store_replaces_the_link(tmp_path, elsewhere, kind):
    cache = tmp_path / "cache"
    cache.mkdir()
    facts = plancache._warmup(FACTS, COMPILE) if kind else FACTS
    name = f"{kind}{plancache.key_of(facts)}.json"
    (cache / name).symlink_to(elsewhere / name)
    before = files(elsewhere)
    with pytest.warns(UserWarning, match=f"{cache / name} in the plan cache is a symbolic link"):
        assert plancache.lookup(facts, cache, kind) is None
    plancache.store(facts, {"plan": {"threads": {}}}, cache, kind=kind)
    assert not (cache / name).is_symlink() and plancache.lookup(facts, cache, kind)["plan"] == {"threads": {}}
    assert files(elsewhere) == before


def test_an_entry_swapped_for_a_link_after_accel_looked_is_not_read(tmp_path, elsewhere, monkeypatch):
    """Another writer of a shared cache replaces an entry with a link between accel's look at it and its read: the
    read followed it (the look was ``is_symlink()``, then the open). The open itself now refuses a link."""
    cache = tmp_path / "cache"
    name = f"{plancache.key_of(FACTS)}.json"
    plancache.store(FACTS, {"plan": {"threads": {}}}, cache)
    read_small = plancache.read_small

    def swapped_then_read(path, limit):  # the other writer's moment: just before the open
        if path.name == name and not path.is_symlink():
            path.unlink()
            path.symlink_to(elsewhere / name)
        return read_small(path, limit)

    monkeypatch.setattr(plancache, "read_small", swapped_then_read)
    with pytest.warns(UserWarning, match=f"{cache / name} in the plan cache is a symbolic link"):
        assert plancache.lookup(FACTS, cache) is None  # not the other cache's channels_last


def test_a_small_file_read_refuses_a_link_whatever_it_points_at(tmp_path):
    """accel.files.read_small (plan cache entries, compile's markers and tag, a sharded checkpoint's latest)."""
    target = tmp_path / "target"
    target.write_text("step-1\n")
    for link, to in ((tmp_path / "link", target), (tmp_path / "dangling", tmp_path / "nothing")):
        link.symlink_to(to)
        with pytest.raises(OSError, match="a symbolic link, not followed") as refused:
            read_small(link)
        assert refused.value.errno == errno.ELOOP
    assert read_small(target) == b"step-1\n"
