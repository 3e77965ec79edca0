"""The fsdp accelerator (FSDP2) and sharded checkpoints: bad input refused before anything changes; at world size 1
in this process, the live-objects loops (and a param group added later over the Parameters you kept, or one fsdp
cannot train, refused by name), close() and a failed plan giving your objects back, and the checkpoint
folder's integrity checks; with 2 real gloo ranks, the same training as one process on the global batch (a GPT-style
model and a CNN with BatchNorm), accumulation and clipping, amp and compile, a group added later, resharded resume
2 -> 1 and 1 -> 2 bit for bit, and a killed rank resuming from the last checkpoint."""
import json
import sys
import warnings

import pytest
import torch
from scripts.launching import LAUNCHER_VARIABLES, SCRIPTS, one_rank_env, output, run, torchrun
from zoo import Case
from zoo.loops import LOOPS, Loop, layer

import accel
from accel.accelerators.compile import sharded_blocks
from accel.errors import CheckpointError, StaleWarning
from accel.plan.contract import Accelerator, Stage, register, unregister
from accel.testing import check_equivalence, snapshot, tiny_loader, tiny_model
from accel.testing.trace import process_state
from accel.workloads import TinyGPT

NOT_LIVE = {"hooks": "a gradient hook on a sharded parameter: named by a StaleWarning (test below)",
            "ema": "FSDP2 refuses to deep-copy a sharded model (AveragedModel)", "swa": "the same"}


