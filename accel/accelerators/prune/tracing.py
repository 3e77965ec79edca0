"""prune's torch.fx graph (NNI's tracer fails on torch >= 2.2): the output's layers and the ties pruning reshapes."""
from __future__ import annotations

import torch
from torch import nn

from accel.accelerators.prune.config import REPARAMETRIZED, UNDO, reparametrized, selected
from accel.modules import tied_groups


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, remembering which module it was inside, so a failure can name it."""

    def __init__(self):
        super().__init__()
        self.path: list[str] = []

    def call_module(self, m, forward, args, kwargs):
        self.path.append(self.path_of_module(m))
        result = super().call_module(m, forward, args, kwargs)
        self.path.pop()
        return result


def fx_trace(model: nn.Module) -> torch.fx.GraphModule:
    """A GraphModule of the model, or a ValueError naming the module where torch.fx failed and why."""
    tracer = _Tracer()
    try:
        graph = tracer.trace(model)
    except Exception as error:
        name = tracer.path[-1] if tracer.path else ""  # the innermost module entered and not left
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
