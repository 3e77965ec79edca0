"""Every loop of the corpus (faithful small ports of upstream training loops), plain and through every plan it
admits: each built-in alone, in the configuration below, and a stack of them; held to the cards by the harness the
zoo uses (accel.testing.check_equivalence). A plan may be refused up front only for a reason the port names."""
import importlib
import warnings

import pytest
import torch

from accel.testing import check_equivalence

PORTS = ["examples_mnist", "examples_word_language_model", "examples_dcgan", "examples_imagenet", "examples_vae",
         "hf_run_clm", "hf_run_glue", "timm_train", "vision_classification", "diffusers_unconditional", "peft_lora",
         "nanogpt_train", "examples_fast_neural_style", "vision_detection"]
PLANS = {  # each built-in the corpus runs (ipex: the ipex session; ddp, fsdp: launched jobs, tests/test_ddp.py ...)
    "threads": {"threads": 1}, "loader": {"num_workers": 1}, "channels_last": {}, "fused_optimizer": {},
    "amp": {"dtype": "bfloat16"}, "activation_checkpointing": {},
    "compile": {"backend": "aot_eager"}, "grad_accumulation": {"steps": 2}, "grad_clipping": {"max_norm": 1.0},
    "prune": {},
}
STACK = [{"threads": {"threads": 1}}, "channels_last", "fused_optimizer", {"amp": {"dtype": "bfloat16"}},
         "activation_checkpointing", {"grad_clipping": {"max_norm": 1.0}}]
PRUNE_REFUSES = ("no module of type", "dummy_input", "torch.fx cannot trace", "cannot run")  # prune's default selects
# Conv2d layers, from an (inputs, ...) batch, through torch.fx: transformers and LSTMs have none of the three
KNOWN: dict[tuple[str, str], str] = {}  # what the corpus found that is not fixed yet, each a strict xfail


def plan_of(name: str, module=None) -> list:
    """The built-in in the corpus's configuration, or in the one the port names (``OPTIONS``, with its reason)."""
    return [{name: getattr(module, "OPTIONS", {}).get(name, PLANS[name])}]


def stack_of(module) -> list:
    """The stack, less what the port refuses (a GPT-2 keeping its KV cache refuses activation_checkpointing)."""
    return [entry for entry in STACK if (entry if isinstance(entry, str) else next(iter(entry))) not in module.REFUSES]


SLOW = ("compile", "prune")  # dynamo's tracing, NNI's passes: seconds each


@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p
                                  for p in [*PLANS, "stack"]])
@pytest.mark.parametrize("port", PORTS)
def test_the_loop_trains_as_upstream_through_every_plan_it_admits(port, plan, request):
    if (port, plan) in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[port, plan], strict=True))
    module = importlib.import_module(f"corpus.{port}")
    if plan == "compile":
        torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (emulated bf16 and fp16 on this CPU, transformers' config notes)
        result = check_equivalence(stack_of(module) if plan == "stack" else plan_of(plan, module), module.build,
                                   steps=2)
    if result.refused:
        names = [p.split(":")[0].strip(" -").split(".")[0] for p in result.refused.splitlines()[1:]]
        allowed = [reason for name in names for reason in (*module.REFUSES.get(name, ()),
                                                            *(PRUNE_REFUSES if name == "prune" else ()))]
        assert names and all(any(r in line for r in allowed) for line in result.refused.splitlines()[1:]), result
    if result.failed and plan in getattr(module, "FAILS", {}):  # said and rolled back: a limit of the library beneath
        assert module.FAILS[plan] in result.failed, result
        return
    assert result.failed is None, result
    for name, why in getattr(module, "SKIPS", {}).items():  # standing aside, and saying why
        if plan in (name, "stack") and name in result.plan:
            assert why in result.skipped.get(name, ""), result
    assert not result.objects_changed and not result.process_changed, result
    assert not result.differences, result