@pytest.fixture
def no_launcher(monkeypatch):
    for key in LAUNCHER_VARIABLES:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def one_rank(monkeypatch):
    """torchrun --nproc-per-node 1's variables: fsdp joins a gloo group of one in this process (close() leaves it)."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    yield
    assert not torch.distributed.is_initialized()  # the run's close() destroyed the group it started


def train(run, steps=3, scheduler=None):
    for _, (x, y) in zip(range(steps), run.loader):
        with run.autocast():
            loss = torch.nn.functional.cross_entropy(run.model(x), y)
        run.backward(loss)
        if not run.step() and scheduler is not None:
            scheduler.step()


# --- refused before anything changes ----------------------------------------------------------------------------

class Foreign(torch.nn.Module):
    def forward(self, x):
        return x


def refused(plan, model=None, optimizer=None) -> str:
    model = model if model is not None else tiny_model()
    optimizer = optimizer if optimizer is not None else torch.optim.Adam(model.parameters())
    before, process = snapshot(model, optimizer), process_state()
    with pytest.raises(accel.PlanError) as error:
        accel.accelerate(model, optimizer, tiny_loader(), plan=plan, device="cpu")
    assert not before.changes(snapshot(model, optimizer)) and process_state() == process
    assert not torch.distributed.is_initialized()
    return str(error.value)


def test_without_a_launcher_fsdp_is_refused_naming_the_launchers(no_launcher):
    message = refused(["fsdp"])
    assert "fsdp.launcher: not launched" in message and "torchrun --nproc-per-node 1" in message


def test_bad_input_is_refused_together_before_anything_changes(one_rank, monkeypatch):
    model = tiny_model()
    other = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD([*model.parameters(), *other.parameters()], lr=0.1)
    message = refused({"fsdp": {"backend": "nccl", "cpu_offload": True, "blocks": ["Nothing"]}, "ddp": {}},
                      model, optimizer)
    for expected in ("conflicts with ddp", "backend 'nccl' does not serve device cpu", "fsdp.cpu_offload",
                     "no module of class ['Nothing']", "fsdp.optimizer: the optimizer holds 2 parameter(s) that are "
                     "not the model's"):
        assert expected in message, message
    empty = Foreign()
    assert "the model has no parameters to shard" in refused(["fsdp"], empty, torch.optim.SGD(
        [torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    monkeypatch.setenv("MASTER_PORT", "")  # fixture restores it
    assert "MASTER_PORT is not set" in refused(["fsdp"])


# --- world size 1, in this process ------------------------------------------------------------------------------

@pytest.mark.parametrize("loop", sorted(set(LOOPS) - set(NOT_LIVE)))
def test_what_you_hold_stays_live_under_fsdp(one_rank, loop):
    """Schedulers, param-group writes, unfreezing, your own checkpoints, eval, accelerate() again: the same training."""
    optimizer = "momentum" if loop in ("unfreeze", "add_group", "late_group") else "adam"
    result = check_equivalence([{"fsdp": {}}], Case("blocks", "dict", "mask", "shuffled", optimizer,
                                                    loop=loop).build, steps=4)
    assert result.ok and not result.stale, result


class LateOriginals(Loop):
    """Issue 25, case 6: a layer frozen and left out of the optimizer; at step `at` unfrozen (through the model, or
    on the Parameter objects taken before accelerate()) and added with add_param_group over those Parameter objects,
    the ones fsdp replaced by their shards."""

    name = "late_originals"

    def __init__(self, unfreeze: str, at: int):
        self.unfreeze, self.at = unfreeze, at

    def prepare(self, held):
        self.late = layer(held.model)  # the user's own Parameter objects, held from before accelerate()
        for group in held.optimizer.param_groups:
            group["params"] = [p for p in group["params"] if all(p is not q for q in self.late)]
        held.model.conv2.requires_grad_(False)

    def before(self, step, held, run):
        if step == self.at:
            if self.unfreeze == "model":
                held.model.conv2.requires_grad_(True)  # reaches the shards (the model's parameters now)
            else:
                for param in self.late:
                    param.requires_grad_(True)  # the user's own Parameters, not in the model while the run is open
            held.optimizer.add_param_group({"params": self.late})
        return run


ACCUMULATED = {"fsdp": {}, "grad_accumulation": {"steps": 2}, "grad_clipping": {"max_norm": 0.05}}


@pytest.mark.parametrize("plan, unfreeze, optimizer, at", [
    (["fsdp"], "model", "momentum", 2), (["fsdp"], "originals", "momentum", 2), (["fsdp"], "model", "adam", 2),
    (["fsdp"], "originals", "adam", 2), (ACCUMULATED, "originals", "momentum", 3), (ACCUMULATED, "model", "adam", 2)])
def test_a_group_added_later_over_your_own_parameters_trains_their_shards(one_rank, plan, unfreeze, optimizer, at):
    """The plain loop and fsdp's train the same (at 3 with accumulation: the second micro-step of a step; the
    clipping's norm counts the new group), and run.close() leaves the trained values in your own Parameters."""
    loops = []

    def build():
        setup = Case("blocks", "dict", "mask", "shuffled", optimizer).build()
        setup.loop = LateOriginals(unfreeze, at)
        loops.append(setup.loop)
        return setup

    result = check_equivalence(plan, build, steps=6)
    assert result.ok and not result.stale, result
    plain, sharded = loops
    for mine, expected, before in zip(sharded.late, plain.late, layer(Case("blocks").build().model)):
        assert type(mine.data) is torch.Tensor and mine.requires_grad  # yours again, and trainable
        torch.testing.assert_close(mine.detach(), expected.detach(), rtol=result.keeps.rtol, atol=result.keeps.atol)
        assert not torch.equal(mine.detach(), before.detach())  # it trained


def test_a_later_group_fsdp_cannot_train_is_refused_by_name_and_nothing_changes(one_rank):
    model = tiny_model()
    conv2 = model.conv2.weight  # yours, from before accelerate()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    run = accel.accelerate(model, optimizer, tiny_loader(), plan=["fsdp"], device="cpu")
    try:
        refused_at_forward_and_at_step(run, model, optimizer, conv2)
    finally:
        run.close()
    assert model.conv2.weight is conv2


