"""Runs compose (issue 25): one accelerate() per model (a GAN's generator and discriminator, a teacher and its
student), any number open at once, closed in any order, leave the process exactly as it was before the first;
each run undoes only what it changed, and a value the user sets meanwhile is theirs."""
import copy
import itertools
import os
import re
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scripts.launching import one_rank_env
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.accelerators.threads import openmp_variables
from accel.errors import AccelerateError, MeasureError, PlanError
from accel.hardware import format_cpu_list, probe
from accel.hardware.launcher import CORE_MAP_VARIABLE
from accel.plan.contract import Accelerator, Stage
from accel.run.journal import Journal, pin_process
from accel.run.shared_settings import set_by_runs

HAS_AFFINITY = hasattr(os, "sched_getaffinity")
CPUS = tuple(sorted(os.sched_getaffinity(0))) if HAS_AFFINITY else (0,)  # read, never assumed
# What each run asks for, (threads, its CPUs): different from each other and from the user's wherever the machine
# has the CPUs for it (on one CPU the affinities coincide, and every test still holds). 2 threads on one CPU only
# oversubscribe it (a warning).
SPECS = [(1, CPUS[-1:]), (2, CPUS), ("auto", CPUS[:1])]
USER_THREADS, USER_WRITE = 3, 4  # the user's thread count before the runs, and one they set while runs are open
SLOW = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

DIGITS = load_digits()


def process_state():
    return (torch.get_num_threads(), dict(os.environ), os.sched_getaffinity(0) if HAS_AFFINITY else None)


def warm_up():
    """One run opened and closed: torch sets TORCHINDUCTOR_CACHE_DIR on its first import of dynamo, no run's
    change, so the process is read as the user has it after that."""
    accel.accelerate(*model_and_optimizer(0), plan=[], device="cpu").close()


@pytest.fixture
def user_state():
    """The user's process before the runs: its own thread count, none of the OpenMP variables threads exports, and,
    with 2+ CPUs, pinned to all but the last (conftest puts the process back after the test)."""
    probe()  # the machine as it is, before the user pins it
    warm_up()
    for key in {*openmp_variables("gnu", 1), *openmp_variables("intel", 1)}:
        os.environ.pop(key, None)
    torch.set_num_threads(USER_THREADS)
    if HAS_AFFINITY:
        pin_process(CPUS[:-1] or CPUS)


def model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def digits_loader(samples=256, batch_size=64, seed=0):
    images = torch.tensor(DIGITS.data[:samples], dtype=torch.float32) / 16
    labels = torch.tensor(DIGITS.target[:samples])
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed))


def open_run(index, loader=None):
    """accelerate() on a model of its own with SPECS[index]. Its CPUs reach the threads accelerator as `accel
    launch`'s core map, set only while accelerate() decides, so the process holds only what the run changed."""
    threads, cpus = SPECS[index]
    saved = os.environ.get(CORE_MAP_VARIABLE)
    os.environ[CORE_MAP_VARIABLE] = format_cpu_list(cpus)
    try:
        return accel.accelerate(*model_and_optimizer(index), loader, plan={"threads": {"threads": threads}},
                                device="cpu")
    finally:
        os.environ.pop(CORE_MAP_VARIABLE) if saved is None else os.environ.__setitem__(CORE_MAP_VARIABLE, saved)


def test_issue_25_a_gan_closed_in_the_order_it_was_made():
    """The issue's case as reported: the user had 1 thread; two runs with the default threads plan, closed A then
    B, left 2 threads and OMP_PROC_BIND, OMP_SCHEDULE, GOMP_CPU_AFFINITY behind."""
    warm_up()
    torch.set_num_threads(1)
    before = process_state()
    a = accel.accelerate(*model_and_optimizer(0), digits_loader(), plan=["threads"], device="cpu")
    b = accel.accelerate(*model_and_optimizer(1), None, plan=["threads"], device="cpu")
    assert a.report.row("threads").status == b.report.row("threads").status == "applied"
    a.close()
    b.close()
    assert process_state() == before


