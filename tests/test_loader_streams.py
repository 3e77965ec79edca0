"""loader over an IterableDataset: a stream is batched inside each worker, so the number of workers decides which
samples share a batch. loader keeps the user's number of workers for every stream (issue 25, case 4 "Streams"):
the run's batches are the plain loop's, on hardware that would give a map-style dataset several workers too."""
from dataclasses import replace

import pytest
import torch
from simulated_hardware import simulated
from torch.utils.data import DataLoader
from zoo import Case, Samples, ShardedStream, Stream

import accel
from accel.accelerators.loader import STREAM_BATCHES, Loader
from accel.api import prepare
from accel.errors import PlanError, Skip
from accel.testing import check_equivalence, process_state_restored, tiny_model

SHARDS = "this IterableDataset shards its stream by worker and each worker batches its own shard"
REPEATS = "this IterableDataset does not shard its stream by worker: every worker would yield every sample"
DATASETS = {"sharded_stream": (ShardedStream, SHARDS), "stream": (Stream, REPEATS)}


def four_cpus():
    """A 4-core Zen 4: with one compute thread, auto gives a map-style dataset 3 workers."""
    return replace(simulated("zen4"), logical_cpus=4, physical_cores=4, cpus_allowed=(0, 1, 2, 3),
                   physical_cpus=(0, 1, 2, 3), numa_nodes={0: (0, 1, 2, 3)})


def user_loader(kind, num_workers=0):
    samples = Samples("tuple", "none")  # sklearn's digits: 96 samples, 6 batches of 16
    dataset = samples if kind == "samples" else DATASETS[kind][0](samples)
    context = "fork" if num_workers and "fork" in torch.multiprocessing.get_all_start_methods() else None
    return DataLoader(dataset, batch_size=16, num_workers=num_workers, multiprocessing_context=context)


def batches(loader):
    return [(images.clone(), labels.clone()) for images, labels in loader]


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for (images, labels), (want_images, want_labels) in zip(got, expected):
        assert torch.equal(labels, want_labels) and torch.equal(images, want_images)


def test_workers_change_which_samples_share_a_batch_of_a_stream_that_shards_itself():
    """The premise, on torch itself: a sharding stream's batches with 2 workers are not the plain loop's."""
    plain, workers = batches(user_loader("sharded_stream")), batches(user_loader("sharded_stream", num_workers=2))
    everything = torch.cat([labels for _, labels in plain])
    assert torch.equal(plain[0][1], everything[:16])
    assert torch.equal(workers[0][1], everything[0:32:2]) and torch.equal(workers[1][1], everything[1:32:2])
    assert sorted(torch.cat([labels for _, labels in workers]).tolist()) == sorted(everything.tolist())


@pytest.mark.parametrize("kind", sorted(DATASETS))
def test_auto_keeps_a_streams_workers_where_the_hardware_would_give_several(kind):
    hardware = four_cpus()
    with process_state_restored():
        torch.set_num_threads(1)
        map_style = accel.decide(tiny_model(), None, user_loader("samples"), ["loader"], device="cpu",
                                 hardware=hardware)
        assert map_style.workers == 3 and map_style.why["workers"] == "4 CPUs - 1 compute threads"
        loader = user_loader(kind)
        ctx, accelerators, skips = prepare(tiny_model(), None, loader, ["loader"], device="cpu", hardware=hardware)
        assert ctx.decisions.workers == 0 and not skips
        assert ctx.decisions.why["workers"] == f"kept: {DATASETS[kind][1]}" + (
            ": another number of workers would change which samples share a batch" if kind == "sharded_stream"
            else "")
        with pytest.raises(Skip) as skipped:  # nothing else changes on a CPU device: the loader is left as it is
            accelerators[0].apply(ctx)
    assert skipped.value.reason.startswith(f"the loader already has these settings (num_workers=0: kept: "
                                           f"{DATASETS[kind][1]}")
    assert ctx.loader is loader and loader.num_workers == 0
    assert_same_batches(batches(ctx.loader), batches(user_loader(kind)))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # 4 CPUs simulated
def test_the_same_hardware_gives_a_map_style_dataset_workers_and_the_same_batches():
    """The contrast: a map-style dataset's batches are made by the sampler, whatever number of workers loads them."""
    loader = user_loader("samples")
    with process_state_restored():
        torch.set_num_threads(1)
        ctx, accelerators, _ = prepare(tiny_model(), None, loader, ["loader"], device="cpu", hardware=four_cpus())
        changes = accelerators[0].apply(ctx)
    assert changes["num_workers"].startswith("3 ") and ctx.loader.num_workers == 3
    assert_same_batches(batches(ctx.loader), batches(loader))