def refused_at_forward_and_at_step(run, model, optimizer, conv2):
    train(run, steps=1)

    def state():
        return ({n: p.detach().full_tensor().clone() for n, p in model.named_parameters()},
                {k: v["momentum_buffer"].full_tensor().clone() for k, v in optimizer.state.items()})

    for added, message in ((torch.nn.Parameter(torch.zeros(3, 2)), r"holds 1 parameter\(s\) that are not the model's,"
                            r" added after accelerate\(\): group 1 position 0 \(shape \(3, 2\)\)"),
                           (conv2, r"holds the model's \['conv2.weight'\] twice")):
        before = state()
        optimizer.add_param_group({"params": [added]})
        with pytest.raises(accel.LoopError, match=message):
            train(run, steps=1)  # before the forward
        group = optimizer.param_groups.pop()
        x, y = next(iter(run.loader))
        run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
        optimizer.param_groups.append(group)  # added between backward and step: refused at the step
        with pytest.raises(accel.LoopError, match=message):
            run.step()
        after = state()
        assert all(torch.equal(before[0][n], t) for n, t in after[0].items()), "a weight changed"
        assert all(torch.equal(before[1][k], t) for k, t in after[1].items()), "the optimizer state changed"
        optimizer.param_groups.pop()  # taken out again: training goes on
        train(run, steps=1)


def test_the_zoo_models_blocks_are_sharded_one_by_one(one_rank):
    setup = Case("blocks", "dict", "mask", "shuffled", "adam").build()
    run = accel.accelerate(setup.model, setup.optimizer, setup.loader, plan=["fsdp"], device="cpu")
    assert run.report.row("fsdp").changes["sharded"] == "2 x Residual: blocks.0, blocks.1, then the root"
    run.close()


def test_a_gradient_hook_on_a_sharded_parameter_is_named(one_rank):
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())
    run = accel.accelerate(model, optimizer, tiny_loader(), plan=["fsdp"], device="cpu")
    model.conv2.weight.register_hook(lambda grad: grad * 0.25)
    with pytest.warns(StaleWarning, match=r"gradient hook on the parameter\(s\) \['conv2.weight'\] never runs"):
        train(run, steps=1)
    run.close()


def test_close_gives_your_own_parameters_back_with_what_was_trained(one_rank):
    model = TinyGPT()
    mine = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    ids = torch.randint(0, 64, (32, 17), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=8)
    run = accel.accelerate(model, optimizer, loader, plan=["fsdp"], device="cpu")
    assert type(model).__name__ == "FSDPTinyGPT" and run.unwrap() is model
    assert all(p is not mine[n] for n, p in model.named_parameters())  # the shards, while the run is open
    assert optimizer.param_groups[0]["params"][0] is model.tokens.weight  # in your optimizer, in place
    for x, y in run.loader:
        loss = torch.nn.functional.cross_entropy(run.model(x).flatten(0, 1), y.flatten())
        run.backward(loss)
        run.step()
    trained = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    run.close()
    assert type(model) is TinyGPT and model.head.weight is model.tokens.weight  # the tie, back
    assert all(p is mine[n] for n, p in model.named_parameters())
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    assert [p for g in optimizer.param_groups for p in g["params"]] == list(mine.values())
    state = optimizer.state[model.tokens.weight]
    assert type(state["exp_avg"]) is torch.Tensor and state["exp_avg"].shape == model.tokens.weight.shape
    model(ids[:2, :-1]).sum().backward()  # an ordinary module again
    assert model.tokens.weight.grad is not None


class Fails(Accelerator):
    name = "fails_last"
    stage = Stage.COMPILATION

    def apply(self, ctx):
        raise RuntimeError("boom")


def test_a_plan_that_fails_after_fsdp_leaves_your_objects_as_they_were(one_rank):
    register(Fails)
    try:
        model = tiny_model()
        optimizer = torch.optim.Adam(model.parameters())
        train(accel.accelerate(model, optimizer, tiny_loader(), plan=[], device="cpu"), steps=1)  # a state to keep
        before, process = snapshot(model, optimizer), process_state()
        with pytest.raises(accel.AccelerateError, match="boom"):
            accel.accelerate(model, optimizer, tiny_loader(), plan=["fsdp", "fails_last"], device="cpu")
        assert not before.changes(snapshot(model, optimizer)) and process_state() == process
        assert type(model).__name__ == "TinyCNN" and not torch.distributed.is_initialized()
    finally:
        unregister("fails_last")


