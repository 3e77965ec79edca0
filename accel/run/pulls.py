"""A rebuilt loader's sampler pulled, and its random numbers drawn, when the user's own loader would draw them.

A sampler may draw as it is pulled (RandomSampler its next permutation once its epoch runs out, with replacement
every few samples), and torch's worker iterator pulls index batches ahead of the loop: none without workers, at
iter() ``prefetch_factor * num_workers`` of them and one more for each batch with workers. A loader rebuilt with
another number of workers pulls at other times: further ahead, its draws are put back after each batch (made again
before the next) so the generators stand where the plain loader's would, also when the loop leaves the epoch there,
and the pull past a torch sampler's end (it yields nothing) waits for the plain loader's time, so a pass over the
same loader in between draws as in the plain loop; less far, it pulls ahead itself, holding the indices for its
iterator."""
from __future__ import annotations

import collections
import copy
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, Sampler

from accel.errors import LoopWarning, loops_level

_END = object()
_PLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # rebuilt loader -> the user's (workers, ahead)


def ahead_of(loader: Any) -> int:
    """How many index batches a DataLoader's iterator pulls at iter(), ahead of the loop (one more each batch)."""
    workers = loader.num_workers
    return workers * (loader.prefetch_factor or 2) if workers else 0


def generators_of(loader: Any) -> tuple[list[torch.Generator], bool]:
    """The CPU generators a pull of the loader's sampler may draw from: those its samplers hold (a batch sampler's
    sampler's too, a Sampler or not); unless all are torch's own (which draw from no other after their first pull,
    and whose length is exact: said second), torch's global one and the loader's too."""
    found, todo, own = [], [(loader._index_sampler, 0)], True
    while todo:
        sampler, depth = todo.pop()
        own = own and (type(sampler).__module__.startswith("torch.utils.data") or type(sampler) in (list, range))
        for name, value in list(vars(sampler).items()) if hasattr(sampler, "__dict__") else ():
            if isinstance(value, torch.Generator):
                found.append(value)
            elif (isinstance(value, Sampler) or name == "sampler") and depth < 3:
                todo.append((value, depth + 1))
    if not own:
        found += [torch.default_generator, loader.generator]
    unique = {id(g): g for g in found if g is not None and g.device.type == "cpu"}
    return list(unique.values()), own


def state(generator: torch.Generator) -> bytes:
    return bytes(generator.get_state().numpy())


def put(generator: torch.Generator, saved: bytes) -> None:
    generator.set_state(torch.frombuffer(bytearray(saved), dtype=torch.uint8))


class Pulls:
    """One iteration of a sampler, pulled (counted, also past its end), each pull's draws on the generators recorded
    (the states before and after) so that those past the plain loader's pulls can be put back and made again."""

    def __init__(self, order: Iterator[Any], generators: list[torch.Generator], length: int | None):
        self.order, self.generators, self.length = order, generators, length
        self.made = 0
        self.held: collections.deque = collections.deque()  # pulled ahead for the iterator (see ahead)
        self.draws: dict[torch.Generator, list[tuple[int, bytes, bytes]]] = {g: [] for g in generators}
        self.last: list[bytes] | None = None  # the states after the last pull, while nothing else can have drawn
        self.delivered, self.ended = 0, False  # the batches the loop was given of this iteration (see Timing)
        self.rewound: dict[torch.Generator, tuple[bytes, bytes]] = {}  # generator -> (state put back, its state)

    def __iter__(self) -> Pulls:
        return self

    def __next__(self) -> Any:
        if not self.held and self.made == self.length:  # the pull past the end yields nothing: made (and its draws,
            raise StopIteration  # RandomSampler's next permutation) only when the plain loader makes it (ahead)
        item = self.held.popleft() if self.held else self.pull()
        if item is _END:
            raise StopIteration
        return item

    def pull(self) -> Any:
        before = self.last or [state(g) for g in self.generators]
        self.made += 1
        try:
            return next(self.order, _END)
        finally:
            self.last = [state(g) for g in self.generators]
            for g, was, now in zip(self.generators, before, self.last):
                if was != now:
                    self.draws[g].append((self.made, was, now))

    def ahead(self, count: int) -> None:
        """Pull until ``count`` pulls are made, as the plain loader's prefetching makes them; held for the iterator."""
        while self.made < count:
            self.held.append(self.pull())


class Order:
    """The sampler a rebuilt loader's iterator is given: each iteration of it pulled through a Pulls. ``drawn``: its
    one iteration made now, as the plain loader makes it at iter(); every iteration of this one is that one."""

    def __init__(self, sampler: Any, generators: list[torch.Generator], exact: bool, drawn: bool = False):
        self.sampler, self.generators, self.drawn = sampler, generators, drawn
        self.length = len(sampler) if exact else None  # (the pulls that yield, where torch's own samplers say it)
        self.pulls = Pulls(iter(sampler), generators, self.length) if drawn else None

    def __iter__(self) -> Pulls:
        if not self.drawn:
            self.pulls = Pulls(iter(self.sampler), self.generators, self.length)
        return self.pulls

    def __len__(self) -> int:
        return len(self.sampler)


