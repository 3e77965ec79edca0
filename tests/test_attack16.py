"""Attack 16: today's late changes from outside, each a test that failed before its fix.

- files.left_over (accel cache clear, and every write's clean-up) read a temporary's process id with str.isdigit:
  a name in a shared cache folder with a digit of another script ('²') or beyond a process id's range raised
  ValueError / OverflowError out of `accel cache clear` and out of every write of that entry (a plan's answer lost).
- A write of this process held its temporary by its Path: the same folder spelled otherwise (relative, through a
  link) by clear() in another thread was not the same Path, so clear removed the temporary being written and the
  write failed.
- A folder named like a dead writer's temporary stopped a write's clean-up at the first unlink (EISDIR, suppressed
  whole): the dead writers' files after it stayed forever.
- A cached answer's row whose ratio estimate is no number (a string, a list) passed from_dict's kind check (it checks
  a field's own kind, not inside its dict) and the table's printing, and raised TypeError out of run.report.to_dict()
  (the ablation divides by the estimate): cached_answer now takes the entry only if its numbers come out too.
- A plan file one byte over read_small's limit was refused as '1.0 MiB, more than the 1.0 MiB expected', and a plan
  path naming a named pipe or a device (refused unread, rightly) was said to be 'not found'.
- Your own kind of compiled model (an OptimizedModule subclass) around a plan's wrapper became torch's own kind
  (be18cf9): a __call__ of its own, which is what your training runs, was dropped silently (its model computed
  something else); now the wrapper is made as your compile made yours (dynamo_ctx(model)) and is your kind again.
- read_small cut a file whose read gave more than its size said (it grew meanwhile; /proc's files say 0) at the limit
  and returned the cut bytes as the whole file.
- nni_quiet from two threads at once (two prunes) restored NNI's logger in the wrong order: the last to leave put
  back the first's routing (NNI's logger sent to accel's, at WARNING, for the rest of the process), and the first to
  leave put NNI's stdout handler back while the other was still pruning.
- NNI's log routed to accel's raised out of NNI's own call where a record could not be formatted (a logging handler
  reports that, as NNI's own did, and the prune goes on)."""
from __future__ import annotations

import logging
import threading

import pytest
import torch
import torch._dynamo

import accel
import accel.search.cache as plancache
from accel.accelerators.prune.speedup import nni_quiet
from accel.files import HOST, PREFIX, SUFFIX, _tag, temporary_name, write_atomically, write_text
from accel.plan.contract import Accelerator, Stage
from accel.testing import tiny_loader, tiny_model, tiny_optimizer


def _temporary(folder, name: str, pid: str):
    return folder / f"{PREFIX}{_tag(name)}-{HOST}-{pid}-0123abcd{SUFFIX}"


@pytest.mark.parametrize("pid", ["²", "9" * 30])
def test_an_odd_process_id_in_a_temporarys_name_is_no_crash(tmp_path, pid):
    odd = _temporary(tmp_path, "entry.json", pid)
    odd.write_text("")
    write_text(tmp_path / "entry.json", "{}")  # raised ValueError / OverflowError from the clean-up
    assert (tmp_path / "entry.json").read_text() == "{}"
    plancache.clear(tmp_path)  # likewise
    assert (tmp_path / "entry.json").exists()


def test_a_write_survives_clear_of_its_folder_spelled_otherwise(tmp_path, monkeypatch):
    (tmp_path / "cache").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    removed = []

    def write(file):
        file.write(b"{}")
        for spelling in ("link", tmp_path / "cache"):  # another thread clears the folder, as it names it
            clearing = threading.Thread(target=lambda: removed.append(plancache.clear(spelling)))
            clearing.start()
            clearing.join()

    write_atomically("cache/entry.json", write)  # FileNotFoundError: clear had removed its temporary
    assert (tmp_path / "cache" / "entry.json").read_text() == "{}" and removed == [0, 0]


def test_a_folder_named_like_a_temporary_stops_no_clean_up(tmp_path):
    dead = []
    for number in range(20):  # interleaved: whatever order the folder lists them in, a file follows a folder
        _temporary(tmp_path, "entry.json", str(5_000_000 + 2 * number)).mkdir()
        dead.append(_temporary(tmp_path, "entry.json", str(5_000_001 + 2 * number)))
        dead[-1].write_text("")
    write_text(tmp_path / "entry.json", "{}")
    assert not any(path.exists() for path in dead)
    assert sum(path.is_dir() for path in tmp_path.iterdir()) == 20  # a folder is not accel's to remove


def test_a_temporary_of_this_process_not_being_written_is_left_over(tmp_path):
    left = temporary_name(tmp_path / "entry.json")  # a Ctrl-C between its open and its clean-up
    left.write_text("")
    write_text(tmp_path / "entry.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.json"]


def _state(logger):
    return logger.level, list(logger.handlers), logger.propagate


def test_nni_quiet_from_two_threads_at_once_restores_nni_as_it_was():
    import nni  # noqa: F401

    logger = logging.getLogger("nni")
    mine = logging.StreamHandler()
    before = logger.level, logger.handlers, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.handlers, logger.propagate = [mine], True  # the user configured NNI's logger themselves
    try:
        first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
        inside = []

        def first():
            with nni_quiet():
                first_in.set()
                second_in.wait(30)
            first_out.set()

        def second():
            first_in.wait(30)
            with nni_quiet():
                second_in.set()
                first_out.wait(30)
                inside.append(_state(logger))  # still pruning: still quiet

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert inside and mine not in inside[0][1] and inside[0][2] is False
        assert _state(logger) == (logging.DEBUG, [mine], True)
    finally:
        logger.setLevel(before[0])
        logger.handlers, logger.propagate = before[1], before[2]


