"""accel 0.3's accelerator contract (issue 24), held against every built-in: typed options (a frozen Options
dataclass, checked all at once), per-run state returned by apply (nothing set on the accelerator after
construction), capabilities as accel.Capability members, and no accelerator reading another (static check).

Real runs, no mocks: every built-in trains a few steps with its ``example`` options (ddp and fsdp in a gloo group of
one, in this process, as torchrun --nproc-per-node 1 would start), is saved and loaded, and holds nothing but what
it was given."""
import ast
import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scripts.launching import one_rank_env
from test_layout import accelerators, imported  # the layout rules read the source the same way
from zoo import MODELS, Net

import accel
import accel.plan.contract as contract
from accel.errors import PlanError
from accel.hardware import package_version
from accel.plan.contract import REGISTRY, Accelerator, Capability, Stage, State, packages
from accel.plan.options import Option, Options
from accel.testing import process_state_restored, tiny_loader, tiny_optimizer

PACKAGE = Path(accel.__file__).parent
ACCELERATORS = PACKAGE / "accelerators"
BUILTIN = {name: cls for name, cls in sorted(REGISTRY.items()) if cls.__module__.startswith("accel.")}
# built-ins trained together: the services between them (accumulating, gradient_sync, held_gradients, grad_scaler)
STACKS = {
    "amp fp16 + grad_accumulation + grad_clipping + ddp": [{"amp": {"dtype": "float16"}},
                                                         {"grad_accumulation": {"steps": 2}},
                                                         {"grad_clipping": {"max_norm": 1.0}}, "ddp"],
    "grad_accumulation + grad_clipping + fsdp": [{"grad_accumulation": {"steps": 2}},
                                                 {"grad_clipping": {"max_norm": 1.0}}, "fsdp"],
}


def launched(plan: list) -> bool:
    """Whether the plan holds a distribution wrapper, which joins the launcher's process group."""
    names = accel.Plan(plan).names()
    return any(Capability.MODEL_DISTRIBUTED in REGISTRY[name].provides for name in names)


@dataclass
class Ran:
    """What one real run left: each applied accelerator's attributes, the report's rows, or the error it raised."""

    statuses: dict[str, str] = dataclasses.field(default_factory=dict)
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    attributes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    error: str = ""


def train(run) -> None:
    """The README's loop, reading the gradients (their norm) before each step that updates, as a logger would."""
    for x, y in run.loader:
        with run.autocast():
            loss = torch.nn.functional.cross_entropy(run.model(x), y)
        run.backward(loss)
        if not run.accumulating:
            run.unscale_gradients()
            assert [p.grad for p in run.unwrap().parameters() if p.grad is not None] + run.held_gradients()
        run.step()


def real_run(plan: list, folder: Path, workers: int = 0) -> Ran:
    """accelerate() on a small model with repeated blocks (activation_checkpointing and fsdp find them), a few
    steps of the README's loop, every service and hook the run has, a save and a load, then close()."""
    ran = Ran()
    with pytest.MonkeyPatch.context() as patch, process_state_restored():
        if launched(plan):
            for key, value in one_rank_env().items():
                patch.setenv(key, value)
        torch.manual_seed(0)
        model = Net(**MODELS["blocks"])
        run = None
        try:
            run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(num_workers=workers), plan=plan,
                                   device="cpu")
            for row in run.report.rows:
                ran.statuses[row.name], ran.reasons[row.name] = row.status, row.reason
            train(run)
            assert run.wrappers()[-1] is run.unwrap() and (run.scaler is None or run.scaler.get_scale() > 0)
            run.save(folder / "checkpoint")
            run.load(folder / "checkpoint")
            train(run)
            assert all(isinstance(run.state(a.name), State) for a in run.accelerators)
        except Exception as error:  # said by the tests that read it, with the breaches
            ran.error = f"{type(error).__name__}: {error}"
        finally:
            if run is not None:
                ran.attributes = {a.name: sorted(vars(a)) for a in run.accelerators}
                run.close()
    return ran


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, Ran]:
    """Every built-in run for real once with its example options (optional: one that cannot run here is skipped
    with the reason), and the stacks; keyed by accelerator name or stack label. One that stands aside is tried
    again on a loader with a worker (loader has nothing to change on a machine whose CPUs all compute)."""
    results = {}
    for name, cls in BUILTIN.items():
        if any(package_version(p) is None for p in packages(cls)):
            continue
        plan = [{name: {**cls.Options.example, "optional": True}}]
        results[name] = real_run(plan, tmp_path_factory.mktemp(name))
        if results[name].statuses.get(name) == "skipped":
            results[name] = real_run(plan, tmp_path_factory.mktemp(name), workers=1)
    for label, plan in STACKS.items():
        results[label] = real_run(plan, tmp_path_factory.mktemp("stack"))
    return results