def gpt_losses(plan, steps=3):
    torch.manual_seed(0)
    model = TinyGPT()
    ids = torch.randint(0, 64, (8 * steps, 17), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=8)
    run = accel.accelerate(model, torch.optim.AdamW(model.parameters(), lr=0.01), loader, plan=plan, device="cpu")
    losses = []
    for x, y in run.loader:
        loss = torch.nn.functional.cross_entropy(run.model(x).flatten(0, 1), y.flatten())
        run.backward(loss)
        run.step()
        losses.append(loss.item())
    return losses, model, run


def test_regional_compile_compiles_each_block_in_place_and_trains_the_same():
    torch._dynamo.reset()
    eager, _, plain = gpt_losses([])
    plain.close()
    compiled, model, run = gpt_losses({"compile": {"backend": "eager", "regional": True}})
    assert compiled == eager
    assert run.model is model and "2 x Block compiled in place" in run.report.row("compile").changes["regions"]
    assert model.blocks[0]._compiled_call_impl is not None
    run.close()
    assert model.blocks[0]._compiled_call_impl is None
    run = accel.accelerate(torch.nn.Linear(2, 2), None, None, plan={"compile": {"regional": True, "backend": "eager"}})
    assert "no repeated block" in run.report.row("compile").reason
    run.close()


def checkpointed_run(tmp_path):
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    ids = torch.randint(0, 64, (32, 17), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=8)
    run = accel.accelerate(model, optimizer, loader, plan=["fsdp"], device="cpu")
    for x, y in run.loader:
        run.backward(torch.nn.functional.cross_entropy(run.model(x).flatten(0, 1), y.flatten()))
        run.step()
    return run


def test_a_sharded_checkpoint_is_whole_or_refused_by_name(one_rank, tmp_path):
    run = checkpointed_run(tmp_path)
    folder = tmp_path / "ckpt"
    run.save(folder)
    assert (folder / "latest").read_text().strip() == "step-000000004"
    step = folder / "step-000000004"
    assert {p.name for p in step.iterdir()} == {".metadata", "__0_0.distcp", "accel.pt"}
    assert run.load(folder)["step"] == 4
    run.save(folder)  # the same step again (a restart): a new folder, the whole one never deleted before
    assert (folder / "latest").read_text().strip() == "step-000000004-2" and not step.exists()
    step = folder / "step-000000004-2"
    # a save that died mid-way leaves a .partial folder: latest still names the whole one
    (folder / ".step-000000005.partial").mkdir()
    assert run.load(folder)["path"] == str(step)
    with pytest.raises(CheckpointError, match="a save that did not finish"):
        run.load(folder / ".step-000000005.partial")
    shard = step / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match=r"__0_0.distcp differs from what was saved"):
        run.load(folder)
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"torn checkpoint: __0_0.distcp is missing"):
        run.load(folder)
    (step / "accel.pt").unlink()
    with pytest.raises(CheckpointError, match="torn checkpoint: no accel.pt"):
        run.load(step)
    with pytest.raises(CheckpointError, match="single-file checkpoint"):
        (tmp_path / "file.pt").write_bytes(b"x")
        run.load(tmp_path / "file.pt")
    run.close()


def test_a_sharded_checkpoint_loads_into_one_process_without_fsdp(one_rank, tmp_path, monkeypatch):
    run = checkpointed_run(tmp_path)
    run.save(tmp_path / "ckpt")
    trained = {k: v.full_tensor().clone() for k, v in run.unwrap().state_dict().items()}
    run.close()
    for key in LAUNCHER_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    model = TinyGPT()
    single = accel.accelerate(model, torch.optim.AdamW(model.parameters(), lr=0.01), None, plan=[], device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DCP's "assuming a single process" is expected and kept quiet
        assert single.load(tmp_path / "ckpt")["step"] == 4
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items()) and single.steps == 4


# --- 2 real gloo ranks ------------------------------------------------------------------------------------------