class Timing:
    """An epoch's pulls kept to the plain loader's: after each batch (and at iter(): ``align``), as many pulls made
    as it would have made, and the draws of any further ones put back; before the next batch (``before``), made again.
    A generator drawn from in between (not by this loader) leaves it with draws made on another state than the plain
    loader's: said, and left as it is."""

    def __init__(self, order: Order, plain_ahead: int):
        self.order, self.plain_ahead, self.said = order, plain_ahead, False

    def before(self) -> None:  # (the order's iteration now: persistent workers' iterator, iter() again, iterates it
        pulls = self.order.pulls  # afresh under an epoch that goes on reading it, as torch's own loader does)
        pulls.last = None
        for generator, (back, had) in pulls.rewound.items():
            if state(generator) == back:
                put(generator, had)
            else:
                self.drifted(generator)
        pulls.rewound = {}

    def result(self, ended: bool) -> None:
        self.order.pulls.delivered += not ended
        self.order.pulls.ended = ended
        self.align()

    def align(self) -> None:
        pulls = self.order.pulls
        count = self.plain_ahead + pulls.delivered if self.plain_ahead else pulls.delivered + pulls.ended
        pulls.ahead(count)
        for generator, draws in pulls.draws.items():
            draws[:] = [draw for draw in draws if draw[0] > count]
            if not draws:
                continue
            now = state(generator)
            if now == draws[-1][2] and all(a[2] == b[1] for a, b in zip(draws, draws[1:])):
                put(generator, draws[0][1])
                pulls.rewound[generator] = (draws[0][1], now)
            else:
                self.drifted(generator)
        pulls.last = None

    def drifted(self, generator: torch.Generator) -> None:
        self.order.pulls.draws[generator].clear()
        if not self.said:
            self.said = True
            warnings.warn("accel: run.loader: a generator its sampler draws from was drawn from elsewhere while the "
                          "rebuilt loader's workers had pulled the sampler ahead of your loader: the sampler drew on "
                          "another random state than in the plain loop, so the batches from here may differ; give "
                          "the sampler a generator nothing else draws from, or set num_workers on your DataLoader "
                          "instead of the loader plan's",
                          LoopWarning, stacklevel=loops_level())


def rebuilt_from(rebuilt: Any, loader: Any) -> None:
    """Remember, for a loader rebuilt from ``loader``, how the user's own loader pulls (through every rebuild)."""
    _PLAIN[rebuilt] = _PLAIN.get(loader) or (loader.num_workers, ahead_of(loader))


def timed_as_plain(loader: Any) -> Callable[[], tuple[Iterator[Any], Timing | None]]:
    """How to make an epoch's iterator of ``loader`` at its first batch, with the Timing that keeps its pulls to the
    plain loader's (None: they are), drawing torch's random numbers when the user's own loader would: at iter() its
    sampler's iteration (a sampler may draw its order there) and its seed, then the order at the first batch without
    workers; with workers at iter(), from a second iteration of the sampler (torch's worker iterator iterates it
    again, and prefetches). So a loader rebuilt with another number of workers, zipped with another loader that
    draws from the same random state, or left by the loop before its epoch ends, reads the plain loop's batches."""
    try:
        plain = _PLAIN.get(loader)
    except TypeError:  # (not a loader a dict can key: not one rebuild_loader made)
        plain = None
    if plain is None or plain[1] == (ahead := ahead_of(loader)) or isinstance(loader.dataset, IterableDataset):
        iterator = iter(loader)
        return lambda: (iterator, None)  # (a stream's sampler draws nothing)
    (plain_workers, plain_ahead), workers = plain, loader.num_workers
    generators, exact = generators_of(loader) if ahead > plain_ahead else ([], False)  # (only further pulls draw early)
    attribute = "batch_sampler" if loader._auto_collation else "sampler"
    if plain_workers == 0 and not loader.persistent_workers:
        order = Order(loader._index_sampler, generators, exact, drawn=True)
        seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()  # as iter() draws it

        def make() -> tuple[Iterator[Any], Timing]:  # the workers' iterator of a copy of the loader, on that order
            drawn = copy.copy(loader)  # and seed
            object.__setattr__(drawn, attribute, order)
            drawn.generator = torch.Generator().manual_seed(seed)
            return iter(drawn), Timing(order, plain_ahead)
        return make
    if not workers:  # as workers draw: the order now, of the sampler iterated again, pulled as far as they pull
        iterator = iter(loader)
        order = Order(iterator._index_sampler, generators, exact)
        iterator._sampler_iter = iter(order)
    else:  # workers of another number: the iterator is given the order (persistent ones keep it, and iterate it)
        order = getattr(getattr(loader, "_iterator", None), "_index_sampler", None)
        if not isinstance(order, Order):
            order = Order(loader._index_sampler, generators, exact)
            object.__setattr__(loader, attribute, order)
        try:
            iterator = iter(loader)
        finally:
            object.__setattr__(loader, attribute, order.sampler)
        if order.pulls is None:  # (a persistent iterator made before, on the sampler itself)
            return lambda: (iterator, None)
    timing = Timing(order, plain_ahead)
    timing.align()
    return lambda: (iterator, timing)
