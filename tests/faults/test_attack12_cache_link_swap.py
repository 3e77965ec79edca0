"""Attack 12: the plan cache kept warm-ups in a ``warmups`` subfolder, asked whether it was a link (is_symlink) and
used the path after: a ``warmups`` replaced by a link in between (another process sharing the cache) pointed `accel
cache clear` at another folder, whose accel-named files it removed. Warm-ups are now entries of the cache folder
itself (``warmup-<key>.json``): a ``warmups`` swapped in at the moment clear lists the folder is never followed. The
swap is timed by a profile hook at the listing's call (Path.glob)."""
import sys
from pathlib import Path

import accel.search.cache as plancache

FACTS = {"model": "the same setup", "batch": "float32[16, 8]", "device": "cpu", "cpu": "x", "versions": "v"}
COMPILE = {"compile": {}}


def files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_warmups_folder_swapped_for_a_link_while_clear_lists_is_not_cleared_through(tmp_path):
    elsewhere, cache = tmp_path / "elsewhere", tmp_path / "cache"
    for folder in (elsewhere, cache):
        plancache.remember_warmup(FACTS, COMPILE, 12.0, folder)
        plancache.store(FACTS, {"plan": {"channels_last": {}}}, folder)
    (cache / "warmups").mkdir(exist_ok=True)  # where warm-ups were kept, or a folder of the user's
    before = files(elsewhere)

    def swap(frame, event, arg):
        if event == "call" and frame.f_code is Path.glob.__code__ and not (cache / "warmups").is_symlink():
            (cache / "warmups").rename(tmp_path / "moved")
            (cache / "warmups").symlink_to(elsewhere)

    sys.setprofile(swap)
    try:
        assert plancache.clear(cache) == 2  # the cache's own choice and warm-up
    finally:
        sys.setprofile(None)
    assert (cache / "warmups").is_symlink()  # the swap happened
    assert files(elsewhere) == before and plancache.known_warmup(FACTS, COMPILE, elsewhere) == 12.0