def launched(tmp_path, name, *args, nproc=2, restarts=0):
    out = tmp_path / name
    result = torchrun("train_fsdp.py", "--out", out, *args, nproc=nproc, restarts=restarts, timeout=240)
    assert result.returncode == 0, output(result)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(nproc)]


def reference(tmp_path, name, *args):
    out = tmp_path / name
    result = run([sys.executable, str(SCRIPTS / "train_fsdp.py"), "--out", out, "--reference", *map(str, args)],
                 timeout=120)
    assert result.returncode == 0, output(result)
    return torch.load(out / "rank0.pt", weights_only=False)


def assert_weights_close(ranks, single, atol=1e-5):
    for rank in ranks:
        for name, tensor in single["params"].items():
            if name.endswith(("running_mean", "running_var", "num_batches_tracked")):
                continue  # FSDP2 keeps buffers per rank: each rank's BatchNorm saw its own half
            torch.testing.assert_close(rank["params"][name], tensor, rtol=0, atol=atol, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("model, optimizer", [("gpt", "sgd"), ("cnn", "sgd"), ("gpt", "adamw")])
def test_two_ranks_train_as_one_process_on_the_global_batch(tmp_path, model, optimizer):
    """SGD first: Adam's update hardly changes when every gradient is doubled, and torch 2.8's gloo doubled them
    (its reduce-scatter summed under ReduceOp.AVG; fsdp now reduces with SUM and divides): with AdamW the GPT
    matched to 4.5e-4 only, with SGD the first step was 2x the single process's on every parameter."""
    ranks = launched(tmp_path, "fsdp", "--model", model, "--optimizer", optimizer)
    assert_weights_close(ranks, reference(tmp_path, "single", "--model", model, "--optimizer", optimizer))
    for rank in ranks:
        changes = rank["report"]["accelerators"][0]["changes"]
        assert changes["world"].startswith("2 ranks") and changes["sharded"].startswith("2 x ")
        assert rank["closed_ok"] and rank["optimizer_holds_originals"]  # close(): your parameters, trained
        assert changes["gradient_reduction"].startswith("sum, then divided")  # gloo
    base = 0.003 if optimizer == "adamw" else 0.1
    assert ranks[0]["lr"] == pytest.approx(base / 7)  # your LambdaLR, built before accelerate(), drove it


@pytest.mark.slow
def test_accumulation_and_clipping_under_fsdp_equal_one_process(tmp_path):
    plan = {"fsdp": {}, "grad_accumulation": {"steps": 2}, "grad_clipping": {"max_norm": 0.05}}
    ranks = launched(tmp_path, "fsdp", "--plan", json.dumps(plan), "--optimizer", "sgd")
    assert_weights_close(ranks, reference(tmp_path, "single", "--accumulate", 2, "--clip", 0.05, "--optimizer", "sgd"))


@pytest.mark.slow
def test_amp_and_compile_compose_with_fsdp(tmp_path):
    plan = {"fsdp": {}, "amp": {"dtype": "bfloat16"}, "compile": {"backend": "eager"}}
    ranks = launched(tmp_path, "fsdp", "--plan", json.dumps(plan))
    rows = {row["name"]: row for row in ranks[0]["report"]["accelerators"]}
    assert rows["fsdp"]["changes"]["mixed_precision"] == "param_dtype=bfloat16, reduce_dtype=float32"
    assert "(the blocks FSDP2 sharded)" in rows["compile"]["changes"]["regions"]
    single = reference(tmp_path, "single")
    torch.testing.assert_close(torch.tensor(ranks[0]["losses"]), torch.tensor(single["losses"]), rtol=2e-2, atol=0)
    assert_weights_close(ranks, single, atol=2e-2)  # bf16 compute: amp's card


def saved_and_loaded(ranks_saved, ranks_loaded):
    for loaded in ranks_loaded:
        assert loaded["resumed_from"] == 3
        for name, tensor in ranks_saved[0]["params"].items():
            assert torch.equal(loaded["params"][name], tensor), name
        for index, state in ranks_saved[0]["optimizer"].items():
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(loaded["optimizer"][index][key]), torch.as_tensor(value)), key


