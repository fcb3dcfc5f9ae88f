"""Handing out a loader's units round robin over its readers: the pure definition of the
``handout`` kernel (``zephon._ext.handout.RoundRobin``, on which the trainer's iterator in
``zephon.torch._iterator`` is built).

A reader's units wait in a *cursor* (``zephon._ext.handout.Cursor``): its bundle's ``units``,
from ``next`` up to ``count`` (the units made so far: at ``count``, ``refill`` makes the
bundle's next ones or moves on to the next bundle), each handed out with the reader's position
after it (``ends``): as ``make(unit)`` when ``make`` is set (a bundle's strings, made a batch at a
time), and, when ``names`` is set, as ``{keys[0]: unit, keys[1]: names[k]}`` (a batch of
pointers and its component names, made as it is handed out). The subclass supplies
``refill(reader)`` (store the reader's cursor with units to hand out in ``cursors`` and
return it; None after its last), ``finish()`` (the readers ended) and ``run_out()`` (the ``even`` budget
ran out); both end the iteration.
"""
from __future__ import annotations

from collections import deque
from typing import Any


class RoundRobinReference:
    """Yields the units of ``rotation``'s readers round robin, from ``rotation[0]`` on, passing
    over readers that ended; remembers each reader's position and the last ``lag`` units'
    ``(reader, position before)``, and counts the units into ``yielded`` and ``even.given``.
    (The kernel keeps the rotation as a list and the index of the next reader.)"""

    def __init__(self, rotation: list[int], positions: dict[int, int], lag: int, keys: tuple[str, str],
                 even: Any = None):
        self.rotation = deque(rotation)  # the next reader first
        self.cursors: dict[int, Any] = dict.fromkeys(rotation)
        self.positions, self.keys, self.even = positions, keys, even
        self.recent: deque[tuple[int, int]] = deque(maxlen=lag)
        self.yielded = 0

    def __iter__(self) -> RoundRobinReference:
        return self

    def __next__(self) -> Any:
        if self.even is not None and self.even.left <= 0:
            self.run_out()
            raise StopIteration
        while self.rotation:
            reader = self.rotation[0]
            cursor = self.cursors[reader]
            if cursor is None or cursor.next == cursor.count:
                cursor = self.refill(reader)
                if cursor is None:
                    self.rotation.popleft()
                    continue
            return self._take(reader, cursor)
        self.finish()
        raise StopIteration

    def _take(self, reader: int, cursor: Any) -> Any:
        """The reader's next unit, with its position and turn moved on past it (all made
        first: a unit whose making, names or position raise changes nothing)."""
        k = cursor.next
        unit = cursor.units[k]
        if cursor.make is not None:
            unit = cursor.make(unit)
        if cursor.names is not None:
            unit = {self.keys[0]: unit, self.keys[1]: cursor.names[k]}
        end = cursor.ends[k]
        self.recent.append((reader, self.positions[reader]))
        cursor.next = k + 1
        cursor.units[k] = None
        self.positions[reader] = end
        self.rotation.rotate(-1)
        self.yielded += 1
        if self.even is not None:
            self.even.given += 1
        return unit

    def upcoming(self) -> int | None:
        """The reader whose unit comes next (None once every reader ended)."""
        return self.rotation[0] if self.rotation else None

    def refill(self, reader: int) -> Any:
        raise NotImplementedError

    def finish(self) -> None:
        raise NotImplementedError

    def run_out(self) -> None:
        raise NotImplementedError
