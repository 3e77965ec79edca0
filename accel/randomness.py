"""Random states, taken and put back: this process's (torch, CUDA, XPU, Python, NumPy) and a DataLoader's (its
generator, its sampler's, its batch sampler's). Whatever accel does with the user's loader before the loop does must
leave them as they were, so the loop sees the batches the plain loop would see."""
from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


def rng_state() -> dict[str, Any]:
    """This process's random states, as tensors and plain types (loadable with weights_only=True)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    with contextlib.suppress(ImportError):
        import numpy as np

        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss)
    for kind in ("cuda", "xpu"):
        module = getattr(torch, kind, None)
        if module is not None and module.is_available() and module.is_initialized():
            state[kind] = module.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, version_state, gauss = state["python"]
    random.setstate((kind, tuple(version_state), gauss))
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))
    for kind in ("cuda", "xpu"):
        if kind in state and getattr(torch, kind).is_available():
            getattr(torch, kind).set_rng_state_all(state[kind])


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The generators a DataLoader draws from: its own, its sampler's, its batch sampler's sampler's."""
    sampler = getattr(loader, "sampler", None)
    inner = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    found = {id(g): g for g in (getattr(loader, "generator", None), getattr(sampler, "generator", None),
                                getattr(inner, "generator", None)) if isinstance(g, torch.Generator)}
    return list(found.values())


@dataclass
class Saved:
    """Random states and a loader's iterator as they were when taken; restore() puts them back (any number of
    times, e.g. before each candidate tune measures)."""

    process: dict[str, Any]
    generators: list[tuple[torch.Generator, torch.Tensor]] = field(default_factory=list)
    loader: Any = None
    iterator: Any = None

    def restore(self) -> None:
        set_rng_state(self.process)
        for generator, state in self.generators:
            generator.set_state(state)
        if self.loader is not None and hasattr(self.loader, "_iterator"):
            self.loader._iterator = self.iterator  # a persistent-workers loader keeps its iterator


def save(loader: Any = None) -> Saved:
    return Saved(rng_state(), [(g, g.get_state()) for g in loader_generators(loader)], loader,
                 getattr(loader, "_iterator", None))


@contextlib.contextmanager
def kept(loader: Any = None) -> Iterator[None]:
    """Everything random (and the loader's iterator) as it was on entry, whatever happens inside (a Ctrl-C landing
    on the restore's call too: it runs again, accel.run.interrupts)."""
    saved = save(loader)
    try:
        yield
    finally:
        try:
            saved.restore()
        except BaseException:
            saved.restore()
            raise


def first_batch(loader: Any) -> Any:
    """The loader's first batch (None when it has none), leaving the loader and every random state as they were.
    A DataLoader with persistent workers resets its one iterator on iter(), maybe the one the loop is in mid-epoch:
    the batch comes from an iterator of its own, whose workers are stopped after (kept() puts the loop's back)."""
    with kept(loader):
        live = getattr(loader, "_iterator", None)
        if live is not None:
            loader._iterator = None
        try:
            return next(iter(loader), None)
        finally:
            own = getattr(loader, "_iterator", None)
            if own is not None and own is not live and hasattr(own, "_shutdown_workers"):
                own._shutdown_workers()