# --- (a) nothing shipped breaks the contract, at import and while it runs ---------------------------------------

@pytest.mark.parametrize("name", BUILTIN)
def test_a_real_run_of_each_built_in_breaks_nothing_of_the_contract(name, ran):
    cls = BUILTIN[name]
    missing = [p for p in packages(cls) if package_version(p) is None]
    if missing:
        pytest.skip(f"{name} requires {missing}, not installed here")
    result = ran[name]
    assert not result.error, result.error
    if result.statuses.get(name) != "applied":
        pytest.skip(f"{name} stands aside here ({result.reasons.get(name)}): only its declarations were checked")


@pytest.mark.parametrize("label", STACKS)
def test_built_ins_trained_together_break_nothing_of_the_contract(label, ran):
    result = ran[label]
    assert not result.error, result.error
    assert set(result.statuses.values()) == {"applied"}, result.reasons


# --- (b) options: a frozen dataclass whose defaults construct -----------------------------------------------------

@pytest.mark.parametrize("name", BUILTIN)
def test_each_built_ins_options_are_a_frozen_dataclass_whose_defaults_construct(name):
    cls = BUILTIN[name]
    assert dataclasses.is_dataclass(cls.Options) and issubclass(cls.Options, Options), cls.Options
    assert cls.Options.__dataclass_params__.frozen, f"{cls.Options.__name__} is not frozen"
    config = cls.Options()
    fields = dataclasses.fields(config)
    undeclared = [f.name for f in fields if "option" not in f.metadata]
    assert not undeclared, f"{undeclared}: fields not declared with accel.option()"
    for field in fields:
        assert getattr(config, field.name) == field.metadata["option"].default
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, field.name, getattr(config, field.name))
    assert cls(**cls.Options.example).config == cls.Options(**cls.Options.example)


# --- (c) nothing set on an accelerator after construction ---------------------------------------------------------

@pytest.mark.parametrize("name", BUILTIN)
def test_after_a_run_an_accelerator_holds_only_what_it_was_given(name, ran):
    if name not in ran:
        pytest.skip(f"{name} requires {list(packages(BUILTIN[name]))}, not installed here")
    if name not in ran[name].attributes:
        if ran[name].error:
            pytest.fail(f"{name} could not be run: {ran[name].error}")
        pytest.skip(f"{name} stands aside here: {ran[name].reasons.get(name)}")
    assert ran[name].attributes[name] == ["config", "explicit"], ran[name].attributes[name]


@pytest.mark.parametrize("label", STACKS)
def test_after_a_stack_ran_each_accelerator_holds_only_what_it_was_given(label, ran):
    assert ran[label].attributes, ran[label].error
    for name, attributes in ran[label].attributes.items():
        assert attributes == ["config", "explicit"], (name, attributes)


# --- (d) no accelerator reads another (static) ------------------------------------------------------------------

def files_of(name: str) -> list[Path]:
    card = accelerators()[name]
    return [card, *sorted(p for p in card.parent.rglob("*.py") if p != card)] if card.name == "__init__.py" else [card]


RUN_READS = {"accelerators": "reads run.accelerators", "extras": "reads ctx.extras",
             "states": "reads another's state in run.states"}
RUN_CALLS = {"accelerator": "calls run.accelerator()", "state": "reads another's state: run.state()",
             "accelerator_state_dict": "reads another's saved state", "load_accelerator_state": "loads another's state"}


