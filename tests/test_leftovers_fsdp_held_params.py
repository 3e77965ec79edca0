"""Under fsdp the model trains shards in place of your parameters, and the Parameters you took before accelerate()
(``params = list(model.parameters())``, for the optimizer and for clipping) kept ``.grad`` None: autograd never
reaches them. ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` saw no gradient, returned 0 and clipped nothing,
silently: the loop trained unclipped. Their ``.grad`` is now their shard's, after run.backward() and after the loop's
own loss.backward() alike, so clipping them clips what trains, as in the plain loop."""
import sys

import pytest
import torch
from torch import nn

import accel
from accel.testing import tiny_loader, tiny_model

MAX_NORM = 0.05  # well under the gradients' norm: every step is clipped


def batches(steps=3):
    return [batch for _, batch in zip(range(steps), tiny_loader())]


def plain():
    """The plain loop: the weights and the norms clip_grad_norm_ returned, each step."""
    model = tiny_model()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    norms = []
    for x, y in batches():
        nn.functional.cross_entropy(model(x), y).backward()
        norms.append(float(nn.utils.clip_grad_norm_(params, MAX_NORM)))
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict(), norms


def whole(norm):
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


@pytest.mark.parametrize("backward", ["run.backward", "loss.backward"])
def test_clipping_the_parameters_you_took_before_fsdp_clips_what_trains(one_rank, backward):
    expected, expected_norms = plain()
    model = tiny_model()
    params = list(model.parameters())  # taken before accelerate(): yours, not the shards that train
    optimizer = torch.optim.SGD(params, lr=0.1)
    run = accel.accelerate(model, optimizer, None, plan=["fsdp"], device="cpu")
    norms = []
    try:
        for x, y in batches():
            loss = nn.functional.cross_entropy(run.model(x), y)
            if backward == "run.backward":
                run.backward(loss)
            else:  # the loop's own backward and step
                loss.backward()
            norms.append(whole(nn.utils.clip_grad_norm_(params, MAX_NORM)))
            if backward == "run.backward":
                run.step()
            else:
                optimizer.step()
                optimizer.zero_grad()
    finally:
        run.close()
    assert norms == pytest.approx(expected_norms, rel=1e-4)
    trained = model.state_dict()
    assert all(torch.allclose(trained[k], v, rtol=1e-4, atol=1e-6) for k, v in expected.items())
    assert all(p.grad is None for p in params)  # given back as close() gives them: without the shards' gradients


RANKS = """
import sys, warnings
import torch
from torch import nn
import accel
from accel.testing import tiny_loader, tiny_model
warnings.simplefilter("ignore")
model = tiny_model()
params = list(model.parameters())
optimizer = torch.optim.SGD(params, lr=0.1)
run = accel.accelerate(model, optimizer, None, plan=[{"fsdp": {"shard_loader": False}}], device="cpu")
norms = []
for _, (x, y) in zip(range(3), tiny_loader()):  # every rank the same batch: the plain loop's, each shard's part
    run.backward(nn.functional.cross_entropy(run.model(x), y))
    norm = nn.utils.clip_grad_norm_(params, float(sys.argv[2]))
    norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
    run.step()
run.close()
torch.save({"norms": norms, "model": model.state_dict()}, sys.argv[1] + f"/{run.decisions.rank}.pt")
"""


@pytest.mark.slow
def test_with_two_ranks_clipping_your_parameters_clips_each_shard_by_the_whole_norm(tmp_path):
    from scripts.launching import free_port, output, run

    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    result = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
                  f"--master-port={free_port()}", str(script), str(tmp_path), str(MAX_NORM)], timeout=240)
    assert result.returncode == 0, output(result)
    expected, expected_norms = plain()
    for rank in (0, 1):
        saved = torch.load(tmp_path / f"{rank}.pt", weights_only=True)
        assert saved["norms"] == pytest.approx(expected_norms, rel=1e-4)
        assert all(torch.allclose(saved["model"][k], v, rtol=1e-4, atol=1e-6) for k, v in expected.items())