@pytest.mark.slow
def test_a_checkpoint_of_two_ranks_loads_in_one_bit_for_bit_and_back(tmp_path):
    two = launched(tmp_path, "two", "--steps", 3, "--ckpt", tmp_path / "from2", "--save-every", 3)
    saved_and_loaded(two, launched(tmp_path, "one", "--steps", 3, "--ckpt", tmp_path / "from2", "--resume", nproc=1))
    one = launched(tmp_path, "one_saves", "--steps", 3, "--batch-size", 16, "--ckpt", tmp_path / "from1",
                   "--save-every", 3, nproc=1)
    saved_and_loaded(one, launched(tmp_path, "two_loads", "--steps", 3, "--ckpt", tmp_path / "from1", "--resume"))


@pytest.mark.slow
def test_a_killed_rank_resumes_from_the_last_sharded_checkpoint_with_no_step_lost(tmp_path):
    whole = launched(tmp_path, "whole")
    resumed = launched(tmp_path, "resumed", "--ckpt", tmp_path / "ckpt", "--save-every", 1, "--resume",
                       "--kill-rank", 1, "--kill-step", 4, "--marker", tmp_path / "killed", restarts=1)
    assert (tmp_path / "killed").exists()
    for rank in resumed:
        assert rank["resumed_from"] == 4 and rank["steps"] == 6
        for name, tensor in whole[0]["params"].items():
            assert torch.equal(rank["params"][name], tensor), name


@pytest.mark.slow
@pytest.mark.parametrize("unfreeze", ["model", "originals"])
def test_two_ranks_train_a_group_added_later_over_your_own_parameters(tmp_path, unfreeze):
    """Issue 25, case 6: the late block's shards train on both ranks as the plain loop on the global batch trains
    it, and run.close() leaves the trained values in the Parameter objects you added."""
    result = torchrun("late_group_fsdp.py", "--out", tmp_path, "--unfreeze", unfreeze, timeout=240)
    assert result.returncode == 0, output(result)
    for r in range(2):
        rank = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        assert rank["report"]["accelerators"][0]["changes"]["world"].startswith("2 ranks")
        for name, tensor in rank["plain"].items():
            torch.testing.assert_close(rank["trained"][name], tensor, rtol=0, atol=1e-5, msg=name)  # the card's 1e-5
        late = [n for n in rank["plain"] if n.startswith("blocks.1.")]
        assert len(late) == len(rank["closed"]) and all(rank["yours_back"]) and all(rank["trainable"])
        for name, mine, before in zip(late, rank["closed"], rank["before"]):
            assert torch.equal(mine, rank["trained"][name]), name  # your own Parameters, trained
        assert not any(torch.equal(mine, before) for mine, before in zip(rank["closed"], rank["before"]))


# --- plan="auto" under a launcher: ddp or fsdp by memory fit (accel.distributed.agreement) ----------------------


def test_the_footprint_counts_adam_state_as_it_will_be_and_as_it_is():
    from accel.distributed.agreement import footprint

    model = tiny_model()
    model.conv1.requires_grad_(False)  # frozen: no gradient, no state
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    before = footprint(model, optimizer)
    x, y = next(iter(tiny_loader()))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    after = footprint(model, optimizer)
    assert before.parameters == after.parameters == sum(p.numel() * 4 for p in model.parameters())
    assert before.gradients == sum(p.numel() * 4 for p in model.parameters() if p.requires_grad) < before.parameters
    assert before.optimizer == after.optimizer == 2 * before.gradients  # exp_avg and exp_avg_sq, measured after
    assert "2 tensor(s)" in before.how and "as it is" in after.how
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    assert footprint(model, plain).optimizer == 0


