"""prune's config list: NNI 3.0's schema, the layers it selects, and what pruning them reshapes (a torch.fx graph)."""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from accel.modules import tied_groups

PRUNERS = {"l1": "L1NormPruner", "l2": "L2NormPruner", "fpgm": "FPGMPruner", "taylor": "TaylorPruner"}
DEFAULT_CONFIG = [{"op_types": ["Conv2d"], "sparse_ratio": 0.5}]
SELECTORS = ("op_types", "op_names", "op_names_re")
NAME_LISTS = (*SELECTORS, "exclude_op_names", "exclude_op_types", "exclude_op_names_re")
GRANULARITIES = ("default", "in_channel", "out_channel", "per_channel")
CONFIG_KEYS = (*NAME_LISTS, "sparse_ratio", "sparse_threshold", "max_sparse_ratio", "min_sparse_ratio",
               "global_group_id", "dependency_group_id", "granularity", "align", "target_names", "target_settings")


def config_problems(config_list: Any, model: nn.Module) -> list[str]:
    """What is wrong with an NNI pruning config list (NNI 3.0's schema), checked against the model's modules."""
    if not isinstance(config_list, list) or not config_list:
        return ["must be a non-empty list of NNI config dicts"]
    modules = dict(model.named_modules())
    types = {type(m).__name__ for m in modules.values()}
    found = []
    for i, config in enumerate(config_list):
        where = f"config_list[{i}]"
        if not isinstance(config, Mapping):
            found.append(f"{where}: {config!r} is not a dict")
            continue
        for key in config:
            if key not in CONFIG_KEYS:
                hint = difflib.get_close_matches(str(key), CONFIG_KEYS, n=1)
                found.append(f"{where}: unknown key {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
        if not any(config.get(k) for k in SELECTORS):
            found.append(f"{where}: names no layers (give op_types, op_names or op_names_re)")
        for key in NAME_LISTS:
            value = config.get(key)
            if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                found.append(f"{where}.{key}: {value!r} is not a list of strings")
            elif value and key.endswith("op_names") and (missing := [v for v in value if v not in modules]):
                found.append(f"{where}.{key}: no module named {missing} in the model")
            elif value and key.endswith("_re") and (bad := [f"{v!r} ({e})" for v in value if (e := regex_error(v))]):
                found.append(f"{where}.{key}: not regular expressions: {', '.join(bad)}")
            elif value and key.endswith("op_types") and (missing := [v for v in value if v not in types]):
                found.append(f"{where}.{key}: no module of type {missing} in the model "
                             + (reparametrized_types(model, missing) or "(types are class names, e.g. 'Conv2d')"))
        if "sparse_ratio" in config and "sparse_threshold" in config:
            found.append(f"{where}: give sparse_ratio or sparse_threshold, not both")
        if not any(k in config for k in ("sparse_ratio", "sparse_threshold", "target_settings")):
            found.append(f"{where}: says how much to prune nowhere (give sparse_ratio, e.g. 0.5)")
        for key in ("sparse_ratio", "max_sparse_ratio", "min_sparse_ratio"):
            value = config.get(key)
            if key in config and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1):
                found.append(f"{where}.{key}: {value!r} must be a number in [0, 1)")
        granularity = config.get("granularity")
        if granularity is not None and granularity not in GRANULARITIES and not isinstance(granularity, list):
            found.append(f"{where}.granularity: {granularity!r} is not one of {GRANULARITIES} or a list")
    return found


def regex_error(pattern: str) -> str | None:
    """Why a pattern is not a regular expression (None if it is): selected() must not fail on it."""
    try:
        re.compile(pattern)
    except re.error as error:
        return str(error)
    return None


def selected(config: Mapping, model: nn.Module) -> set[str]:
    """Names of the modules an NNI config dict selects (the rules of nni.compression.base.config, NNI 3.0)."""
    modules = dict(model.named_modules(remove_duplicate=False))

    def by_type(types):
        return {n for n, m in modules.items() if type(m).__name__ in types}

    def by_regex(patterns):
        return {n for n in modules if any(re.match(p, n) for p in patterns)}

    named = config.get("op_names") or config.get("op_names_re")
    names = set(config.get("op_names") or ()) | by_regex(config.get("op_names_re") or ())
    if config.get("op_types"):
        names = names & by_type(config["op_types"]) if named else by_type(config["op_types"])
    return (names - set(config.get("exclude_op_names") or ()) - by_regex(config.get("exclude_op_names_re") or ())
            - by_type(config.get("exclude_op_types") or ()))


def reparametrized(model: nn.Module) -> dict[str, str]:
    """{layer: how} for the layers whose weight is computed from other tensors: parametrized ones
    (torch.nn.utils.parametrizations.weight_norm/spectral_norm: a ParametrizedConv2d) and those of the older forward
    pre-hooks (torch.nn.utils.weight_norm/spectral_norm: weight_g and weight_v, or weight_orig)."""
    found = {}
    for name, module in model.named_modules():
        hooks = [type(h).__name__ for h in module._forward_pre_hooks.values()
                 if type(h).__module__ in ("torch.nn.utils.weight_norm", "torch.nn.utils.spectral_norm")]
        if parametrize.is_parametrized(module):
            kinds = sorted({type(p).__name__.strip("_") for ps in module.parametrizations.values() for p in ps})
            found[name] = f"{type(module).__name__} ({', '.join(kinds)})"
        elif hooks:
            found[name] = f"{type(module).__name__} with {', '.join(hooks)}"
    return found


REPARAMETRIZED = ("their weight is computed from other tensors ({}), while NNI prunes a layer's own weight and "
                  "ModelSpeedup rebuilds a plain layer, without that computation")
