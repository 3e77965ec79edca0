"""Plans: what the user asks for, parsed from Python, a dict or a TOML/YAML file, and put in stage order."""
from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import yaml

from accel.errors import PlanError, Problem, named
from accel.files import read_small
from accel.plan.contract import REGISTRY, Accelerator
from accel.plan.untrusted import unfolding

PlanSpec = Any  # Plan | list[str | dict | Accelerator] | dict[str, dict] | str | Path | None
PLAN_FILE_SUFFIXES = (".toml", ".yaml", ".yml")
PLAN_FILE_LIMIT = 1 << 20  # far above any plan


def _load_file(path: Path) -> Any:
    """The file's plan data. TOML refuses a key given twice, and so does YAML as read here (PyYAML would keep the last
    silently); either must unfold to a plan's size (accel.plan.untrusted: YAML aliases can make a few hundred bytes
    unfold to billions of values). It is read as a small regular file (accel.files.read_small): a sparse terabyte
    or a named pipe swapped in after the check is refused unread."""
    text = read_small(path.resolve(), PLAN_FILE_LIMIT).decode()
    if path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        spec = tomllib.loads(text)
    elif path.suffix in (".yaml", ".yml"):
        spec = yaml.load(text, Loader=_YamlLoader)
    else:
        raise ValueError(f"unknown format {path.suffix!r} (allowed: .toml, .yaml, .yml)")
    if huge := unfolding(spec, visits=10_000, depth=20):
        raise ValueError(f"it {huge}, far more than a plan holds")
    return spec


