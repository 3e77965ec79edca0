"""compile: torch.compile, applied last and outermost, so it sees every wrapper other accelerators added.

Compilation happens lazily on the first step; the report keeps that first step (compile + warm-up) apart
from the steady step time. On a 2-core CPU, compile gained nothing on resnet18 and cost 24-41 s of warm-up.
"""
from __future__ import annotations

import shutil

import torch

from accel.accelerator import Accelerator, Option, Stage, register
from accel.errors import Problem
from accel.hardware import ipex_problem

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def available_backends() -> list[str]:
    import torch._dynamo

    return sorted(torch._dynamo.list_backends(exclude_tags=()))


@register
class Compile(Accelerator):
    name = "compile"
    stage = Stage.COMPILATION
    options = {
        "mode": Option(None, (str, type(None)), choices=MODES),
        "backend": Option("inductor", (str,), help="any name torch._dynamo.list_backends() gives, or 'ipex'"),
        "fullgraph": Option(False, (bool,), help="fail instead of falling back to eager at graph breaks"),
        "dynamic": Option(None, (bool, type(None)), help="None: let dynamo decide when shapes change"),
        "options": Option(None, (dict, type(None)), help="backend options (inductor config); excludes mode"),
    }

    def check(self, ctx):
        problems = []
        if self.mode is not None and self.options is not None:
            problems.append(Problem(self.name, "torch.compile takes either mode or options, not both", field="options",
                                    value=self.options, allowed="drop mode, or drop options", kind="conflict"))
        if self.backend == "ipex":
            why = ipex_problem()
            if why:
                problems.append(Problem(self.name, why, field="backend", value="ipex", kind="missing"))
        elif self.backend not in available_backends():
            problems.append(Problem(self.name, "unknown compile backend", field="backend", value=self.backend,
                                    allowed=", ".join(available_backends() + ["ipex"]), kind="missing"))
        if (self.backend == "inductor" and ctx.device.type == "cpu"
                and not any(shutil.which(c) for c in ("g++", "c++", "clang++"))):
            problems.append(Problem(self.name, "inductor on CPU needs a C++ compiler (g++ or clang++) on PATH",
                                    field="backend", value="inductor", kind="missing"))
        return problems

    def apply(self, ctx):
        if self.backend == "ipex":
            import intel_extension_for_pytorch  # noqa: F401  (registers the backend; version checked in check())
        kwargs = {"backend": self.backend, "fullgraph": self.fullgraph, "dynamic": self.dynamic}
        if self.mode is not None:
            kwargs["mode"] = self.mode
        if self.options is not None:
            kwargs["options"] = self.options
        ctx.model = torch.compile(ctx.model, **kwargs)
        return {**{k: v for k, v in kwargs.items() if v is not None}, "compiles": "on the first step (see timing)"}