UNDO = ("torch.nn.utils.parametrize.remove_parametrizations(layer, 'weight') (or remove_weight_norm / "
        "remove_spectral_norm) before pruning, or those layers and the ones they feed left out of config_list")


def reparametrized_types(model: nn.Module, missing: list[str]) -> str:
    """Why a class name asked for is not in a model of parametrized layers: ParametrizedConv2d is a Conv2d, but NNI
    selects by the exact class name."""
    names = {name: how for name, how in reparametrized(model).items()
             if any(b.__name__ in missing for b in type(model.get_submodule(name)).__mro__[1:])}
    if not names:
        return ""
    return (f"as such: its layers {sorted(names)[:4]} are parametrized ({next(iter(names.values()))}), and NNI "
            f"selects layers by their exact class name; pruning them is refused anyway: "
            + REPARAMETRIZED.format("torch.nn.utils.parametrize") + f" (allowed: {UNDO})")


def fx_trace(model: nn.Module) -> torch.fx.GraphModule:
    """A GraphModule of the model (torch.fx's tracer: NNI's fails on torch >= 2.2), or a ValueError naming the module
    where torch.fx failed and why."""
    tracer = torch.fx.Tracer()
    try:
        graph = tracer.trace(model)
    except Exception as error:  # the innermost module entered and not left: the last of the tracer's module_stack
        name = next(reversed(tracer.module_stack.values()), ("",))[0]
        where = (f"module {name!r} ({type(model.get_submodule(name)).__name__})" if name
                 else f"{type(model).__name__}.forward")
        raise ValueError(f"torch.fx cannot trace {where}: {type(error).__name__}: {error}") from error
    return torch.fx.GraphModule(tracer.root, graph)

def sets_features(node: torch.fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether the node calls a layer that decides its own output features (a weight of 2+ dims: Conv, Linear): a
    change of its input channels stops there. Norms, activations and pooling pass their input's channels on."""
    return node.op == "call_module" and any(p.dim() > 1 for p in modules[node.target].parameters())


def reached(starts, onward) -> list[torch.fx.Node]:
    """Every node reached from ``starts`` (themselves included) going on to ``onward(node)`` from each, once each."""
    stack, seen = list(starts), {}
    while stack:
        node = stack.pop()
        if node not in seen:
            seen[node] = None
            stack.extend(onward(node))
    return list(seen)


def output_layers(graph: torch.fx.GraphModule) -> list[str]:
    """Layers whose output reaches the model's output through ops that keep its channels (activations, pooling,
    flatten, additions, BatchNorm): pruning their channels would change the output's shape."""
    modules = dict(graph.named_modules())
    outputs = [node for node in graph.graph.nodes if node.op == "output"]
    return sorted({node.target for node in reached(outputs, lambda n: [] if sets_features(n, modules)
                                                   else n.all_input_nodes) if sets_features(node, modules)})


def reshaped(graph: torch.fx.GraphModule, pruned: set[str]) -> dict[str, str]:
    """{module or parameter: the pruned layer that may reshape it}: the pruned layers themselves, and what their
    outputs reach up to (and including) the next layers that decide their own features (their inputs shrink)."""
    modules = dict(graph.named_modules())
    found: dict[str, str] = {}
    for node in graph.graph.nodes:
        if node.op != "call_module" or node.target not in pruned:
            continue
        found.setdefault(node.target, node.target)
        for user in reached(node.users, lambda n: [] if sets_features(n, modules) else n.users):
            if user.op == "call_module" and next(modules[user.target].parameters(), None) is not None:
                found.setdefault(user.target, node.target)
            for arg in user.all_input_nodes if not sets_features(user, modules) else ():  # weights F.linear reads
                if arg.op == "get_attr":
                    found.setdefault(arg.target, node.target)
    return found


def keep_outputs(config_list: list[dict], model: nn.Module, graph: torch.fx.GraphModule) -> tuple[list[dict],
                                                                                                    list[str]]:
    """The config list with the layers producing the model's output excluded (unless a config names them in
    op_names), and those layers."""
    outputs = output_layers(graph)
    configs, kept = [], set()
    for config in config_list:
        if hit := [n for n in outputs if n in selected(config, model) and n not in (config.get("op_names") or ())]:
            config = {**config, "exclude_op_names": [*(config.get("exclude_op_names") or ()), *hit]}
            kept.update(hit)
        configs.append(config)
    return configs, sorted(kept)


def structure_problems(config_list: list[dict], model: nn.Module, graph: torch.fx.GraphModule) -> list[str]:
    """Ties that pruning would reshape, and a config list that selects nothing once the output layers are kept."""
    configs, kept = keep_outputs(config_list, model, graph)
    pruned = set().union(*(selected(c, model) for c in configs))
    found = []
    if kept and not pruned:
        found.append(f"selects only {kept}, which produce the model's output and are kept so that its shape does "
                     "not change: select other layers (or name these in op_names, if pruning keeps their outputs)")
    at_risk = reshaped(graph, pruned)
    weighted = reparametrized(model)
    if hit := sorted(name for name in weighted if name in at_risk):
        found.append(f"pruning would rebuild {hit[:4]}" + (f" and {len(hit) - 4} more" if len(hit) > 4 else "") + ": "
                     + REPARAMETRIZED.format(weighted[hit[0]]) + f"; use {UNDO}")
    for group in tied_groups(model):
        for name in group:
            owner = name.rpartition(".")[0]
            if source := at_risk.get(owner) or at_risk.get(name):
                why = "selected by config_list" if source == owner else f"fed by the pruned layer {source!r}"
                found.append(f"parameters {group} are one tensor (tied) and pruning may reshape {owner or name!r} "
                             f"({why}); the surgery would untie them: add {source!r} to exclude_op_names, or untie "
                             "them")
                break
    return found