class _YamlLoader(yaml.SafeLoader):
    """yaml.SafeLoader refusing a mapping that gives one key twice (a YAML merge, ``<<: *defaults``, may still be
    overridden, as YAML says)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise ValueError(f"{str(key)[:60]!r} is given twice (line {key_node.start_mark.line + 1}); give "
                                     "it once, with all its options")
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader refuses it below
                continue
        return super().construct_mapping(node, deep=deep)


def _from_file(spec: str | Path, problems: list[Problem]) -> Any:
    """The plan a path names (None: an empty file, or a problem noted)."""
    path = Path(spec)
    if path.is_file():
        try:
            data = _load_file(path)
        except Exception as error:  # a broken file is a plan problem like any other
            problems.append(Problem("plan", f"plan file {str(path)!r} cannot be read: {error}", value=str(path)))
            return None
        if isinstance(data, Mapping) and set(data) == {"accelerators"}:
            data = data["accelerators"]
        if data is None or isinstance(data, (Mapping, list)):  # an empty file is the empty plan
            return data
        problems.append(Problem("plan", f"plan file {str(path)!r} holds a {type(data).__name__}, not a mapping "
                                "or a list of accelerators", value=data,
                                allowed="a mapping {name: options} or a list of names / {name: options}"))
    elif isinstance(spec, Path) or path.suffix in PLAN_FILE_SUFFIXES or "/" in str(spec):
        problems.append(Problem("plan",
                                "plan file not found (it is a directory)" if path.is_dir() else
                                "is not a plan file: a named pipe or a device, not a regular file"
                                if path.exists() else "plan file not found",
                                value=str(spec), allowed="an existing .toml, .yaml or .yml file", kind="missing"))
    elif str(spec) == "auto":  # chosen by measuring: accel.accelerate resolves it (accel.search)
        problems.append(Problem("plan", "is chosen by measuring: pass plan='auto' to accel.accelerate(), or "
                                "call accel.tune(...) and use its .plan", value=str(spec), kind="unknown"))
    else:
        problems.append(Problem("plan", f"is neither a plan file nor a plan; a one-accelerator plan is written "
                                f"[{str(spec)!r}]", value=str(spec),
                                allowed=f"a .toml/.yaml path, or a list of: {', '.join(sorted(REGISTRY))}",
                                kind="unknown"))
    return None


def _entries(spec: PlanSpec, problems: list[Problem]) -> list[tuple[str, Any]]:
    """Flatten any accepted plan form into (name or instance, options) pairs, noting malformed parts."""
    if isinstance(spec, (str, Path)):
        spec = _from_file(spec, problems)
    if spec is None:
        return []
    if isinstance(spec, Mapping):
        return list(spec.items())
    if isinstance(spec, Accelerator):
        return [(spec, None)]
    if not isinstance(spec, Iterable):
        problems.append(Problem("plan", "is not a plan", value=spec,
                                allowed="a list of names / {name: options} / Accelerator objects, a dict, "
                                        "or a file path"))
        return []
    pairs: list[tuple[str, Any]] = []
    for item in spec:
        if isinstance(item, (str, Accelerator)):
            pairs.append((item, None))
        elif isinstance(item, Mapping):
            pairs.extend(item.items())
        else:
            problems.append(Problem("plan", "is not a plan entry", value=item,
                                    allowed="an accelerator name, {name: options} or an Accelerator object"))
    return pairs


def _matches(token: str, accelerator: Accelerator) -> bool:
    return token == accelerator.name or token in accelerator.provides


def order(accelerators: list[Accelerator]) -> tuple[list[Accelerator], list[Problem]]:
    """The plan order: by stage, then the declared after/before constraints inside a stage, then by name.

    A constraint against the stages' order, a cycle, or a declared conflict is a problem of the plan.
    """
    problems: list[Problem] = []
    edges: set[tuple[str, str]] = set()  # (earlier, later)
    for a in accelerators:
        for attribute, earlier_is_other in (("after", True), ("before", False)):
            for token in getattr(a, attribute):
                for other in accelerators:
                    if other is a or not _matches(token, other):
                        continue
                    first, second = (other, a) if earlier_is_other else (a, other)
                    if first.stage > second.stage:
                        problems.append(Problem(a.name, f"declares {attribute}={token!r}, which {other.name} "
                                                f"provides, but stage {first.stage.name.lower()} comes after "
                                                f"{second.stage.name.lower()}", field=attribute, kind="conflict"))
                    elif first.stage == second.stage:
                        edges.add((first.name, second.name))
    seen_pairs = set()
    for a in accelerators:
        for token in a.conflicts:
            for other in accelerators:
                pair = frozenset((a.name, other.name))
                if other is not a and _matches(token, other) and pair not in seen_pairs:
                    seen_pairs.add(pair)
                    problems.append(Problem(a.name, f"conflicts with {other.name} ({token!r}): list one of them",
                                            allowed=f"{a.name} or {other.name}", kind="conflict"))
    ordered: list[Accelerator] = []
    left = sorted(accelerators, key=lambda a: (int(a.stage), a.name))
    while left:  # the first, by stage and name, of those whose earlier ones are all placed
        waiting = {later for earlier, later in edges if any(a.name == earlier for a in left)}
        ready = [a for a in left if a.name not in waiting]
        if not ready:
            stuck = ", ".join(sorted(a.name for a in left))
            problems.append(Problem("plan", f"the after/before declarations of {stuck} form a cycle", kind="conflict"))
            return ordered + left, problems
        ordered.append(ready[0])
        left.remove(ready[0])
    return ordered, problems


class Plan:
    """An ordered set of configured accelerators. Construction validates names, options and the order.

    The order is the library's (by stage, then declared constraints, then name), never the order the user wrote.
    """

    def __init__(self, spec: PlanSpec = None):
        plan, problems = Plan.parse(spec)
        if problems:
            raise PlanError(problems)
        self.accelerators: list[Accelerator] = plan.accelerators

    @classmethod
    def parse(cls, spec: PlanSpec) -> tuple[Plan, list[Problem]]:
        """Parse without raising: the plan of every valid entry, and the problems of the rest."""
        if isinstance(spec, Plan):
            return spec, []
        problems: list[Problem] = []
        accelerators: dict[str, Accelerator] = {}
        for key, options in _entries(spec, problems):
            accelerator = cls._build(key, options, problems)
            if accelerator is None:
                continue
            if accelerator.name in accelerators:
                problems.append(Problem(accelerator.name, "is listed more than once; list it once with all its options",
                                        kind="conflict"))
                continue
            accelerators[accelerator.name] = accelerator
        plan = cls.__new__(cls)
        plan.accelerators, order_problems = order(list(accelerators.values()))
        return plan, problems + order_problems

    @staticmethod
    def _build(key: Any, options: Any, problems: list[Problem]) -> Accelerator | None:
        if isinstance(key, Accelerator):
            return key
        if not isinstance(key, str):
            problems.append(Problem("plan", "accelerator names are strings", value=key, kind="unknown"))
            return None
        if key not in REGISTRY:
            hint = difflib.get_close_matches(key, list(REGISTRY), n=1)
            said = "unknown accelerator" + (f"; did you mean {hint[0]!r}?" if hint else "")
            problems.append(Problem(named(key), said, allowed=", ".join(sorted(REGISTRY)), kind="unknown"))
            return None
        if options is False:
            return None  # `amp = false` in a file switches an accelerator off
        if options is None or options is True:
            options = {}
        if not isinstance(options, Mapping):
            problems.append(Problem(key, "options must be a mapping of option name to value", value=options,
                                    allowed="{option: value}, true, false or nothing"))
            return None
        cls = REGISTRY[key]
        found = cls.Options.problems(dict(options), cls.name)
        if found:
            problems.extend(found)
            return None
        return cls(**options)

    def names(self) -> list[str]:
        return [a.name for a in self.accelerators]

    def providing(self, capability: str) -> list[str]:
        """The names of the plan's accelerators that provide a capability (what they declare, applied or not)."""
        return [a.name for a in self.accelerators if capability in a.provides]

    def get(self, name: str) -> Accelerator | None:
        return next((a for a in self.accelerators if a.name == name), None)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """{name: options the user set}; Plan(plan.to_dict()) is the same plan."""
        return {a.name: a.to_dict() for a in self.accelerators}

    def __iter__(self):
        return iter(self.accelerators)

    def __len__(self) -> int:
        return len(self.accelerators)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and same_options(self.to_dict(), other.to_dict())

    def __repr__(self) -> str:
        return f"Plan({self.to_dict()!r})"


def same_options(a: Any, b: Any) -> bool:
    """Equality of any values (option values, random states, snapshots): tensors compared whole (dtype, shape and
    values, on any device; repr() would summarise a large one) in lists, tuples and mappings; an object whose == is
    no truth value is not the same."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_options(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_options, a, b))
    try:
        return bool(a == b)
    except Exception:
        return False
