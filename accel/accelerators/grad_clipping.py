"""grad_clipping: clip the gradients' total norm (or each value) before every optimizer step.

What it does: on each real optimizer step (not on accumulation's micro-steps: it is declared after
``step.schedule``), it first asks for true gradients (``run.unscale_gradients()``: amp with fp16 unscales
them; a no-op otherwise), then applies
``torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)`` or ``clip_grad_value_(params, value)`` to the
optimizer's parameters. Under DDP the gradients are already averaged over ranks, so every rank clips the
same global gradient. ``run.accelerator("grad_clipping").last_norm`` is the norm before clipping.

When it helps: stability (exploding gradients in RNNs and transformers, large learning rates), not speed: it
adds a pass over the gradients (a norm and a scale), small next to a step.

What it keeps: not the plain loop's update when it clips: that is its purpose. Declared: gradients whose total
norm exceeds max_norm are scaled down to it (or clamped to +-value); below the limit the update is the
plain loop's exactly. Everything else is kept exactly.
"""
from __future__ import annotations

import torch

from accel.accelerator import Accelerator, Keeps, Option, Stage, positive, register
from accel.errors import Problem


def norm_type_problem(value) -> str | None:
    return None if value == "inf" or (not isinstance(value, str) and value > 0) else "must be > 0 or 'inf'"


@register
class GradClipping(Accelerator):
    name = "grad_clipping"
    example = {"max_norm": 1.0}
    stage = Stage.STEP
    needs = ("optimizer",)
    provides = ("gradients.clip",)
    after = ("step.schedule",)  # clip the accumulated gradient, once per optimizer step
    keeps = Keeps("changed", note="gradients above max_norm scaled down to it (or clamped to +-value)")
    options = {
        "max_norm": Option(None, (int, float, type(None)), check=positive, help="largest total gradient norm"),
        "norm_type": Option(2.0, (int, float, str), choices=("inf",), check=norm_type_problem,
                            help="the p of the p-norm, or 'inf'"),
        "value": Option(None, (int, float, type(None)), check=positive, help="clamp every gradient to +-value"),
        "foreach": Option(None, (bool, type(None)), help="None: torch's choice of the foreach kernels"),
    }

    def check(self, ctx):
        problems = []
        if (self.max_norm is None) == (self.value is None):
            problems.append(Problem(self.name, "give max_norm (clip the total norm) or value (clamp each gradient), "
                                    "one of them", field="max_norm", value=self.max_norm,
                                    allowed="max_norm=1.0, or value=0.5"))
        return problems

    def apply(self, ctx):
        self.last_norm = None
        if self.max_norm is not None:
            return {"max_norm": self.max_norm, "norm_type": self.norm_type,
                    "under_grad_scaler": "unscaled first" if ctx.decisions.loss_scaling else "no scaler"}
        return {"value": self.value}

    def relies_on(self):
        return {"step": "clipping of the gradients before the update"}

    def step(self, run, optimizer, proceed):
        run.unscale_gradients(optimizer)  # true gradients under a loss scaler (fp16), before they are read
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if self.max_norm is not None:
            norm_type = float(self.norm_type)
            self.last_norm = torch.nn.utils.clip_grad_norm_(params, self.max_norm, norm_type=norm_type,
                                                            foreach=self.foreach).detach()
        else:
            torch.nn.utils.clip_grad_value_(params, self.value, foreach=self.foreach)
        return proceed(optimizer)
