"""Attack 12: the plan cache follows no symbolic link inside its folder, but it asks first (``_linked``: is_symlink)
and uses the path after: a ``warmups`` folder replaced by a link in between (another process sharing the cache) still
pointed `accel cache clear` at another folder, whose accel-named files it removed. The swap is timed here by a
profile hook at the removal's call, after the check."""
import sys

import pytest

import accel.search.cache as plancache

FACTS = {"model": "the same setup", "batch": "float32[16, 8]", "device": "cpu", "cpu": "x", "versions": "v"}
COMPILE = {"compile": {}}


def files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.xfail(strict=True, reason="accel/search/cache.py (not this session's to edit): _warmups checks "
                   "is_symlink() and then _remove globs and unlinks through the path; the fix: open the folder once "
                   "with os.open(O_RDONLY | O_DIRECTORY | O_NOFOLLOW) and list and unlink through that descriptor "
                   "(os.scandir(fd), os.unlink(name, dir_fd=fd)), and read an entry with O_NOFOLLOW")
def test_a_warmups_folder_swapped_for_a_link_after_its_check_is_not_cleared_through(tmp_path):
    elsewhere, cache = tmp_path / "elsewhere", tmp_path / "cache"
    plancache.remember_warmup(FACTS, COMPILE, 12.0, elsewhere)
    plancache.remember_warmup(FACTS, COMPILE, 12.0, cache)
    before = files(elsewhere / "warmups")

    def swap(frame, event, arg):
        removing = event == "call" and frame.f_code is plancache._remove.__code__
        if removing and frame.f_locals["folder"].name == "warmups" and not (cache / "warmups").is_symlink():
            (cache / "warmups").rename(tmp_path / "moved")
            (cache / "warmups").symlink_to(elsewhere / "warmups")

    sys.setprofile(swap)
    try:
        plancache.clear(cache)
    finally:
        sys.setprofile(None)
    assert (cache / "warmups").is_symlink()  # the swap happened
    assert files(elsewhere / "warmups") == before