def test_nni_quiet_restores_nni_after_an_interrupt_inside():
    import nni  # noqa: F401

    logger = logging.getLogger("nni")
    state = _state(logger)
    with pytest.raises(KeyboardInterrupt), nni_quiet():
        raise KeyboardInterrupt
    assert _state(logger) == state


def test_an_nni_record_that_cannot_be_formatted_raises_nothing_from_nnis_call(monkeypatch):
    monkeypatch.setattr(logging, "raiseExceptions", False)  # (as in production: the handler's report is quiet)
    with nni_quiet():
        logging.getLogger("nni").error("%d layers", "some")  # raised TypeError out of NNI's own logging call


def test_an_nni_error_keeps_its_traceback(caplog):
    with nni_quiet(), caplog.at_level(logging.ERROR, "accel.prune.nni"):
        try:
            raise ValueError("inside NNI")
        except ValueError:
            logging.getLogger("nni").exception("NNI failed")
    assert [r.exc_info[1].args for r in caplog.records if r.exc_info] == [("inside NNI",)]




@pytest.mark.parametrize("estimate", ["fast", [1.0]])
def test_an_answer_whose_ratio_is_no_number_is_measured_again(tmp_path, estimate):
    """An answer's row with a ratio whose estimate is no number passed the kind check and the table's printing (which
    prints the samples) and raised from run.report.to_dict() (its ablation: 1 / the estimate)."""
    from faults.test_cache_entry_trust import searched_result

    from accel.search.results import cached_answer

    facts = {"model": "the same setup"}
    result = searched_result({})
    result["rows"] = [{"name": "eager", "plan": {}, "status": "measured", "against": "channels_last",
                       "tests": "channels_last", "median_ms": 5.0,
                       "ratio": {"estimate": estimate, "low": 0.9, "high": 1.1, "rounds": 3, "samples": [1.0, 1.0]}}]
    plancache.store(facts, result, tmp_path)
    assert cached_answer(facts, tmp_path, 0.0) is None  # a damaged entry: it was taken, and its to_dict() raised


def test_a_plan_file_one_byte_over_the_limit_says_its_size(tmp_path):
    from accel.errors import PlanError
    from accel.plan import Plan
    from accel.plan.plan import PLAN_FILE_LIMIT

    path = tmp_path / "plan.toml"  # (TOML: a MiB of YAML comment takes seconds to parse)
    path.write_bytes(b"[channels_last]\n#".ljust(PLAN_FILE_LIMIT, b"#"))
    assert Plan(path).names() == ["channels_last"]  # exactly at the limit: read
    path.write_bytes(b"[channels_last]\n#".ljust(PLAN_FILE_LIMIT + 1, b"#"))
    with pytest.raises(PlanError) as refused:  # it said '1.0 MiB, more than the 1.0 MiB expected'
        Plan(path)
    assert f"{PLAN_FILE_LIMIT + 1} bytes, more than the {PLAN_FILE_LIMIT} expected" in str(refused.value)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_plan_path_to_a_pipe_or_a_device_is_not_said_to_be_missing(tmp_path, kind):
    import os

    from accel.errors import PlanError
    from accel.plan import Plan

    path = tmp_path / "plan.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/null")
    with pytest.raises(PlanError, match="a named pipe or a device, not a regular file"):  # it said: not found
        Plan(path)


class _Wrapper(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


class _Wraps(Accelerator):
    """Wraps the model (as ddp does), so that the user's compile goes around the plan's wrapper."""

    name, stage = "wraps", Stage.DISTRIBUTION

    def apply(self, ctx):
        ctx.model = _Wrapper(ctx.model)
        return {}

    def unwrap(self, state, model):
        return model.module if isinstance(model, _Wrapper) else model


class _Doubled(torch._dynamo.eval_frame.OptimizedModule):
    """A user's own kind of compiled model, with a __call__ of its own (what the user's training runs)."""

    def __call__(self, x):
        return super().__call__(x * 2)


def test_your_own_kind_of_compiled_model_keeps_its_call_around_the_plans_wrapper():
    model = tiny_model(0)
    compiled = torch.compile(model, backend="eager")
    yours = _Doubled(compiled._orig_mod, compiled.dynamo_ctx)
    run = accel.accelerate(yours, tiny_optimizer(model), tiny_loader(), plan=[_Wraps()], device="cpu")
    try:
        x, _ = next(iter(tiny_loader()))
        assert type(run.model) is _Doubled  # it was torch's own kind, without the doubling
        assert run.model.dynamo_ctx is yours.dynamo_ctx and isinstance(run.model._orig_mod, _Wrapper)
        with torch.no_grad():
            assert torch.equal(run.model(x), model(x * 2))
    finally:
        run.close()


def test_a_small_read_of_a_file_longer_than_its_size_says_is_refused_not_cut():
    """A file that grew between its size check and its read (or one that gives no size: /proc's) was cut at the
    limit and returned as if whole (a plan or an entry missing its end)."""
    import errno

    from accel.files import read_small

    with pytest.raises(OSError) as refused:
        read_small("/proc/self/status", limit=64)  # a regular file of size 0 whose read gives more
    assert refused.value.errno == errno.EFBIG