@pytest.mark.parametrize("kind", ["samples", *sorted(DATASETS)])
def test_the_runs_batches_are_the_plain_loops(kind):
    """Through accelerate() here, with one compute thread: auto would add a worker wherever a second CPU is."""
    loader = user_loader(kind)
    with process_state_restored():
        torch.set_num_threads(1)
        run = accel.accelerate(tiny_model(), None, loader, ["loader"], device="cpu")
        try:
            row = run.report.row("loader")
            got = batches(run.loader)
        finally:
            run.close()
    assert_same_batches(got, batches(user_loader(kind)))
    if kind != "samples":
        assert row.status == "skipped" and f"num_workers=0: kept: {DATASETS[kind][1]}" in row.reason
        assert run.loader.loader is loader


@pytest.mark.parametrize("kind", sorted(DATASETS))
@pytest.mark.parametrize("asked", [1, 2])
def test_an_explicit_other_num_workers_on_a_stream_is_refused_and_nothing_changes(kind, asked):
    loader = user_loader(kind)
    with pytest.raises(PlanError) as refused:
        accel.accelerate(tiny_model(), None, loader, [{"loader": {"num_workers": asked}}], device="cpu")
    [problem] = refused.value.problems
    assert (problem.accelerator, problem.field, problem.value, problem.kind) == ("loader", "num_workers", asked,
                                                                                 "conflict")
    assert DATASETS[kind][1] in problem.message and STREAM_BATCHES in problem.message
    assert problem.allowed.startswith("\"auto\" or 0 (your loader's own); for other workers, set num_workers on "
                                      "your DataLoader")
    assert loader.num_workers == 0


@pytest.mark.skipif("fork" not in torch.multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_streams_own_workers_stay_and_so_do_its_batches():
    """The user's loader already has 2 workers on a sharding stream: its batches are theirs (the plain loop's),
    and loader neither drops the workers (auto, or the same number asked) nor changes their number."""
    theirs = batches(user_loader("sharded_stream", num_workers=2))
    assert not all(torch.equal(a, b) for (_, a), (_, b) in zip(theirs, batches(user_loader("sharded_stream"))))
    for plan in (["loader"], [{"loader": {"num_workers": 2}}]):
        loader = user_loader("sharded_stream", num_workers=2)
        run = accel.accelerate(tiny_model(), None, loader, plan, device="cpu")
        try:
            row = run.report.row("loader")
            assert row.status == "skipped" and f"num_workers=2: kept: {SHARDS}" in row.reason
            got = batches(run.loader)
        finally:
            run.close()
        assert_same_batches(got, theirs)
    for asked in (0, 3):
        with pytest.raises(PlanError, match=STREAM_BATCHES):
            accel.accelerate(tiny_model(), None, user_loader("sharded_stream", num_workers=2),
                             [{"loader": {"num_workers": asked}}], device="cpu")


@pytest.mark.parametrize("kind", sorted(DATASETS))
def test_check_equivalence_keeps_a_streams_batches(kind):
    build = Case(loader=kind).build
    with process_state_restored():
        torch.set_num_threads(1)  # a spare CPU here (where there are 2): auto would add a worker to a map-style set
        result = check_equivalence(["loader"], build, steps=8)
        assert result.ok and not result.differences, result
        assert result.applied == [] and f"num_workers=0: kept: {DATASETS[kind][1]}" in result.skipped["loader"]
        asked = check_equivalence([{"loader": {"num_workers": 2}}], build, steps=8)
    assert asked.ok and asked.refused and STREAM_BATCHES in asked.refused, asked
    assert not asked.objects_changed and not asked.process_changed


def test_tune_proposes_loader_for_a_stream_only_where_memory_could_be_pinned():
    model = tiny_model()
    stream, samples = user_loader("sharded_stream"), user_loader("samples")
    smt = simulated("xeon_2s_smt")  # hyper-threads: spare CPUs for a map-style dataset's workers
    assert Loader.candidates(smt, model, None, samples) == [{}]
    assert Loader.candidates(smt, model, None, stream) == []
    assert Loader.candidates(simulated("gpu_host"), model, None, stream) == [{}]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", sorted(DATASETS))
def test_on_a_gpu_a_stream_gets_pinned_memory_and_keeps_its_workers(kind):
    loader = user_loader(kind)
    run = accel.accelerate(tiny_model(), None, loader, ["loader"], device="cuda")
    try:
        row = run.report.row("loader")
        assert row.status == "applied" and row.changes["pin_memory"] is True
        assert row.changes["num_workers"] == f"0 (kept: {DATASETS[kind][1]}" + (
            ": another number of workers would change which samples share a batch)" if kind == "sharded_stream"
            else ")")
        assert run.loader.loader.num_workers == 0 and run.loader.loader.pin_memory
        got = [(images.cpu(), labels.cpu()) for images, labels in run.loader]
    finally:
        run.close()
    assert_same_batches(got, batches(user_loader(kind)))