@pytest.mark.parametrize("room, expected", [(4.0, {"ddp": {}}), (1.2, {"fsdp": {}}), (0.5, {"fsdp": {}})])
def test_ddp_where_the_state_fits_fsdp_where_only_its_shard_does(room, expected):
    from accel.distributed.agreement import choose, footprint

    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())
    memory = int(room * footprint(model, optimizer).total)
    chosen, why = choose(model, optimizer, torch.device("cpu"), world_size=2, local_world_size=2, memory=memory)
    assert chosen == expected
    assert ("it fits" in why) == (room == 4.0) and ("may not fit" in why) == (room == 0.5), why


@pytest.mark.slow
@pytest.mark.parametrize("room, expected", [("fits", ["ddp"]), ("shards", ["fsdp"])])
def test_auto_under_torchrun_picks_by_memory_and_both_ranks_agree(room, expected, tmp_path):
    result = torchrun("auto_ranks.py", room, tmp_path, timeout=240)
    assert result.returncode == 0, output(result)
    ranks = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert len(ranks) == 2, output(result)
    for rank in ranks:
        assert rank["plan"] == expected and rank["same"] and rank["steps"] > 0, rank
        assert rank["gloo_threads"] == [], rank  # its wrapper, mesh and rank agreement let go of the group
        assert rank["why"].startswith(expected[0]), rank["why"]
        assert f"every plan measured ran with {expected[0]} (by memory fit)" in rank["why"], rank["why"]
        assert "memory fit" in rank["report"] and ("it fits" in rank["report"]) == (room == "fits"), rank["report"]


# --- accumulation through the run's services (gradient_sync, held_gradients), whatever the loop enters -----------

def reduce_flags(model):
    """FSDP2's gradient-sync flag of every sharded module's param groups (torch 2.15: a list per module)."""
    flags = []
    for module in model.modules():
        if hasattr(module, "_get_fsdp_state"):
            state = module._get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
            flags += [group.reduce_grads for group in groups if group is not None]
    return flags


