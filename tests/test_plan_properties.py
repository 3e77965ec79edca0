"""Property tests: any plan, valid or not, in any listing order, resolves to one stage order or fails whole."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import accel
from accel import Plan, PlanError
from accel.plan.contract import REGISTRY
from accel.testing import snapshot, tiny_loader, tiny_model, tiny_optimizer

GOOD_OPTIONS = {
    "threads": [{}, {"threads": 1}, {"affinity": False}],
    "loader": [{}, {"num_workers": 0}, {"pin_memory": "auto", "prefetch_factor": 2}],
    "amp": [{}, {"dtype": "bfloat16"}, {"dtype": "fp16", "grad_scaler": "auto"}],
    "channels_last": [{}, {"optional": True}],
    "compile": [{}, {"mode": "default"}, {"fullgraph": True, "dynamic": False}],
}
BAD_OPTIONS = [{"threads": 0}, {"num_workers": "many"}, {"dtype": 16}, {"mode": "warp"}, {"nonsense": 1},
               {"optional": "yes"}]
BAD_NAMES = ["compiel", "amp2", "", "threads "]

good_entry = st.sampled_from(sorted(GOOD_OPTIONS)).flatmap(
    lambda name: st.sampled_from(GOOD_OPTIONS[name]).map(lambda options: {name: options}))
bad_entry = st.one_of(
    st.sampled_from(BAD_NAMES).map(lambda name: {name: {}}),
    st.tuples(st.sampled_from(sorted(GOOD_OPTIONS)), st.sampled_from(BAD_OPTIONS)).map(lambda t: {t[0]: t[1]}),
)


def unique_names(entries):
    names = [next(iter(e)) for e in entries]
    return len(names) == len(set(names))


@settings(max_examples=150, deadline=None)
@given(st.lists(good_entry, max_size=5).filter(unique_names), st.randoms(use_true_random=False))
def test_valid_plans_resolve_to_the_same_stage_order_whatever_the_listing(entries, random):
    shuffled = list(entries)
    random.shuffle(shuffled)
    plan, again = Plan(entries), Plan(shuffled)
    assert plan.names() == again.names()
    keys = [(int(REGISTRY[n].stage), n) for n in plan.names()]
    assert keys == sorted(keys)
    assert Plan(plan.to_dict()) == plan


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(good_entry, max_size=3), st.lists(bad_entry, min_size=1, max_size=3), st.randoms(use_true_random=False))
def test_invalid_plans_raise_one_plan_error_and_leave_the_objects_untouched(good, bad, random):
    entries = good + bad
    random.shuffle(entries)
    model, loader = tiny_model(), tiny_loader()
    optimizer = tiny_optimizer(model)
    before = snapshot(model, optimizer, loader)
    with pytest.raises(PlanError) as error:
        accel.accelerate(model, optimizer, loader, plan=entries, device="cpu")
    assert len(error.value.problems) >= 1
    assert all(str(p) in str(error.value) for p in error.value.problems)
    assert before.changes(snapshot(model, optimizer, loader)) == []
    assert model.conv1.weight.is_contiguous()