@pytest.mark.parametrize("count", [2, 3])
def test_runs_closed_in_every_order_put_the_process_back(user_state, count):
    """After each close, the process is as the newest run still open left it (or as before the first): each run
    undoes only what it changed."""
    for order in itertools.permutations(range(count)):
        before = process_state()
        runs, opened = [], []
        for index in range(count):
            runs.append(open_run(index, digits_loader() if index == 0 else None))
            opened.append(process_state())
            assert opened[-1][0] == runs[-1].decisions.threads != USER_THREADS
            assert "OMP_NUM_THREADS" in opened[-1][1] and "OMP_NUM_THREADS" not in before[1]
        still_open = set(range(count))
        for index in order:
            runs[index].close()
            still_open.discard(index)
            expected = opened[max(still_open)] if still_open else before
            assert process_state() == expected, f"closing in the order {order}, after run {index}"


def test_each_run_exports_its_own_variables_and_keeps_yours(user_state):
    """A variable another open run set is no user's choice: the next run lays its own over it. One the user set
    is kept by every run."""
    a, b = open_run(0), open_run(1)
    assert a.report.row("threads").changes["exported_for_children"].startswith("OMP_NUM_THREADS=1")
    row = b.report.row("threads").changes
    assert row["exported_for_children"].startswith("OMP_NUM_THREADS=2") and "kept_user_values" not in row
    assert os.environ["OMP_NUM_THREADS"] == "2" and set_by_runs(("environ", "OMP_NUM_THREADS"))
    a.close()
    assert os.environ["OMP_NUM_THREADS"] == "2"
    b.close()
    assert "OMP_NUM_THREADS" not in os.environ and not set_by_runs(("environ", "OMP_NUM_THREADS"))

    os.environ["OMP_NUM_THREADS"] = "7"
    before = process_state()
    a, b = open_run(0), open_run(1)
    for run in (a, b):
        assert run.report.row("threads").changes["kept_user_values"] == "OMP_NUM_THREADS=7"
    assert os.environ["OMP_NUM_THREADS"] == "7" and not set_by_runs(("environ", "OMP_NUM_THREADS"))
    a.close()
    b.close()
    assert process_state() == before


@pytest.mark.parametrize("order", list(itertools.permutations(range(2))))
def test_a_thread_count_you_set_while_runs_are_open_is_yours(user_state, order):
    """The user's write wins: the layers under it give up their claim, a run opened after it lays over it and
    gives it back; the rest of the process is put back as before."""
    before = process_state()
    runs = [open_run(0)]
    torch.set_num_threads(USER_WRITE)
    runs.append(open_run(1))
    assert torch.get_num_threads() == 2
    runs[order[0]].close()
    assert torch.get_num_threads() == (USER_WRITE if order[0] == 1 else 2)
    runs[order[1]].close()
    assert torch.get_num_threads() == USER_WRITE
    assert process_state()[1:] == before[1:]

    run = open_run(1)
    torch.set_num_threads(USER_WRITE + 1)
    run.close()
    assert torch.get_num_threads() == USER_WRITE + 1 and process_state()[1:] == before[1:]


operations = st.lists(st.one_of(st.tuples(st.just("open"), st.integers(0, len(SPECS) - 1)),
                                st.tuples(st.just("close"), st.integers(0, 7)),
                                st.tuples(st.just("threads"), st.integers(1, 6))), max_size=10)


@settings(max_examples=40, **SLOW)
@given(operations)
@example([("open", 0), ("threads", 5), ("open", 1), ("threads", 6), ("close", 0), ("threads", 2), ("close", 0)])
def test_any_interleaving_of_runs_and_your_writes(user_state, ops):
    """Open and close runs in any interleaving, the user setting torch's threads in between. The thread count is
    the newest claim's: a run's, or the user's write, which accel sees when a run next opens or closes (a value
    set back to what the newest run set is that run's again) and which drops the claims under it. The
    environment and affinity are the newest open run's, or as before; at the end all is as before but the
    user's own writes."""
    torch.set_num_threads(USER_THREADS)
    before = process_state()
    runs, opened = [], []  # every run made, and the process right after it opened
    claims, base = [], USER_THREADS  # the thread-count model: (run, threads) still claimed, and the value under them
    written = None  # the user's last write since a run last opened or closed
    try:
        for op, value in ops:
            if op == "threads":
                torch.set_num_threads(value)
                written = value
                continue
            if written is not None and written != (claims[-1][1] if claims else base):
                claims, base = [], written
            written = None
            if op == "open":
                runs.append(open_run(value))
                opened.append(process_state())
                claims.append((len(runs) - 1, opened[-1][0]))
            else:
                live = [i for i, run in enumerate(runs) if not run.closed]
                if live:
                    index = live[value % len(live)]
                    runs[index].close()
                    claims = [(i, t) for i, t in claims if i != index]
            live = [i for i, run in enumerate(runs) if not run.closed]
            assert torch.get_num_threads() == (claims[-1][1] if claims else base), ops
            assert process_state()[1:] == (opened[live[-1]] if live else before)[1:], ops
    finally:
        for run in runs:
            run.close()
    if written is not None and written != (claims[-1][1] if claims else base):
        claims, base = [], written
    assert process_state()[1:] == before[1:] and torch.get_num_threads() == base
    assert not set_by_runs("torch threads") and not set_by_runs("affinity")


