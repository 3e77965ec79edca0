"""The switch between arms of plan="auto" in your loop: accelerate() on your own objects with the next plan (the
earlier run undone, its counters handed over, each accelerator's state kept for its next turn), and run.loader,
which prepares your batches by the plan taking its turn and counts the loop's wait for data."""
from __future__ import annotations

import warnings
from typing import Any

from accel import clock
from accel.plan.contract import REGISTRY
from accel.search.arms import Arm
from accel.api import accelerate
from accel.errors import AccelerateError, PlanError


class Switching:
    """The switch of a TuningRun (inloop.py), apart because it is one job."""

    def _switch(self, plan: dict[str, dict], arm: Arm | None = None) -> bool:
        """accelerate() on your objects with this plan (the earlier run handed over); False when it is refused.
        Under a launcher every plan carries ddp or fsdp (ranks.in_step), the group held across the switch."""
        plan = {**plan, **self.distributed}
        if self.current.plan.to_dict() == plan and not self.current.closed:
            self.switched_at = clock.now()
            return True
        model, optimizer, loader = self._objects
        started = clock.now()
        leaving = [a.name for a in self.current.accelerators]
        for name in leaving:  # each arm's state (amp's GradScaler) waits for its next turn
            self.saved[name] = self.current.accelerator_state_dict(name)
        try:
            self.current = accelerate(model, optimizer, loader, plan=plan, device=self.device)
            self.current.report.search = self.search  # every plan's report says what auto has done so far
            self.capture.attach()  # after the plan's own hooks on your model
            for accelerator in self.current.accelerators:  # those handed over by the run before already have it
                if accelerator.name not in leaving and accelerator.name in self.saved:
                    try:
                        self.current.load_accelerator_state(accelerator.name, self.saved[accelerator.name])
                    except ValueError:  # another configuration of it (bf16 after fp16): it starts afresh
                        pass
        except (PlanError, AccelerateError) as error:  # the earlier run is back as it was
            if arm is not None:
                arm.status = "refused" if isinstance(error, PlanError) else "failed"
                lines = [line.strip(" -") for line in str(error).splitlines()]
                arm.reason = "; ".join(line for line in lines[1:] if line)[:300] or lines[0]
            return False
        finally:
            self.switched_at = clock.now()
            self.switch_s += self.switched_at - started
        return True

    def _take(self, plan: dict[str, dict]) -> None:
        """The chosen plan now, but its rebuilt loader only from the next epoch."""
        now = {k: v for k, v in plan.items() if REGISTRY[k].switch_at != "epoch"}
        if now != plan:
            self.pending = plan
        self._switch(now)

    def epoch_boundary(self) -> None:
        if self.pending is not None:
            plan, self.pending = self.pending, None
            self._switch(plan)


def _of_your_loader(name: str) -> property:
    return property(lambda self: getattr(self.loader, name), doc=f"your loader's {name}")


class TuningLoader:
    """run.loader during the search: your loader's batches, prepared by the plan taking its turn, and the time the
    loop waits for each one counted. Your loader's own attributes: run.loader.loader (the most read ones, dataset,
    sampler, batch_size..., also here)."""

    def __init__(self, tuning: Any):  # a TuningRun
        self.tuning = tuning

    def __iter__(self):
        tuning = self.tuning
        tuning.epoch_boundary()
        inner = tuning.current.loader
        batches = iter(inner.start_epoch())
        while True:
            started = clock.now()
            try:
                batch = next(batches)
            except StopIteration:
                return
            tuning.data_wait_s += clock.now() - started
            if tuning.bypassed and tuning.phase != "settled":
                tuning._end_bypassed()
            tuning.first_batch(batch)
            yield tuning.current.loader.prepare(batch)

    def __len__(self) -> int:
        return len(self.tuning.current.loader)

    @property
    def current(self) -> Any:
        """The run.loader (accel.run.device_loader.DeviceLoader) of the plan taking its turn."""
        return self.tuning.current.loader

    @property
    def loader(self) -> Any:
        """The loader batches come from: yours, or the one the plan rebuilt (workers)."""
        return self.current.loader

    @property
    def epoch(self) -> int:
        return self.current.epoch

    @property
    def device(self) -> Any:
        return self.current.device

    def start_epoch(self) -> Any:
        return self.current.start_epoch()

    def prepare(self, batch: Any) -> Any:
        return self.current.prepare(batch)

    def __getattr__(self, name: str) -> Any:
        """0.3 forwarded every name; now the named ones stand above, the rest warn until 0.4 (docs/migration.md)."""
        if name.startswith("__") or name == "tuning":
            raise AttributeError(name)
        warnings.warn(f"accel: run.loader.{name} of plan='auto' is run.loader.loader.{name} (your loader's); the old "
                      "name goes in 0.4 (docs/migration.md)", DeprecationWarning, stacklevel=2)
        return getattr(self.current, name)


for _name in ("dataset", "sampler", "batch_sampler", "batch_size", "num_workers", "pin_memory", "drop_last",
              "generator", "collate_fn"):
    setattr(TuningLoader, _name, _of_your_loader(_name))


class States:
    """``run.state`` of a TuningRun. Called, an accelerator's run state, as on accel.Run; read as an attribute, 0.2's
    name of the search state (now ``run.search``), with a DeprecationWarning until 0.4."""

    def __init__(self, tuning: Any):  # a TuningRun
        self._tuning = tuning

    def __call__(self, name: str) -> Any:
        return self._tuning.current.state(name)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):  # no search field starts so (inspect asks for _partialmethod)
            raise AttributeError(key)
        warnings.warn(f"accel: run.state.{key} of plan='auto' is run.search.{key} (run.state(name) is an "
                      "accelerator's run state, as on accel.Run); the old name goes in 0.4 (docs/migration.md)",
                      DeprecationWarning, stacklevel=2)
        return getattr(self._tuning.search, key)
