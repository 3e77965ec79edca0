"""A loss that is not finite during plan="auto" in your loop: caught at the step (on a CPU) or at the chunk's end (on
an accelerator), and judged by replaying the step under the plain loop (fault.py): an arm pays only for its own."""
from __future__ import annotations

from accel import clock
from accel.search.arms import finite
from accel.search.fault import Blame, Fault, blame, record, snapshot


class FaultWatch:
    """The faults of a TuningRun (inloop.py), apart because it is one job."""

    def _check_step(self) -> None:
        """Before a step's update: on a CPU (where reading a loss costs nothing) its loss is checked now, so a fault is
        judged in the weights it happened in (a copy is kept, its time left out of the chunk's); on an accelerator the
        step is kept for the chunk's end."""
        losses, calls, self.step_losses, self.step_calls = self.step_losses, self.step_calls, [], []
        if self.fault is not None or not losses:
            return
        if self.device.type != "cpu":
            self.chunk.record.append((self.steps + 1, losses, calls))
            return
        if finite(losses):
            return
        started = clock.now()
        state = snapshot(self._objects[0]) if self.active is not self.plain else None
        self.fault = Fault(self.steps + 1, self.active.name, calls, state)
        spent = clock.now() - started  # not the plan's time: the chunk's marks move past it
        self.chunk.started, self.chunk.last_end = self.chunk.started + spent, self.chunk.last_end + spent

    def _chunk_fault(self) -> Fault | None:
        """On an accelerator, the chunk's first step whose loss was not finite (judged in the weights as they are)."""
        for step, losses, calls in self.chunk.record:
            if not finite(losses):
                return Fault(step, self.active.name, calls)
        return None

    def _judge(self, fault: Fault) -> Blame:
        """Whose fault: the plan's, or the plain loop's too (replayed under it, nothing changed: fault.py)."""
        if self.active is self.plain:
            blamed = Blame(False, "the data or the loop", f"a loss was not finite at step {fault.step} under the "
                                                          "plain loop itself", fault.step, fault.arm)
        else:
            self._switch({})  # the plain loop, to replay the step's forward under
            blamed = blame(self._objects[0], fault, self.settings.tolerance, self.capture)
        if not blamed.plan:
            record(self.blames, blamed)
        return blamed
