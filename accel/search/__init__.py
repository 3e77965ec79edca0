"""tune() and plan="auto": choose the plan by measuring stacks on the user's own model, optimizer and loader.

    result = accel.tune(model, optimizer, loader)            # or accelerate(..., plan=accel.Auto(...))
    print(result)                                             # every comparison, its interval, and why

The search (docs/measurement.md):

1. Candidates come from the registered accelerators (``Accelerator.candidates``): what this hardware and
   model can use. The baseline is the empty plan.
2. Gains do not add up, so it starts from the stack of everything (one configuration per accelerator, costly
   ones aside) and drops, one by one, each accelerator whose removal does not make the stack slower by more
   than the margin. Accelerators with a costly first step (compile) are tried last, on top of the best stack;
   with ``expected_steps`` they are kept only if their warm-up pays back within the run.
3. Every comparison is interleaved (A B, B A, ...) on copies of the user's objects, alive side by side, and
   adds rounds until the ratio's interval clears the margin or the budget is spent; a plan wins only when it is
   faster than the baseline with 95% confidence (and by the margin), and its losses over its first steps stay
   within the tolerance of the baseline's on the same batches. When the machine is too noisy to establish any
   plan, the result says so and keeps the empty plan.
4. The choice is remembered (``accel.plan.cache``) under a key of everything that decides it; the same setup
   asks again and gets the answer at once.

The user's model, optimizer, loader (its generator), torch's RNG and the process end as they started.
"""

from __future__ import annotations

from accel.search.config import MARGIN, Settings
from accel.search.results import TuneResult, TuneRow
from accel.search.search import generate_candidates, tune
from accel.plan import RESOLVERS

__all__ = ["Auto", "MARGIN", "TuneResult", "TuneRow", "generate_candidates", "tune"]


class Auto(Settings):
    """plan=accel.Auto(...) chooses the plan by measuring with these settings (accel.search.config.Settings);
    "auto" is Auto().

    Without step_fn/loss_fn/split it measures in your own loop (start: a TuningRun), in a launched job too (every
    rank runs the same arm, with ddp or fsdp: accel.search.ranks); otherwise apart (resolve: accel.tune, on
    copies; under a launcher, the single-process answer from the cache and ddp or fsdp by memory fit).
    """

    def in_loop(self) -> bool:
        from accel.hardware.launch import launcher_environment

        try:
            launcher_environment()
        except ValueError:  # said by the offline path, which decides the launch as accelerate() does
            return False
        return self.step_fn is None and self.loss_fn is None and self.split is None

    def start(self, model, optimizer, loader, device="auto"):
        from accel.search.inloop import TuningRun

        return TuningRun(self, model, optimizer, loader, device)

    def resolve(self, model, optimizer, loader, device="auto") -> TuneResult:
        """The offline search's answer; in a launched job of several ranks, the single-process answer for this
        setup from the cache plus ddp or fsdp by memory fit, its why saying where the answer came from."""
        from accel.search.distribution import with_source
        from accel.hardware.launch import launcher_environment

        result = tune(model, optimizer, loader, device=device, budget_s=self.budget_s,
                      expected_steps=self.expected_steps, step_fn=self.step_fn, loss_fn=self.loss_fn,
                      split=self.split, tolerance=self.tolerance, margin=self.margin, candidates=self.candidates,
                      accelerators=self.accelerators, cache=self.cache, warmup=self.check_steps,
                      memory_per_rank=self.memory_per_rank)
        launch = launcher_environment()  # tune() decided the launch already: this reads the same, valid one
        return with_source(result) if launch is not None and launch.world_size > 1 else result


RESOLVERS["auto"] = Auto
