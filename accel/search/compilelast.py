"""compile last, in plan="auto" in your loop: on top of the winner, when its warm-up fits what is left of the budget
or, in a run of known length, a small share of the run still ahead (verdicts.warmup_fit, the rule tune() follows
too), then kept when it pays back (verdicts.payback). Its expected
warm-up is a warm start's when inductor's cache holds this setup's graphs (remembered.starts_warm), and the one
measured is remembered apart for a warm and a cold start."""
from __future__ import annotations

from accel import clock
from accel.search.arms import Arm
from accel.search.remembered import remember_warmup, starts_warm
from accel.search.turns import MIN_ROUNDS
from accel.search.verdicts import payback, run_ahead_s, settled_enough, warmup_fit


class CompileLast:
    """The compile-last step of a TuningRun (inloop.py), apart because it is one job."""

    def _try_compile(self, plan: dict[str, dict]) -> bool:
        """Start compile's rounds on top of the winner, if its warm-up fits; False when it is not tried."""
        if not self.costly:
            return False
        candidate = self.costly[0]
        # rank 0's view (a rank's cache folder and clock are its own): every rank tries compile, or none does
        self.compile_warm = self.ranks.decide(starts_warm(candidate, self._objects[0], self.device,
                                                          self.hardware.cpu_model))
        ahead = run_ahead_s(self.settings.expected_steps, self.steps, self.winner.median_s())
        fit = self.ranks.decide(warmup_fit(candidate, self.cache_key, self.settings.cache, self.compile_warm,
                                           self.deadline - clock.now(), ahead))
        self.compile_arm = Arm({**plan, **candidate}, tests=next(iter(candidate)))
        self.arms.append(self.compile_arm)
        if not fit.fits:
            self.compile_arm.status, self.compile_arm.reason = "not measured", fit.reason
            return False
        if fit.past_budget:  # its warm-up and its rounds, on the run's allowance
            self.deadline = clock.now() + 2 * fit.allowance_s
            self.notes.append(f"compile: {fit.reason}")
        self.compile_base = self.winner  # what compile goes on top of, and is compared with
        self.winner.status = "measuring"
        self.phase, self.phase_start = "compile", self.round + 1  # its rounds start after this one
        self.capture.remove()  # compile would trace hooks on the model: no replay in its rounds
        return True

    def _compile_verdict(self) -> None:
        """After one of compile's rounds: end them once it could not take its turn, or its ratio is clear."""
        if self.compile_arm.status != "measuring":  # refused, failed, loss not finite
            self._end_compile()
        elif (self.round + 1 - self.phase_start >= MIN_ROUNDS
              and settled_enough(self.compile_arm.ratio_to(self.winner), self.settings.margin)):
            self._end_compile()

    def _end_compile(self) -> None:
        arm, base = self.compile_arm, self.winner
        ratio = arm.ratio_to(base)
        step = base.median_s() or 0.0
        if arm.first_s is not None:
            arm.first_s = self.ranks.slowest(arm.first_s)  # the warm-up every rank waited for: the slowest rank's
        warmup = (arm.first_s or 0.0) - step
        if arm.first_s is not None:
            remember_warmup(self.costly[0], self.cache_key, self.settings.cache, warmup, self.compile_warm)
        expected = self.settings.expected_steps
        faster, break_even, pays = payback(ratio, step, warmup, self.settings.margin, expected)
        base.status = "settled"
        if arm.status != "measuring":  # it could not take its turns: said in its own status and reason
            self._finish_with(dict(base.plan))
            return
        if pays:
            arm.status, arm.reason = "settled", f"{ratio} of {base.name}'s step; warm-up {warmup:.1f} s pays back " \
                                                f"after {break_even} steps"
            self.winner = arm
        else:
            arm.status = "not chosen"
            arm.reason = (f"{ratio} of {base.name}'s step" + ("" if faster else ": not faster")
                          + (f"; its {warmup:.1f} s warm-up pays back after {break_even} steps, beyond the run's "
                             f"{expected}" if faster and not pays else ""))
        self._finish_with(dict(self.winner.plan))