class Breaks(Accelerator):
    """Fails while being applied, after the threads accelerator applied (a later stage)."""

    name, stage = "breaks", Stage.KERNELS

    def apply(self, ctx):
        raise RuntimeError("broken on purpose")


@pytest.mark.parametrize("plan", [{"threads": {"threads": 0}}, [{"threads": {"threads": 2}}, Breaks()]],
                         ids=["refused", "fails-while-applied"])
def test_accelerate_again_that_fails_puts_the_earlier_run_back_in_its_place(user_state, plan):
    """accelerate() again on a model undoes its earlier run first; when the new plan is refused or fails, it
    redoes the earlier run where it was: under the runs opened after it, so the process is as before the call."""
    d = open_run(0)
    g = open_run(1)
    before = process_state()
    with pytest.raises((PlanError, AccelerateError)):
        accel.accelerate(d.unwrap(), d.optimizer, None, plan=plan, device="cpu")
    assert process_state() == before and not d.closed
    g.close()
    assert torch.get_num_threads() == d.decisions.threads
    d.close()
    assert torch.get_num_threads() == USER_THREADS


def test_journals_switched_by_suspend_and_resume_keep_their_places():
    """What tune does between candidates (suspend one journal, resume another) and what accelerate() again does
    (detach, undo_all, redo_all, attach), with another journal open beside them."""
    torch.set_num_threads(1)
    key = "ACCEL_TEST_COMPOSE"
    os.environ.pop(key, None)
    older, newer = Journal(), Journal()
    older.set_threads(2)
    older.setenv(key, "older")
    newer.set_threads(3)
    newer.setenv(key, "newer")
    older.suspend()
    assert (torch.get_num_threads(), os.environ[key]) == (3, "newer")
    older.resume()  # back under the newer journal: nothing live changes
    assert (torch.get_num_threads(), os.environ[key]) == (3, "newer")
    newer.suspend()
    assert (torch.get_num_threads(), os.environ[key]) == (2, "older")
    newer.resume()
    handed = newer.detach()
    handed.undo_all()
    assert (torch.get_num_threads(), os.environ[key]) == (2, "older")
    handed.redo_all()
    newer.attach(handed)
    assert (torch.get_num_threads(), os.environ[key]) == (3, "newer")
    newer.rollback()
    assert (torch.get_num_threads(), os.environ[key]) == (2, "older")
    older.suspend()
    assert (torch.get_num_threads(), key in os.environ) == (1, False)
    older.rollback()  # suspended: its changes were undone already
    assert (torch.get_num_threads(), key in os.environ) == (1, False)


journal_operations = st.lists(st.tuples(st.sampled_from(["new", "rollback", "suspend", "resume", "write"]),
                                        st.integers(1, 6)), max_size=14)


