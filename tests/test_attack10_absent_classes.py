"""attack10: class names that match no module are refused with names the model has as the example (a model with no
repeated block was told 'e.g. Bottleneck' / 'e.g. TransformerBlock', classes it lacks), in a message of bounded
size however many names were given."""
from __future__ import annotations

import pytest
import torch
from scripts.launching import one_rank_env

import accel
from accel.errors import PlanError
from accel.testing import tiny_loader, tiny_model


@pytest.mark.parametrize("accelerator, field", [("activation_checkpointing", "modules"), ("fsdp", "blocks")])
def test_names_matching_nothing_are_refused_with_the_models_own_classes_in_a_short_message(monkeypatch, accelerator,
                                                                                           field):
    for key, value in one_rank_env().items():  # fsdp's launcher found: only the names are wrong
        monkeypatch.setenv(key, value)
    model = tiny_model()  # no class of block occurs twice
    present = {type(m).__name__ for m in model.modules()}
    names = ["Блок", *(f"Missing{i}" for i in range(20_000))]
    with pytest.raises(PlanError) as refused:
        accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                         plan={accelerator: {field: names}}, device="cpu")
    problem, = [p for p in refused.value.problems if p.field == field]
    example = problem.allowed.removeprefix("class names of the model's modules, e.g. ").split(", ")
    assert example and set(example) <= present, problem.allowed
    assert problem.message.startswith("no module of class [") and len(str(refused.value)) < 2_000
    assert not torch.distributed.is_initialized()
