"""A real Ctrl-C while a sharded run.save has torch create a fresh optimizer's state (get_state_dict steps it once with
every group's lr at 0, and sets the lr back after): the learning rate stayed 0 for the rest of the training, silently
(found by ATK18)."""
import pytest
from injectors import count_calls, signal_at
from test_attack18_sharded_fresh_optimizer import fsdp_run
from torch.distributed.checkpoint.state_dict import _init_optim_state


@pytest.mark.slow
def test_a_ctrl_c_while_torch_creates_the_optimizers_state_leaves_your_learning_rate(tmp_path, one_rank):
    """get_state_dict sets every group's lr to 0 for its creating step and back after it: a Ctrl-C in between left
    your optimizer at lr 0 (and holding the state it made) for the rest of the training."""
    for name in ("warm", "counted"):  # the first step imports and warms what the next ones only call
        run = fsdp_run()
        points = count_calls(lambda: run.save(tmp_path / name), within=_init_optim_state)
        run.close()
    assert points > 0, "run.save no longer creates the state through torch's _init_optim_state: count where it does"
    for point in sorted({1 + (points - 1) * k // 7 for k in range(8)}):
        run = fsdp_run()
        try:
            with pytest.raises(KeyboardInterrupt), signal_at(point, within=_init_optim_state):
                run.save(tmp_path / f"at-{point}")
            assert [g["lr"] for g in run.optimizer.param_groups] == [0.1], f"interrupted at {point} of {points}"
            assert not run.optimizer.state
        finally:
            run.close()