@settings(max_examples=200, **SLOW)
@given(journal_operations)
def test_any_interleaving_of_journals_suspended_resumed_and_your_writes(ops):
    """Journals as tune and runs use them (made, rolled back, suspended and resumed between candidates), the user
    setting the threads in between: the live count is always the newest claim's, a resumed journal going back to
    its place among the others. The model: claims ordered by when they were made; a user write, seen at the next
    change of a claim, drops them all."""
    torch.set_num_threads(USER_THREADS)
    journals, status, on = [], [], set()  # every journal made, its status, and those whose claim is on
    base, written = USER_THREADS, None

    def live():
        return journals[max(on)][1] if on else base

    try:
        for op, value in ops:
            index = value % len(journals) if journals else None
            if op == "write":
                torch.set_num_threads(value)
                written = value
            elif op == "rollback" and index is not None and status[index] == "suspended":
                journals[index][0].rollback()  # its claim was lifted when it was suspended: nothing changes
                status[index] = "closed"
            elif op == "new" or (index is not None and (status[index], op) in {
                    ("active", "rollback"), ("active", "suspend"), ("suspended", "resume")}):
                if written is not None and written != live():  # a claim changes: the user's write is seen
                    on, base = set(), written
                written = None
                if op == "new":
                    journals.append((Journal(), value))
                    status.append("active")
                    journals[-1][0].set_threads(value)
                    on.add(len(journals) - 1)
                else:
                    getattr(journals[index][0], op)()
                    status[index] = {"rollback": "closed", "suspend": "suspended", "resume": "active"}[op]
                    (on.add if op == "resume" else on.discard)(index)
            assert torch.get_num_threads() == (written if written is not None else live()), ops
    finally:
        for journal, _ in journals:
            journal.rollback()
    assert not set_by_runs("torch threads")


def test_tune_beside_an_open_run_leaves_it_as_it_was(user_state):
    """accel.tune switches its candidates' journals (suspend/resume) on copies while your other run is open."""
    run = open_run(1)
    opened = process_state()
    accel.tune(*model_and_optimizer(5), digits_loader(), device="cpu", candidates=[{"threads": {"threads": 1}}],
               budget_s=1, cache=False)
    assert process_state() == opened
    run.close()
    assert torch.get_num_threads() == USER_THREADS