def yields_accelerators(node: ast.AST, bound: set[str]) -> bool:
    """An expression that gives other accelerator objects: run.accelerators, ctx.plan, REGISTRY, run.accelerator(),
    or a name bound from one of those."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in ("accelerators", "plan"):
            return True
        if isinstance(sub, ast.Name) and (sub.id == "REGISTRY" or sub.id in bound):
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "accelerator":
            return True
    return False


def names_in(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def own_name(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "name" and getattr(node.value, "id", None) == "self"


def its_own(node: ast.AST, parents: dict) -> bool:
    """``run.states[self.name]``, ``run.states.get(self.name)``, ``run.state(self.name)``: its own state (an earlier
    run's, say), not another's."""
    parent = parents.get(node)
    if isinstance(node, ast.Attribute) and node.attr == "states":
        if isinstance(parent, ast.Subscript):
            return own_name(parent.slice)
        call = parents.get(parent)
        return (isinstance(parent, ast.Attribute) and parent.attr == "get" and isinstance(call, ast.Call)
                and bool(call.args) and own_name(call.args[0]))
    return isinstance(node, ast.Call) and bool(node.args) and own_name(node.args[0])


def reads_of_others(tree: ast.AST) -> list[str]:
    """Where code of an accelerator reads another accelerator: the run's list of them, the context's untyped extras,
    another's state, or hasattr/getattr on an accelerator object it got from the run, the plan or the registry."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    bound = {"other", "another"}  # names bound to other accelerator objects, found to a fixpoint below
    while True:
        before = len(bound)
        for node in ast.walk(tree):
            if isinstance(node, (ast.For, ast.comprehension)) and yields_accelerators(node.iter, bound):
                bound |= names_in(node.target)
            elif isinstance(node, ast.Assign) and yields_accelerators(node.value, bound):
                bound |= {n for t in node.targets for n in names_in(t)}
        if len(bound) == before:
            break
    found = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if (isinstance(node, ast.Attribute) and node.attr in RUN_READS and isinstance(node.ctx, ast.Load)
                and not its_own(node, parents)):
            found.append(f"{where}: {RUN_READS[node.attr]} ({ast.unparse(node)})")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RUN_CALLS
                and not its_own(node, parents)):
            found.append(f"{where}: {RUN_CALLS[node.func.attr]} ({ast.unparse(node)})")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
                and node.args and yields_accelerators(node.args[0], bound)):
            found.append(f"{where}: {node.func.id}() on another accelerator ({ast.unparse(node)})")
    return found


def imports_of_others(tree: ast.AST, path: Path, own: str | None) -> list[str]:
    """Imports of accel.accelerators.X from a module of accelerator Y (X != Y), or of the package of them all."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in imported(node, path):
                parts = name.split(".")
                if parts[:2] == ["accel", "accelerators"] and (len(parts) == 2 or parts[2] != own):
                    found.append(f"line {node.lineno}: imports {name}")
    return found


@pytest.mark.parametrize("name", list(accelerators()) + ["data_parallel"])
def test_no_accelerator_reads_another(name):
    """Static, over accel/accelerators/**/*.py (and accel/distributed/data_parallel.py, the base ddp and fsdp share):
    what one accelerator offers another goes through the run's services, a decision or a capability, never a read."""
    paths = [PACKAGE / "distributed" / "data_parallel.py"] if name == "data_parallel" else files_of(name)
    own = None if name == "data_parallel" else name
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        found += [f"{path.relative_to(PACKAGE)} {f}"
                  for f in reads_of_others(tree) + imports_of_others(tree, path, own)]
    assert not found, "\n".join(found)


def test_the_static_check_sees_what_it_is_for():
    """The check itself, on code that reads others in each way it forbids, and on code that does not."""
    bad = '''
from accel.accelerators.amp import Amp
import accel.accelerators
def apply(self, ctx):
    blocks = ctx.extras["sharded_blocks"]
def step(self, run, state, optimizer, proceed):
    pausing = [a for a in run.accelerators if hasattr(a, "gradient_sync")]
    micro = any(getattr(a, "micro", 0) for a in run.accelerators)
    others = run.accelerators
    for other_one in others:
        hasattr(other_one, "scaler")
    return run.accelerator("amp").scaler, run.state("amp"), getattr(run.accelerator("amp"), "scaler"), run.states
'''
    tree = ast.parse(bad)
    reads = reads_of_others(tree)
    assert sum("ctx.extras" in r for r in reads) == 1
    assert sum("reads run.accelerators" in r for r in reads) == 3
    assert sum("on another accelerator" in r for r in reads) == 4, reads
    assert sum("calls run.accelerator()" in r for r in reads) == 2
    assert sum("run.state()" in r for r in reads) == 1 and sum("run.states" in r for r in reads) == 1
    assert len(imports_of_others(tree, ACCELERATORS / "ddp.py", "ddp")) == 3  # amp, amp.Amp, the package
    good = '''
from accel.accelerators.fsdp.surgery import shard_model
def apply(self, ctx):
    sharded = [a.name for a in ctx.plan if "model.sharded" in a.provides]
    earlier = open_run(ctx.user_model)
    mine = earlier.states.get(self.name), earlier.states[self.name], earlier.state(self.name)  # its own, earlier
    return getattr(self, "wrapper", None), hasattr(ctx.model, "no_sync"), getattr(torch, ctx.device.type)
'''
    tree = ast.parse(good)
    assert reads_of_others(tree) == [] and imports_of_others(tree, ACCELERATORS / "fsdp" / "__init__.py", "fsdp") == []


