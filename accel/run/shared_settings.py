"""Process-wide values shared by every open run, as layers a journal entry (accel/run/journal.py) puts on and takes off.

Each value (an environment variable, torch's threads, the affinity, the process group) is a ``Setting``: its value
before the first run (``base``) and one ``Layer`` per journal entry that set it; the live value is the newest layer's,
so runs closed in any order leave the process as it was. A value the user set while runs had layers on it wins."""
from __future__ import annotations

import bisect
import contextlib
import itertools
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or (type(a) is type(b) and bool(a == b))
    except Exception:  # an __eq__ that gives no truth value: not the same
        return False


@dataclass(eq=False)
class Setting:
    """One process-wide value and the layers open runs put on it; each layer knows how to read and write it."""

    base: Any  # the value under every layer: before the first run, or the user's own last write
    layers: list[Layer] = field(default_factory=list)  # oldest first (by Layer.order)

    def adopt_user_write(self, now: Any) -> None:
        """If the value (``now``) is not what the layers set, the user set it: that value wins, and the layers give
        up their claim (undoing them then changes nothing)."""
        if self.layers and not _same(now, self.layers[-1].value):
            self.layers.clear()
        if not self.layers:
            self.base = now


_SETTINGS: dict[Hashable, Setting] = {}  # key -> its Setting, while a layer is on it
_ORDER = itertools.count()  # layers are ordered by when they were made, and keep that order when redone
_LOCK = threading.RLock()


class Layer:
    """One journal entry's value for one Setting: ``put`` is its redo, ``take`` its undo."""

    def __init__(self, key: Hashable, value: Any, read: Callable[[], Any], write: Callable[[Any], None]):
        self.key, self.value, self.read, self.write = key, value, read, write
        self.order = next(_ORDER)

    def put(self) -> None:
        """Lay this value on its setting, in the place it was made (a redo by tune or by a failed accelerate()
        goes back under the runs made after it); it goes live when it is the newest layer."""
        with _LOCK:
            setting = _SETTINGS.setdefault(self.key, Setting(base=None))  # its base is read just below
            setting.adopt_user_write(self.read())
            if self in setting.layers:
                return
            bisect.insort(setting.layers, self, key=lambda layer: layer.order)
            if setting.layers[-1] is self:
                try:
                    self.write(self.value)
                    self.value = self.read()  # what the value reads as (e.g. the affinity, sorted)
                except BaseException:
                    with contextlib.suppress(Exception):  # the write's own error is the one to report
                        self._lift(setting)
                    raise

    def take(self) -> None:
        """Lift this value off: the setting takes the newest value left, or its base; nothing happens when the
        user has set it since (their value stays) or the layer is not on (undone already, or its claim given up)."""
        with _LOCK:
            setting = _SETTINGS.get(self.key)
            if setting is None:
                return
            setting.adopt_user_write(self.read())  # every run that opens or closes sees the user's writes
            self._lift(setting)

    def _lift(self, setting: Setting) -> None:
        """Off its setting, which takes the newest value left (or its base) if this one was live; a setting left
        with no layer leaves the registry."""
        try:
            if self in setting.layers:
                newest = setting.layers[-1] is self
                setting.layers.remove(self)
                if newest:
                    self.write(setting.layers[-1].value if setting.layers else setting.base)
        finally:
            if not setting.layers and _SETTINGS.get(self.key) is setting:
                del _SETTINGS[self.key]


def set_by_runs(key: Hashable) -> bool:
    """Whether an open run set this value (``("environ", name)``, ``"torch threads"``, ...), and the user has
    not set it since: such a value is no user's choice to keep."""
    with _LOCK:
        newest = _SETTINGS[key].layers[-1] if key in _SETTINGS and _SETTINGS[key].layers else None
        return newest is not None and _same(newest.read(), newest.value)
