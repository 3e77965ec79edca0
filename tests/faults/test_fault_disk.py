"""Full disks (a tmpfs of a few hundred KiB, filled to a room hypothesis chooses) and odd names: a save that does
not fit says so with accel's error naming the disk, keeps the previous checkpoint whole and leaves no temporary
file; the plan cache warns and keeps what it had; a sharded save under fsdp raises an Exception a loop can catch
and leaves no .partial folder."""
import os
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from injectors import fill, objects, tmpfs, train
from scripts.launching import one_rank_env

import accel
import accel.search.cache as plancache
from accel.errors import CheckpointError
from accel.files import PREFIX


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((PREFIX, ".step-")))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(room=st.integers(0, 80_000))
def test_a_save_on_a_full_disk_says_so_and_keeps_the_previous_checkpoint(room):
    with tmpfs("400k") as disk:
        model, optimizer, loader = objects()
        run = accel.accelerate(model, optimizer, loader, plan=[], device="cpu")
        run.save(disk / "ckpt.pt")
        train(run)
        fill(disk, room)
        try:
            run.save(disk / "ckpt.pt")
        except CheckpointError as error:
            assert f"{disk / 'ckpt.pt'}: could not be written (the disk is full;" in str(error)
            assert "free of" in str(error) and "the previous checkpoint there, if any, is kept" in str(error)
            expected = 0
        else:
            expected = 2
        assert leftovers(disk) == []
        assert run.load(disk / "ckpt.pt")["step"] == expected  # the old one whole, or the new one whole
        run.close()


def test_the_plan_cache_on_a_full_disk_warns_and_keeps_what_it_had():
    with tmpfs("64k") as disk:
        facts = {"model": "m"}
        plancache.store(facts, {"plan": {"amp": {}}, "why": "first"}, disk)
        fill(disk, 0)
        with pytest.warns(UserWarning, match="cannot be written"):
            assert plancache.store(facts, {"plan": {"amp": {}}, "why": "second " * 5000}, disk) == ""
        assert plancache.lookup(facts, disk)["why"] == "first" and leftovers(disk) == []


def test_a_sharded_save_on_a_full_disk_raises_an_exception_and_leaves_no_partial_folder(monkeypatch):
    """DCP raises CheckpointException, a BaseException: `except Exception` around run.save did not catch it."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters())
    run = accel.accelerate(model, optimizer, None, plan=["fsdp"], device="cpu")
    try:
        run.backward(run.model(torch.randn(4, 64)).sum())
        run.step()
        with tmpfs("1m") as disk:
            run.save(disk / "ckpt")
            whole = (disk / "ckpt" / "latest").read_text()
            run.backward(run.model(torch.randn(4, 64)).sum())
            run.step()
            fill(disk, 4096)
            try:
                run.save(disk / "ckpt")
            except Exception as error:  # noqa: BLE001 (what a loop catches)
                assert isinstance(error, CheckpointError) and "the disk is full" in str(error), error
            else:
                pytest.fail("the save fitted on a full disk")
            assert (disk / "ckpt" / "latest").read_text() == whole and leftovers(disk / "ckpt") == []
            assert run.load(disk / "ckpt")["step"] == 1
    finally:
        run.close()


@pytest.mark.parametrize("name", ["c" * 197 + ".pt", "c" * 241 + ".pt", "c" * 252 + ".pt", "with spaces.pt",
                                  "ünïcødé ✓.pt", "new\nline", ".hidden", "-dash.pt"])
def test_any_name_the_os_accepts_saves_and_loads(tmp_path, name):
    """The temporary file was named after the checkpoint plus a suffix: names of 244+ characters failed."""
    path = tmp_path / name
    model, optimizer, loader = objects()
    run = accel.accelerate(model, optimizer, loader, plan=[], device="cpu")
    train(run)
    run.save(path)
    assert run.load(path)["step"] == 2 and os.listdir(tmp_path) == [path.name]
    run.close()


def test_a_read_only_cache_folder_leaves_the_plan_cache_warning_and_nothing_else(read_only_folder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert plancache.store({"model": "m"}, {"plan": {}}, read_only_folder / "plans") == ""
    assert any("cannot be written" in str(w.message) for w in caught)
    assert plancache.lookup({"model": "m"}, read_only_folder / "plans") is None


def test_compile_with_a_read_only_cache_folder_applies_as_torch_compile_does(read_only_folder, monkeypatch):
    """Inductor's cache was pointed at accel's folder unconditionally: plan=["compile"] failed to apply."""
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(read_only_folder / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    try:
        run = accel.accelerate(*objects(), plan=["compile"], device="cpu")
    except accel.PlanError as error:
        pytest.skip(f"compile cannot run here: {error}")
    try:
        row = run.report.row("compile")
        assert row.status == "applied" and row.changes["compile cache"].startswith("torch's own"), row
        assert "cannot be written" in row.changes["compile cache"]
        assert str(read_only_folder) not in os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    finally:
        run.close()