# --- (e) capabilities ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUILTIN)
def test_what_a_built_in_provides_and_orders_by_are_capability_members(name):
    cls = BUILTIN[name]
    for attribute in ("provides", "after", "before", "conflicts"):
        tokens = getattr(cls, attribute)
        strings = [t for t in tokens if not isinstance(t, Capability)]
        assert not strings, f"{name}.{attribute}: {strings} are strings; write accel.Capability members"
    provided = {t for c in BUILTIN.values() for t in c.provides}
    dangling = [t for a in ("after", "before", "conflicts") for t in getattr(cls, a) if t not in provided]
    assert not dangling, f"{name} orders by {dangling}, which no built-in provides"


def test_every_capability_is_provided_by_a_built_in():
    provided = {t for cls in BUILTIN.values() for t in cls.provides}
    assert set(Capability) <= provided, sorted(set(Capability) - provided)


# --- (f) the contract's types: they resolve, and a class's type arguments give its Options and State ------------

HOOKS = ("candidates", "decide", "check", "apply", "forward_context", "backward", "step", "optimizer_step", "unwrap",
         "bypassed")
ROLES = {contract.LossScaler: ("grad_scaler", "unscale_gradients"), contract.StepSchedule: ("accumulating",),
         contract.GradientSync: ("gradient_sync", "held_gradients", "release_held_gradients")}


def test_the_contract_is_ten_hooks_and_eight_attributes():
    """Issue 39's budget (at most 12 hooks and 8 attributes): a hook or a flag for one accelerator shows here first.
    Options and State come from the type arguments, config and explicit from the constructor: none is declared."""
    derived = ("Options", "State", "config", "explicit")
    attributes = [n for n in inspect.get_annotations(Accelerator) if n not in derived]
    assert attributes == ["name", "stage", "keeps", "requires", "provides", "after", "before", "conflicts"]
    methods = [n for n, v in vars(Accelerator).items() if isinstance(v, (types.FunctionType, classmethod))]
    assert [n for n in methods if not n.startswith("_") and n != "to_dict"] == list(HOOKS)


def hints(function) -> dict:
    """Every annotation of a function, resolved: Run and Context sit a floor up, imported under TYPE_CHECKING."""
    from accel.run.context import Context
    from accel.run.run import Run

    return typing.get_type_hints(function, globalns={**function.__globals__, "Run": Run, "Context": Context})


@pytest.mark.parametrize("cls", [Accelerator, *ROLES, *BUILTIN.values()], ids=lambda c: c.__name__)
def test_the_annotations_of_every_hook_and_role_resolve(cls):
    names = [*HOOKS, *(n for role, methods in ROLES.items() if issubclass(cls, role) for n in methods)]
    for name in names if cls not in ROLES else ROLES[cls]:
        found = hints(getattr(cls, name))
        assert "return" in found or cls is not Accelerator and cls not in ROLES, (cls, name)
    for method in (cls.State.state_dict, cls.State.load_state_dict) if cls not in ROLES else ():
        hints(method)
    if cls is Accelerator:
        assert hints(Accelerator.step)["state"] is contract.StateT and hints(Accelerator.apply)["ctx"].__name__ == (
            "Context")


@dataclass(frozen=True, kw_only=True)
class MineOptions(Options):
    steps: int = accel.option(2)


@dataclass
class MineState(State):
    count: int = 0


