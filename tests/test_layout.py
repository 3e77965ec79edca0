"""The architecture's rules, read from accel's source: every accelerator a module (or package) of
accel/accelerators/ that names no other; no import circles, and the core imports no measurement; floors that no
import runs back up; modules of at most 300 lines; accel's own imports at the top of their module (one inside a
function names the cycle it breaks); ``__all__`` in every public module; one rank's start under ``accel launch``
loads neither accel nor torch."""
import ast
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import accel
from accel.distributed import rank_start
from accel.hardware.launcher import CORE_MAP_VARIABLE
from accel.plan.contract import REGISTRY

PACKAGE = Path(accel.__file__).parent
ACCELERATORS = PACKAGE / "accelerators"


def accelerators() -> dict[str, Path]:
    """{name: the file holding its card}: an accelerator is a module accel/accelerators/<name>.py, or a package
    accel/accelerators/<name>/__init__.py whose other modules are its parts."""
    found = {p.stem: p for p in ACCELERATORS.glob("*.py") if p.stem != "__init__"}
    found.update({p.parent.name: p for p in ACCELERATORS.glob("*/__init__.py")})
    return dict(sorted(found.items()))


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def accelerator_files() -> list[tuple[str, Path]]:
    """(accelerator, file) for every file of every accelerator: its card's file, then its package's parts."""
    files = []
    for name, card in accelerators().items():
        parts = sorted(p for p in card.parent.rglob("*.py") if p != card) if card.name == "__init__.py" else []
        files += [(name, path) for path in [card, *parts]]
    return files


def imported(node: ast.Import | ast.ImportFrom, path: Path) -> list[str]:
    """The dotted names an import statement brings in, relative imports made absolute."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        package = module_of(path).split(".") if path.name == "__init__.py" else module_of(path).split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def test_no_accelerator_module_names_another_accelerator():
    """Accelerators read decisions and declare capabilities; no code of theirs names another one. An accelerator
    in a package imports its own parts, by their modules (never the package: its __init__ is the accelerator)."""
    builtin = set(accelerators())
    for own, path in accelerator_files():
        where = path.relative_to(ACCELERATORS)
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        parts = f"accel.accelerators.{own}." if accelerators()[own].name == "__init__.py" else None
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                assert node.value not in builtin - {own}, f"{where} names {node.value!r}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = imported(node, path)
                bad = [n for n in names if (n == "accel.accelerators" or n.startswith("accel.accelerators."))
                       and not (parts and n.startswith(parts))]
                assert not bad, f"{where} imports {bad}"


def test_an_accelerators_parts_are_not_accelerators():
    """The modules inside an accelerator's package each do one job, said in their docstring; none registers an
    accelerator or holds a card. Each accelerator is registered from its own module, under its own name."""
    cards = accelerators()
    for own, path in accelerator_files():
        if path == cards[own]:
            continue
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree)
        assert doc and "\n" not in doc and "What it does" not in doc, \
            f"{path.relative_to(ACCELERATORS)}: a part says its job in a one-line docstring, and holds no card"
        for node in ast.walk(tree):
            callee = node.func if isinstance(node, ast.Call) else None
            decorators = node.decorator_list if isinstance(node, ast.ClassDef) else []
            for named in [callee, *decorators]:
                assert getattr(named, "id", getattr(named, "attr", None)) != "register", \
                    f"{path.relative_to(ACCELERATORS)} registers an accelerator"
    builtin = {name: cls.__module__ for name, cls in REGISTRY.items() if cls.__module__.startswith("accel.")}
    assert builtin == {name: f"accel.accelerators.{name}" for name in cards}, "an accelerator registered elsewhere"


def runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run: not those under ``if TYPE_CHECKING:`` (names for annotations only)."""
    typing_only = {id(inner) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
                   for statement in node.body for inner in ast.walk(statement)}
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            and id(node) not in typing_only]


def import_graph():
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        found = set()
        for node in runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or node.module.startswith("accel")):
                found |= set(imported(node, path))
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("accel")}
        graph[module_of(path)] = found
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def test_the_import_graph_has_no_circles_and_the_core_imports_no_measurement():
    graph = import_graph()
    # packages that import their parts to register them
    facade = {"accel", "accel.accelerators", "accel.cli", "accel.search"}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen and dep not in facade:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    circles = [m for m in graph if m not in facade and m in reach(m)]
    assert circles == [], f"modules on an import circle: {circles}"
    measurement = {"accel.measure", "accel.search", "accel.bench", "accel.testing"}
    core = [m for m in graph if (m == "accel.api" or m.startswith(("accel.plan", "accel.run")))
            and m not in measurement]  # the entry point, the plan and its contract, the run and its checkpoints
    assert {"accel.api", "accel.plan", "accel.plan.contract", "accel.run", "accel.run.context",
            "accel.run.journal"} <= set(core)
    for module in core:
        reached = {m for m in reach(module) if m in measurement or m.startswith(tuple(f"{p}." for p in measurement))}
        assert not reached, f"{module} reaches {reached}"
    for module in graph:
        if not module.startswith("accel.testing"):
            assert "accel.testing" not in graph[module], f"{module} imports accel.testing"


# The layout's floors, from the ground up: a module imports only modules of its own floor or below (never one
# back up; imports under ``if TYPE_CHECKING:`` never run and do not count). ``accel`` itself (the package's
# face) is not a floor.
FLOORS = [
    ("accel.version", "accel.errors", "accel.clock", "accel.batches", "accel.modules", "accel.randomness",
     "accel.optim", "accel.files"),                        # 0 leaves
    ("accel.hardware",),                                   # 1 the machine, and where this process sits (launcher)
    ("accel.plan",),                                       # 2 the plan and the contract
    ("accel.run",),                                        # 3 the run and its checkpoints
    ("accel.distributed", "accel.accelerators"),           # 4 the process group and ddp/fsdp's base; accelerators
    ("accel.api",),                                        # 5 accelerate(), decide()
    ("accel.measure", "accel.workloads"),                  # 6 measurement; what accel trains
    ("accel.search",),                                     # 7 tune, plan="auto", the plan cache
    ("accel.testing", "accel.bench"),                      # 8
    ("accel.cli", "accel.__main__"),                       # 9
]


