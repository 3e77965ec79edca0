"""accel/distributed/agreement.py: the ranks of in-loop auto agree (the slowest rank's times, rank 0's decisions), and a
search holds the process group across its plan switches. Real 2-process gloo runs on loopback."""
import json

import pytest
from scripts.launching import output, torchrun

from accel.distributed.agreement import ChunkTimes, GroupHold, RankAgreement


def test_a_single_process_agrees_with_itself_without_a_collective():
    agreement = RankAgreement.current()
    assert (agreement.world_size, agreement.rank) == (1, 0)
    assert agreement.chunk(ChunkTimes(0.3, (0.1, 0.2), nonfinite=True)) == ChunkTimes(0.3, (0.1, 0.2), True)
    assert agreement.decide("settle") == "settle" and agreement.past(deadline=2.0, now=1.0) is False
    assert agreement.any_true(False) is False and agreement.slowest(0.5) == 0.5
    with GroupHold() as hold:
        assert not hold.held  # no launcher: nothing to hold


@pytest.mark.slow
def test_two_ranks_agree_and_the_held_group_survives_plan_switches(tmp_path):
    result = torchrun("rank_agreement.py", tmp_path, timeout=240)
    assert result.returncode == 0, output(result)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for info in ranks:
        assert info["initialized_before"] is False  # the group is accel's (the hold made it)
        # the first run closed while held: the group was neither destroyed nor made again
        assert info["between"] == {"initialized": True, "same_world": True}, info
        assert info["after_second"] == {"initialized": True, "same_world": True}, info
        assert info["group_inits_while_held"] == 0
        assert info["second_plan"] == ["grad_clipping", "ddp"], info["second_plan"]
        assert info["weights_identical"] and info["trained_on"]
        # different local times: every rank takes the slowest, step by step, and any rank's non-finite loss
        assert info["agreed"] == {"seconds": 2.0, "step_s": [0.2, 0.5], "nonfinite": True}
        assert info["decision"] == {"next_plan": {"amp": {}}, "verdict": "faster"}  # rank 0's, on both
        assert info["past_deadline"] is True and info["any_nonfinite"] is True and info["slowest"] == 0.5
        assert "different numbers of steps" in info["diverged"]
        assert info["after_release"] == {"initialized": False}  # released: the process is as before


@pytest.mark.slow
def test_two_ranks_search_in_their_own_loop_in_step(tmp_path):
    """plan="auto" in the loop under a launcher: both ranks run the same arm at every step (ddp in each), settle at
    the same step on the same plan, train identical weights, and the group is made once and kept across switches."""
    result = torchrun("inloop_ranks.py", tmp_path, timeout=300)
    assert result.returncode == 0, output(result)
    first, second = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert first["plans"] == second["plans"]  # the same arm on both ranks, step by step
    assert all("ddp" in plan for plan in first["plans"])
    assert len({tuple(plan) for plan in first["plans"]}) == 3  # the plain loop and both candidates took turns
    assert first["settled_at"] is not None and first["settled_at"] == second["settled_at"]  # one decision
    assert first["chosen"] == second["chosen"] and "ddp" in first["chosen"]
    assert first["rows"] == second["rows"] and ["ddp", "memory fit"] in first["rows"]
    assert "the same plan on every rank at every step" in first["why"]
    for rank in (first, second):
        assert rank["weights_identical"] and rank["group_inits"] == 1 and rank["same_world"]
        assert rank["initialized_after_close"] is False  # accel made the group; closing the run let it go


def test_two_ranks_searching_in_their_loop_report_and_keep_the_wrapper_every_plan_ran_with(tmp_path):
    """The wrapper is decided once by memory fit, before the first step: every plan ran with fsdp (ASGD's state,
    estimated as Adam's, does not fit whole). The answer decided it again after the steps, from the state as it is
    (it fits: ddp): its table and plan said ddp, and the switch to that plan, with fsdp carried beside ddp, was
    refused, so a candidate the search never chose (channels_last+fsdp) stayed in place for the rest of the run."""
    result = torchrun("inloop_ranks.py", tmp_path, "ASGD", timeout=300)
    assert result.returncode == 0, output(result)
    for rank in [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]:
        assert all("fsdp" in plan for plan in rank["plans"]), rank["plans"]
        assert ["fsdp", "memory fit"] in rank["rows"] and rank["in_place"] == rank["chosen"], rank
        assert rank["why"].startswith("fsdp: ") and rank["weights_identical"], rank["why"]