def gan(seed=0):
    torch.manual_seed(seed)
    generator = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 64), nn.Sigmoid())
    discriminator = nn.Sequential(nn.Linear(64, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    return generator, discriminator


def gan_batches():
    images = torch.tensor(DIGITS.data[:512], dtype=torch.float32) / 16
    return DataLoader(TensorDataset(images), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))


def discriminator_loss(discriminator, real, fake):
    bce = nn.functional.binary_cross_entropy_with_logits
    return (bce(discriminator(real), torch.ones(len(real), 1))
            + bce(discriminator(fake.detach()), torch.zeros(len(fake), 1)))


def generator_loss(discriminator, fake):
    return nn.functional.binary_cross_entropy_with_logits(discriminator(fake), torch.ones(len(fake), 1))


def test_a_gan_with_one_run_per_model_trains_as_the_plain_loop(user_state):
    """Two runs with plan ["threads"] side by side train exactly what the plain loop trains with as many
    threads (the thread count only reorders float sums), and closing them puts the process back."""
    before = process_state()
    generator, discriminator = gan()
    plain_g, plain_d = copy.deepcopy(generator), copy.deepcopy(discriminator)
    start = copy.deepcopy(generator)
    g = accel.accelerate(generator, torch.optim.SGD(generator.parameters(), lr=0.1), plan=["threads"], device="cpu")
    d = accel.accelerate(discriminator, torch.optim.SGD(discriminator.parameters(), lr=0.1), gan_batches(),
                         plan=["threads"], device="cpu")
    noise = torch.Generator().manual_seed(1)
    for (real,) in d.loader:
        fake = g.model(torch.randn(len(real), 16, generator=noise))
        d.optimizer.zero_grad(set_to_none=True)  # what the generator's backward left on D's parameters
        d.backward(discriminator_loss(d.model, real, fake))
        d.step()
        g.backward(generator_loss(d.model, fake))
        g.step()
    threads = torch.get_num_threads()
    assert threads == g.decisions.threads == d.decisions.threads and d.steps == g.steps == 8
    g.close()
    d.close()
    assert process_state() == before

    torch.set_num_threads(threads)
    optimizer_g = torch.optim.SGD(plain_g.parameters(), lr=0.1)
    optimizer_d = torch.optim.SGD(plain_d.parameters(), lr=0.1)
    noise = torch.Generator().manual_seed(1)
    for (real,) in gan_batches():
        fake = plain_g(torch.randn(len(real), 16, generator=noise))
        optimizer_d.zero_grad(set_to_none=True)
        discriminator_loss(plain_d, real, fake).backward()
        optimizer_d.step()
        optimizer_g.zero_grad(set_to_none=True)
        generator_loss(plain_d, fake).backward()
        optimizer_g.step()
    assert not torch.equal(generator[0].weight, start[0].weight)  # it trained
    for mine, plain in ((generator, plain_g), (discriminator, plain_d)):
        for (name, p), q in zip(mine.named_parameters(), plain.parameters()):
            assert torch.equal(p, q), name


def test_two_runs_with_ddp_share_the_group_until_the_last_closes(monkeypatch):
    """A one-rank gloo group accel joins for the first run stays while the other is open, in either order."""
    warm_up()
    for order in itertools.permutations(range(2)):
        for key, value in one_rank_env().items():
            monkeypatch.setenv(key, value)
        before = process_state()
        runs = [accel.accelerate(*model_and_optimizer(i), digits_loader(), plan=["ddp"], device="cpu")
                for i in range(2)]
        runs[order[0]].close()
        assert torch.distributed.is_initialized()
        last = runs[order[1]]
        images, labels = next(iter(last.loader))
        last.backward(nn.functional.cross_entropy(last.model(images), labels))  # DDP's all-reduce, in the group
        last.step()
        last.close()
        assert not torch.distributed.is_initialized()
        assert process_state() == before


def test_plan_auto_without_a_loader_says_what_to_do():
    model, optimizer = model_and_optimizer(0)
    with pytest.raises(MeasureError, match="needs a loader. A model with no loader of its own"):
        accel.accelerate(model, optimizer, None, plan="auto", device="cpu")


def test_the_recipes_of_docs_two_models_run_as_written(user_state):
    """The GAN and the teacher-student blocks of docs/two_models.md: they train, and put the process back."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "two_models.md").read_text()
    gan_block, distillation_block = re.findall(r"```python\n(.*?)```", text, re.S)[:2]
    before = process_state()
    namespace = {}
    exec(gan_block, namespace)
    assert namespace["g"].steps == namespace["d"].steps == 16 and namespace["g"].closed
    assert process_state() == before
    namespace = {}
    exec(distillation_block, namespace)
    assert namespace["s"].steps == 8 and namespace["t"].steps == 0
    assert process_state() == before


def test_plan_auto_on_a_generator_that_never_reads_its_loader_says_so(user_state, monkeypatch, tmp_path):
    """The generator's plan="auto" given the discriminator's loader, which only the discriminator's run iterates:
    it measures in chunks of g.step() calls, and its report says what it could not know (the data wait of a
    rebuilt loader, never taken) and that the cache was neither read nor written."""
    from accel.search import inloop

    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)  # 2 timed steps a turn: a short loop settles
    before = process_state()
    generator, discriminator = gan()
    loader = gan_batches()
    candidates = [["fused_optimizer"], [{"loader": {"num_workers": 1}}]]
    d = accel.accelerate(discriminator, torch.optim.SGD(discriminator.parameters(), lr=0.1), loader,
                         plan=["threads"], device="cpu")
    g = accel.accelerate(generator, torch.optim.SGD(generator.parameters(), lr=0.1), loader,
                         plan=accel.Auto(cache=tmp_path, budget_s=3, candidates=candidates), device="cpu")
    for _ in range(100):
        for (real,) in d.loader:
            fake = g.model(torch.randn(len(real), 16))
            d.optimizer.zero_grad(set_to_none=True)
            d.backward(discriminator_loss(d.model, real, fake))
            d.step()
            g.backward(generator_loss(d.model, fake))
            g.step()
        if g.phase == "settled":
            break
    result = g.report.tuning
    rows = {row.name: row for row in result.rows}
    assert rows["loader"].status == "not measured" and "never iterated run.loader" in rows["loader"].reason
    assert rows["loader"].decision != "chosen" and "loader" not in g.plan.names() and g.loader.pending is None
    assert "the cache was neither read nor written" in result.why
    assert rows["fused_optimizer"].status != "not measured"  # the stepwise candidate took its turns
    g.close()
    d.close()
    assert process_state() == before