def floor_of(module: str) -> int | None:
    for number, prefixes in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return number
    return None


def test_the_layout_has_floors_and_no_import_runs_back_up():
    graph = import_graph()
    unplaced = [m for m in graph if m != "accel" and floor_of(m) is None]
    assert unplaced == [], f"modules on no floor of the layout: {unplaced}"
    up = [f"{m} -> {d}" for m, deps in graph.items() if m != "accel"
          for d in deps if d != "accel" and floor_of(d) > floor_of(m)]
    assert up == [], "imports that run back up:\n" + "\n".join(sorted(up))


def test_each_built_in_accelerator_file_reads_as_its_card():
    for name, path in accelerators().items():
        where = path.relative_to(ACCELERATORS)
        card = ast.get_docstring(ast.parse(path.read_text()))
        assert card and card.startswith(f"{name}:"), where
        for part in ("What it does", "When it helps", "What it keeps"):
            assert part in card, f"{where}'s card has no '{part}'"
    for name, cls in REGISTRY.items():
        assert cls.keeps.weights in ("exact", "float", "tolerance", "changed"), name


# --- size --------------------------------------------------------------------------------------------------------

MAX_LINES = 300


def long_modules() -> dict[str, int]:
    lengths = {path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
               for path in PACKAGE.rglob("*.py")}
    return {name: count for name, count in sorted(lengths.items()) if count > MAX_LINES}


def test_no_module_is_longer_than_300_lines():
    assert long_modules() == {}


# --- imports at the top ------------------------------------------------------------------------------------------

def local_imports(source: str, path: Path) -> list[int]:
    """Lines of imports of accel's own modules inside a function with no ``# cycle: a -> b`` comment naming the
    import circle it breaks (optional and heavy third-party packages are imported where used: that is allowed)."""
    lines, found = source.splitlines(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if (isinstance(inner, (ast.Import, ast.ImportFrom))
                        and any(n == "accel" or n.startswith("accel.") for n in imported(inner, path))
                        and "# cycle:" not in lines[inner.lineno - 1]):
                    found.add(inner.lineno)
    return sorted(found)


def test_accels_own_imports_are_at_the_top_of_their_module():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             for line in local_imports(path.read_text(), path)]
    assert found == [], "imports of accel inside a function, with no '# cycle:' naming why:\n" + "\n".join(found)


def test_the_local_import_check_sees_what_it_is_for():
    source = textwrap.dedent("""
        import accel.plan
        def f():
            import nni
            from accel.plan import Plan
            from accel import api  # cycle: accel.api -> here
            def g():
                from . import contract
        """)
    assert local_imports(source, PACKAGE / "plan" / "example.py") == [5, 8]


# --- public modules ----------------------------------------------------------------------------------------------

def public_modules() -> list[str]:
    """Every package face, every accelerator's module (users build Amp(dtype=...) and read AmpState), and the
    modules whose names users write in their own code; every other module is internal."""
    faces = [module_of(path) for path in PACKAGE.rglob("__init__.py")]
    cards = [module_of(path) for path in accelerators().values()]
    named = ["accel.plan.contract", "accel.plan.options", "accel.run.context", "accel.hardware.launcher",
             "accel.distributed.group"]
    return sorted(set(faces + cards + named))


def reexports(path: Path) -> set[str]:
    """What a face imports only to hand on: names it imports at the top and uses nowhere in its own code."""
    tree = ast.parse(path.read_text())
    bound = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
             and node.module != "__future__" for alias in node.names}
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return {name for name in bound - used if not name.startswith("_")}


@pytest.mark.parametrize("name", public_modules())
def test_a_public_module_says_what_it_exports(name):
    module = importlib.import_module(name)
    assert isinstance(vars(module).get("__all__"), list), f"{name} has no __all__"
    assert [n for n in module.__all__ if not hasattr(module, n)] == [], f"{name}.__all__ names what it lacks"
    if Path(module.__file__).name == "__init__.py":
        assert reexports(Path(module.__file__)) <= set(module.__all__), f"{name} hands on names not in __all__"


def test_the_public_modules_are_the_faces_the_accelerators_and_five_named_modules():
    assert len(public_modules()) == 29 and "accel.accelerators.amp" in public_modules()


# --- one rank's start --------------------------------------------------------------------------------------------

def test_one_ranks_start_loads_neither_accel_nor_torch_and_pins_before_the_script(tmp_path):
    """torchrun runs accel/distributed/rank_start.py by its path: the rank is pinned to its cores before the
    user's script (and the OpenMP runtime torch loads) runs, with nothing of accel or torch imported first."""
    assert rank_start.CORE_MAP == CORE_MAP_VARIABLE  # the map accel launch writes is the one the rank reads
    cpu = min(os.sched_getaffinity(0))
    script = tmp_path / "train.py"
    script.write_text("import os, sys\n"
                      "print(sorted(os.sched_getaffinity(0)), sys.argv[1:],\n"
                      "      sorted(m for m in sys.modules if m.split('.')[0] in ('accel', 'torch')))\n")
    env = {**os.environ, CORE_MAP_VARIABLE: str(cpu), "LOCAL_RANK": "0"}
    result = subprocess.run([sys.executable, rank_start.__file__, str(script), "--lr", "0.1"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == f"[{cpu}] ['--lr', '0.1'] []"
