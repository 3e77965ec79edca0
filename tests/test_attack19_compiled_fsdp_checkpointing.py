"""Your own torch.compile(model), then fsdp with activation_checkpointing on the model itself: FSDP2's hooks on its
layers make the checkpointed forward fall back to the plain one, after a warning; dynamo broke its graph at that
warning, and its resume function rebuilt the local bound method ``type(self).forward.__get__(self)`` as
``self.forward``, which is the checkpointed forward again: a RecursionError at the first step (found by
test_equivalence's fsdp cases: the 'blocks' model, the 'precompiled' loop)."""
import pytest
import torch
from zoo import Case

from accel.testing import check_equivalence


@pytest.mark.slow  # (dynamo compiles the model)
def test_checkpointing_the_root_of_a_compiled_fsdp_model_trains_as_the_plain_loop(one_rank):
    case = Case(model="blocks", batch="list", extra="mask", loader="no_batching", optimizer="rmsprop",
                loop="precompiled", seed=0)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        result = check_equivalence(["fsdp", {"activation_checkpointing": {"modules": ["Net"]}}], case.build, steps=1)
    finally:
        torch.distributed.destroy_process_group()
    assert result.failed is None and result.refused is None, result
    assert not result.differences, result