def gpt_run(plan, batches=6):
    model = TinyGPT()
    ids = torch.randint(0, 64, (8 * batches, 17), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, loader, accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")


def gpt_step(run, x, y):
    run.backward(torch.nn.functional.cross_entropy(run.model(x).flatten(0, 1), y.flatten()))
    held = len(run.held_gradients())
    return held, not run.step()


def test_accumulating_without_run_autocast_fsdp_reduces_on_the_last_micro_batch_only(one_rank):
    """The run turns FSDP's reduction off at its start and after every run.step() while grad_accumulation
    accumulates: the first N-1 micro-batches' forward and backward keep their gradients unreduced (held by FSDP:
    run.held_gradients()), the N-th reduces them all; the loop never enters run.autocast()."""
    model, _, _, run = gpt_run({"fsdp": {}, "grad_accumulation": {"steps": 3}})
    try:
        assert sharded_blocks(model) == list(model.blocks)  # what compile, applied later, compiles one by one
        assert run.report.row("fsdp").changes["sharded"].startswith("2 x Block: ")
        seen = []
        for x, y in run.loader:
            flags = set(reduce_flags(model))
            seen.append((flags, run.accumulating, *gpt_step(run, x, y)))
        unreduced = ({False}, True)
        assert [s[:2] for s in seen] == [unreduced, unreduced, ({True}, False)] * 2
        assert [held > 0 for _, _, held, _ in seen] == [True, True, False] * 2  # none held once reduced
        assert [stepped for *_, stepped in seen] == [False, False, True] * 2
    finally:
        run.close()


def test_closed_in_the_middle_of_accumulating_the_model_is_yours_again(one_rank):
    """FSDP2 keeps its gradient-sync flag in the state fully_shard put on your modules: close() takes it off with the
    sharding, so nothing of it stays on your model."""
    from torch.distributed._composable_state import _module_state_mapping

    model, optimizer, loader, run = gpt_run({"fsdp": {}, "grad_accumulation": {"steps": 3}})
    x, y = next(iter(run.loader))
    assert gpt_step(run, x, y)[0] > 0 and set(reduce_flags(model)) == {False}
    run.close()
    assert type(model) is TinyGPT and not reduce_flags(model)
    assert not any(m in _module_state_mapping for m in model.modules())
    model(x).sum().backward()  # an ordinary module again
    assert model.tokens.weight.grad is not None


def weights_after_one_accumulated_step(refuse_midway: list) -> dict[str, torch.Tensor]:
    """3 micro-batches of fsdp + grad_accumulation 3 from the same start; before the 2nd, accelerate() again with
    each plan of refuse_midway (each must be refused). The weights once the optimizer stepped, gathered."""
    torch.manual_seed(0)
    plan = {"fsdp": {}, "grad_accumulation": {"steps": 3}}
    model, optimizer, loader, run = gpt_run(plan)
    try:
        batches = iter(run.loader)
        held, stepped = gpt_step(run, *next(batches))
        assert held and not stepped
        for other in refuse_midway:
            with pytest.raises(accel.PlanError, match=r"accelerate\(\) again in the middle of accumulating "
                                                      r"gradients under fsdp") as refused:
                accel.accelerate(model, optimizer, loader, plan=other, device="cpu")
            assert "run.step() returned False" in str(refused.value)
            assert not run.closed and run.accumulating and set(reduce_flags(model)) == {False}  # untouched
        held, stepped = gpt_step(run, *next(batches))
        assert held and not stepped
        assert gpt_step(run, *next(batches)) == (0, True)
    finally:
        run.close()  # gathers the trained weights back into the model
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_a_refused_accelerate_mid_accumulation_keeps_the_gradients_fsdp_holds(one_rank):
    """FSDP2 holds the first micro-batches' gradients unreduced in its own buffers; closing the run drops them. A
    second accelerate() mid-accumulation, with fsdp again or any other plan, is refused before the earlier run is
    closed, so its step still sums all 3 micro-batches: the weights equal those of the same training with no such
    call, bit for bit."""
    plain = weights_after_one_accumulated_step([])
    refused = weights_after_one_accumulated_step([{"fsdp": {}, "grad_accumulation": {"steps": 3}}, ["amp"], None])
    assert plain.keys() == refused.keys()
    for name in plain:
        assert torch.equal(plain[name], refused[name]), name


def test_accelerate_again_mid_accumulation_is_refused_and_the_earlier_run_goes_on_unreduced(one_rank):
    """A new run cannot take over the gradients FSDP holds unreduced; the earlier run goes on with its reduction
    off as its run last said; at an optimizer step accelerate() again goes through."""
    plan = {"fsdp": {}, "grad_accumulation": {"steps": 3}}
    model, optimizer, loader, run = gpt_run(plan)
    try:
        batches = iter(run.loader)
        gpt_step(run, *next(batches))
        with pytest.raises(accel.PlanError, match=r"accelerate\(\) again in the middle of accumulating gradients"):
            accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
        assert not run.closed and run.accumulating and set(reduce_flags(model)) == {False}
        held, stepped = gpt_step(run, *next(batches))
        assert held and not stepped
        assert gpt_step(run, *next(batches)) == (0, True)
        run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")  # the earlier one handed over
        assert run.state("grad_accumulation").micro == 0
        assert run.accumulating and set(reduce_flags(model)) == {False}
    finally:
        run.close()


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_half_migrated_loop_steps_on_the_gradients_fsdp_held_while_accumulating(one_rank, optimizer):
    """Found by the zoo (tests/test_equivalence.py): the loop's own loss.backward() and optimizer.step() under
    fsdp + grad_accumulation. The first backward ran with reduction off, so FSDP2 kept its gradients unsharded; the
    loop's own step then found no .grad on the shards and stepped them a batch late, which momentum and Adam carried
    on (weights 5e-4 and 4e-2 off). They are reduced into the shards before that step now (2 ranks: test_bypass.py)."""
    case = Case("batchnorm", "tuple", "none", "plain", optimizer, loop="half_migrated")
    result = check_equivalence([{"fsdp": {}}, {"grad_accumulation": {"steps": 2}}], case.build, steps=3)
    assert result.ok and result.applied == ["grad_accumulation", "fsdp"], result