def test_options_and_state_come_from_the_type_arguments_or_the_base():
    class Bare(Accelerator):
        name, stage = "bare", Stage.STEP

    class Typed(Accelerator[MineOptions, MineState]):
        name, stage = "typed", Stage.STEP

    class Further(Typed):  # inherits both
        name = "further"

    assert (Bare.Options, Bare.State) == (Options, State)
    assert (Typed.Options, Typed.State) == (Further.Options, Further.State) == (MineOptions, MineState)
    assert Typed(steps=3).config == MineOptions(steps=3)
    assert (REGISTRY["ddp"].Options.__name__, REGISTRY["ddp"].State.__name__) == ("DDPOptions", "DDPState")
    with pytest.raises(AttributeError, match="keeps no run state"):
        Typed().count = 1


def test_the_run_asks_the_roles_of_those_that_play_them():
    played = {name: sorted(r.__name__ for r in ROLES if isinstance(cls(**cls.Options.example), r))
              for name, cls in BUILTIN.items()}
    assert {n: r for n, r in played.items() if r} == {"amp": ["LossScaler"], "ddp": ["GradientSync"],
                                                     "fsdp": ["GradientSync"], "grad_accumulation": ["StepSchedule"]}

    class Structural(Accelerator):  # a role played by defining its methods, without subclassing it
        name, stage = "structural", Stage.STEP

        def accumulating(self, state):
            return False

    assert isinstance(Structural(), contract.StepSchedule) and not isinstance(Structural(), contract.LossScaler)


# --- (g) options from their specs: an equal Options, or one PlanError naming each bad field ------------------------

class Odd:
    """A value of no type any option accepts (unless it takes any object)."""

    def __repr__(self) -> str:
        return "Odd()"


def values_of(spec: Option) -> st.SearchStrategy:
    """Values an option may be given: its default, its choices, any value of its types, and wrong ones."""
    kinds = {bool: st.booleans(), int: st.integers(-3, 10_000), float: st.floats(-10, 1e4, allow_nan=False),
             str: st.text(max_size=6), type(None): st.none(), dict: st.dictionaries(st.text(max_size=4), st.integers(),
                                                                                    max_size=2),
             list: st.lists(st.text(max_size=6), max_size=3), tuple: st.tuples(), object: st.sampled_from([len, 3])}
    strategies = [st.just(spec.default), st.sampled_from([Odd(), 1.5, -1, True, "?", None, [], {}])]
    strategies += [st.sampled_from(spec.choices)] if spec.choices else []
    strategies += [kinds[t] for t in spec.types if t in kinds]  # (a tensor, for prune's dummy_input: only None)
    return st.one_of(*strategies)


def option_dicts(cls: type) -> st.SearchStrategy:
    specs = cls.Options.specs()
    known = st.fixed_dictionaries({}, optional={k: values_of(s) for k, s in specs.items()})
    unknown = st.dictionaries(st.sampled_from(["no_such_option", next(iter(specs)) + "s"]), st.integers(), max_size=1)
    return st.tuples(known, unknown).map(lambda pair: {**pair[0], **pair[1]})


@pytest.mark.parametrize("name", BUILTIN)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_options_drawn_from_the_specs_construct_equal_options_or_one_plan_error_naming_each_field(name, data):
    cls = BUILTIN[name]
    specs = cls.Options.specs()
    values = data.draw(option_dicts(cls))
    bad = {k for k, v in values.items() if k not in specs or specs[k].problem(v)}
    surely_bad = {k for k, v in values.items()
                  if k not in specs or (isinstance(v, Odd) and object not in specs[k].types)}
    try:
        accelerator = cls(**values)
    except PlanError as error:
        assert error.problems and all(p.accelerator == name for p in error.problems), error
        named = [p.field for p in error.problems]
        assert sorted(named) == sorted(bad) and surely_bad <= set(named), (named, values)
        for problem in error.problems:
            assert f"{name}.{problem.field}: " in str(error), str(error)
    else:
        assert not bad and not surely_bad, values
        assert accelerator.config == cls.Options(**values) and accelerator.explicit == values
        for field in dataclasses.fields(cls.Options):
            given_value = values.get(field.name, field.metadata["option"].default)
            assert getattr(accelerator.config, field.name) == given_value, field.name
