"""amp: autocast in the dtype the device computes natively, a GradScaler only for fp16.

What it does: decides the compute dtype (``auto``: bf16 where the device computes it, fp16 with a GradScaler on GPUs
without bf16, nothing where it would be emulated) and owns the scaler through its hooks; on CUDA it sets
cudnn.benchmark and TF32. When it helps: tensor-core GPUs, CPUs with native bf16; where it is emulated it hurts badly.

What it keeps: a declared tolerance, parameters in fp32. Its card: docs/accelerators/amp.md.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from accel.errors import Problem, Skip, loops_level
from accel.hardware import Hardware
from accel.modules import listed
from accel.plan.contract import Accelerator, Call, Capability, Keeps, LossScaler, Stage, State, dtype_name, register
from accel.plan.options import Options, option

if TYPE_CHECKING:
    from accel.run.context import Context
    from accel.run.run import Run

__all__ = ["Amp", "AmpOptions", "AmpState"]

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def auto_dtype(device: torch.device, hardware) -> tuple[torch.dtype | None, str]:
    """The dtype autocast should use on this device, or None with the reason."""
    if device.type == "cuda":
        return (torch.bfloat16, "cuda supports bf16") if torch.cuda.is_bf16_supported() else (
            torch.float16, "this GPU has no bf16: fp16 with a grad scaler")
    if device.type == "xpu":
        return torch.bfloat16, "Intel GPUs compute bf16 natively"
    if device.type == "mps":
        return torch.float16, "mps autocast uses fp16"
    if device.type == "cpu":
        if hardware.native_bf16:
            return torch.bfloat16, "the CPU has native bf16 (" + ", ".join(
                f for f in hardware.isa if f in ("avx512_bf16", "amx_bf16")) + ")"
        return None, ("this CPU has no native bf16 (no avx512_bf16 or amx): bf16 autocast is emulated, many times "
                      "slower (docs/machines.md); ask for dtype='bfloat16' to force it")
    return None, f"no autocast dtype is known for device type {device.type!r}"


@functools.cache
def recurrent_refusal(kind: type[torch.nn.Module], device_type: str, dtype: torch.dtype) -> str:
    """What torch raises when a tiny ``kind`` (LSTM, GRU, RNN) trains under autocast in ``dtype`` here, or "": its
    kernels for recurrent layers need instructions some CPUs lack (a bfloat16 LSTM without AVX-512), which only a
    try tells."""
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            layer = kind(2, 2)
            with torch.autocast(device_type, dtype=dtype):
                out = layer(torch.ones(1, 1, 2))[0]
            out.float().sum().backward()
    except RuntimeError as error:
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    return ""


def emulated(device: torch.device, dtype: torch.dtype, hardware) -> bool:
    """True where this CPU has no instructions for the dtype, so autocast emulates it (many times slower)."""
    native = {torch.bfloat16: hardware.native_bf16, torch.float16: hardware.native_fp16}
    return device.type == "cpu" and not native.get(dtype, True)


def set_tf32(journal, flags, precision, allow: bool) -> None:
    """flags.allow_tf32 = allow, in the journal; ``precision.fp32_precision`` instead where the program chose TF32
    through torch's newer setting (torch >= 2.9, transformers' ``tf32=True``), since torch then refuses the old flag
    or does not let it reach what the newer one set."""
    try:  # (reading the old flag raises where the newer setting chose TF32)
        newer = getattr(torch.backends, "fp32_precision", "none") != "none" or flags.allow_tf32 is None
    except RuntimeError:
        newer = True
    if newer:
        journal.setattr(precision, "fp32_precision", "tf32" if allow else "ieee")
    else:
        journal.setattr(flags, "allow_tf32", allow)


@dataclass(frozen=True, kw_only=True)
class AmpOptions(Options):
    dtype: str = option("auto", choices=("auto", *DTYPES), help="auto = what the device computes natively")
    grad_scaler: str | bool = option("auto", (str, bool), choices=("auto",), help="auto = only with fp16")
    cudnn_benchmark: bool = option(True, help="cuda: let cuDNN pick the fastest convolution algorithms")
    allow_tf32: bool = option(True, help="cuda: TF32 matmuls and convolutions for the fp32 parts")


@dataclass
class AmpState(State):
    device_type: str
    dtype: torch.dtype
    scaler: torch.amp.GradScaler | None  # fp16 only: amp's alone, stepped by its optimizer_step hook
    unscaled: set[int] = field(default_factory=set)  # the optimizers whose gradients were unscaled since their step
    scaled: bool = False  # the gradients hold a loss it scaled (since its last step)
    idle: bool = False  # the loop went around the run (accel/run/watch.py): no loss scaling from then on

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        if (self.scaler is None) != ("scaler" not in saved):
            raise ValueError(f"the checkpoint has {'a' if 'scaler' in saved else 'no'} GradScaler state, this run "
                             f"has {'one' if self.scaler is not None else 'none'}")
        if self.scaler is not None:
            self.scaler.load_state_dict(saved["scaler"])


@register
class Amp(Accelerator[AmpOptions, AmpState], LossScaler[AmpState]):
    """Mixed precision: autocast in run.autocast(), loss scaling in run.backward()/run.step() for fp16."""

    name = "amp"
    stage = Stage.PRECISION
    provides = (Capability.PRECISION_AUTOCAST, Capability.PRECISION_LOSS_SCALING)
    keeps = Keeps("tolerance", rtol=0.5, atol=1e-3, loss_rtol=0.05,
                  note="lower-precision arithmetic in the forward pass and the loss")

    @classmethod
    def candidates(cls, hardware: Hardware, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                   loader: Any = None) -> list[dict[str, Any]]:
        if hardware.devices.keys() - {"cpu"}:
            return [{}]
        return [{"dtype": "bfloat16"}] if hardware.native_bf16 else []

    def decide(self, ctx: Context) -> None:
        device = ctx.device
        if not torch.amp.is_autocast_available(device.type):
            raise Skip(f"torch has no autocast for device type {device.type!r}")
        asked = DTYPES.get(self.config.dtype)  # None: "auto"
        dtype, why = (asked, "asked for") if asked is not None else auto_dtype(device, ctx.hardware)
        if dtype is None:
            raise Skip(why)
        wanted = self.config.grad_scaler
        scaling = dtype is torch.float16 if wanted == "auto" else wanted
        layers = (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN)  # their own kernels, by torch's class
        kinds = {k for m in ctx.model.modules() for k in layers if isinstance(m, k)} if device.type == "cpu" else ()
        for kind in sorted(kinds, key=lambda k: k.__name__) if not self.plan_problems(ctx, dtype, scaling) else ():
            if refusal := recurrent_refusal(kind, device.type, dtype):  # (a plan wrong everywhere: check() refuses)
                raise Skip(f"torch cannot train your {kind.__name__} under {dtype_name(dtype)} autocast on this CPU "
                           f"({refusal}): the plain step runs")
        ctx.decide("compute_dtype", dtype, why)
        ctx.decide("loss_scaling", bool(scaling), "fp16 needs it" if scaling else "bf16 has fp32's range")

    def check(self, ctx: Context) -> list[Problem]:
        return self.plan_problems(ctx, ctx.decisions.compute_dtype, ctx.decisions.loss_scaling)

    def plan_problems(self, ctx: Context, dtype: torch.dtype | None, scaling: bool) -> list[Problem]:
        """What is wrong with these options for this dtype and loss scaling, whatever the machine's kernels: decide()
        asks it before standing aside for a layer this CPU cannot train, so a wrong plan is refused everywhere."""
        if self.config.grad_scaler is True and dtype is torch.bfloat16:
            source = "asked for" if self.config.dtype != "auto" else "what 'auto' resolves to here"
            return [Problem(self.name, f"a grad scaler is only for fp16, and the dtype is bfloat16 ({source}); bf16 "
                            "has fp32's range", field="grad_scaler", value=True,
                            allowed="'auto' or False with bfloat16, or dtype='float16'", kind="conflict")]
        if not scaling:  # what loss scaling cannot do with the loop's optimizer
            return []
        if ctx.optimizer is None:  # what loss scaling needs: the optimizer's step
            return [Problem(self.name, "loss scaling (fp16's GradScaler) needs the optimizer: the scaler unscales the "
                            "gradients and skips the steps that overflowed in the optimizer's step; a loop that "
                            "updates the weights itself (p.data.add_(p.grad, ...)) would apply gradients 65536x too "
                            "large", field="grad_scaler", value=self.config.grad_scaler,
                            allowed="pass your optimizer to accelerate(), dtype='bfloat16' (no scaling), or "
                            "grad_scaler=False (fp16 gradients may then underflow)", kind="missing")]
        closure = inspect.signature(type(ctx.optimizer).step).parameters.get("closure")  # LBFGS's has no default
        if closure is not None and closure.default is inspect.Parameter.empty:
            return [Problem(self.name, f"loss scaling (fp16's GradScaler) steps the optimizer itself, and "
                            f"{type(ctx.optimizer).__name__}.step needs a closure, which the GradScaler cannot pass",
                            field="grad_scaler", value=self.config.grad_scaler,
                            allowed="dtype='bfloat16' (no scaling), or grad_scaler=False (fp16 gradients may then "
                            "underflow)", kind="conflict")]
        return []

    def apply(self, ctx: Context) -> AmpState:
        device, config, dtype = ctx.device, self.config, ctx.decisions.compute_dtype
        if config.dtype != "auto" and emulated(device, dtype, ctx.hardware):
            warnings.warn(f"amp: {dtype} autocast on a CPU without native {dtype} support is emulated and can be "
                          "many times slower than fp32; measure it (accel bench) before keeping it",
                          stacklevel=loops_level())
        scaler = torch.amp.GradScaler(device.type) if ctx.decisions.loss_scaling else None
        changes = {"dtype": dtype_name(dtype), "why": ctx.decisions.why["compute_dtype"],
                   "grad_scaler": scaler is not None}
        held = {id(p) for group in ctx.optimizer.param_groups for p in group["params"]} if scaler else set()
        outside = [n for n, p in ctx.model.named_parameters() if p.requires_grad and id(p) not in held]
        if scaler is not None and outside:  # a second optimizer of the loop's would step them, scaled
            warnings.warn(f"amp: parameters that train are not in the optimizer ({listed(outside, 4)}): their "
                          "gradients stay multiplied by the GradScaler's scale (65536 at first); step an optimizer of "
                          "yours that holds them with run.scaler.step(it) (it unscales them, and skips a step whose "
                          "gradients overflowed; run.unscale_gradients(it) first to read them), or pass one optimizer "
                          "holding every parameter that trains", stacklevel=loops_level())
        if device.type == "cuda":
            ctx.journal.setattr(torch.backends.cudnn, "benchmark", config.cudnn_benchmark)
            for flags, precision in ((torch.backends.cuda.matmul, torch.backends.cuda.matmul),
                                     (torch.backends.cudnn, getattr(torch.backends.cudnn, "conv", None))):
                set_tf32(ctx.journal, flags, precision, config.allow_tf32)
            changes.update(cudnn_benchmark=config.cudnn_benchmark, allow_tf32=config.allow_tf32)
        relies_on = {"backward": "scaling of the loss for the GradScaler",
                     "step": "GradScaler step (unscale, skip a step with inf/NaN gradients)"} if scaler else {}
        return AmpState(device.type, dtype, scaler, changes=changes, relies_on=relies_on)

    def forward_context(self, run: Run, state: AmpState) -> AbstractContextManager[Any]:
        return torch.autocast(state.device_type, dtype=state.dtype)

    def grad_scaler(self, state: AmpState) -> torch.amp.GradScaler | None:
        return state.scaler

    def bypassed(self, run: Run, state: AmpState, call: Call) -> str:
        """A scaled loss stepped by the loop's optimizer.step(), or the loop's unscaled loss stepped through the
        scaler, would step gradients 65536x off: the scaler stands aside, and scaled gradients are unscaled."""
        state.idle, done = True, ""
        if call == "step" and state.scaled and id(run.optimizer) not in state.unscaled:
            scale = state.scaler.get_scale()
            grads = [p.grad for p in run.unwrap().parameters() if p.grad is not None]
            for grad in grads:
                grad.div_(scale)
            done = " (this step's scaled gradients were unscaled first)"
            if not all(bool(torch.isfinite(g).all()) for g in grads):  # what the scaler's step would have skipped
                for param in run.unwrap().parameters():
                    param.grad = None
                done = (" (this step's scaled gradients overflowed: they were dropped, so your optimizer.step() "
                        "skipped it, as the GradScaler would have)")
        state.scaled = False
        return ("idle from here on: autocast goes on (run.autocast()), but no loss scaling, so fp16 gradients may "
                "underflow" + done)

    def backward(self, run: Run, state: AmpState, loss: torch.Tensor,
                 proceed: Callable[[torch.Tensor], None]) -> None:
        state.scaled = state.scaler is not None and not state.idle
        proceed(state.scaler.scale(loss) if state.scaled else loss)

    def unscale_gradients(self, run: Run, state: AmpState, optimizer: torch.optim.Optimizer | None) -> None:
        # once per step, however many readers ask (your code, grad_clipping): the GradScaler refuses a second
        # unscale_ before its update, and its step then uses these gradients
        if state.scaler is None or state.idle or optimizer is None:  # (check() refuses scaling without one)
            return
        has_gradients = any(p.grad is not None for group in optimizer.param_groups for p in group["params"])
        if id(optimizer) not in state.unscaled and has_gradients:
            # (with no gradients yet the scaler would record no inf check, and its step would then refuse)
            state.scaler.unscale_(optimizer)
            state.unscaled.add(id(optimizer))

    def optimizer_step(self, run: Run, state: AmpState, optimizer: torch.optim.Optimizer,
                       proceed: Callable[[torch.optim.Optimizer], bool]) -> bool:
        if state.scaler is None or state.idle:
            return proceed(optimizer)
        scale = state.scaler.get_scale()
        state.scaler.step(optimizer)
        state.scaler.update()
        state.unscaled.clear()  # update() starts every optimizer's unscaling afresh (yours too: a second optimizer)
        state.scaled = False
        return state.scaler.get_scale() >= scale  # the scaler lowers its scale exactly when it skipped the step
