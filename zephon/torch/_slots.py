"""Shared-memory slots that carry bundles from forked DataLoader workers to the trainer.

Pickled through a worker's pipe, a bundle's arrays cost the trainer about as much as they
cost the worker to make (the bytes are copied four times and cross the pipe in pieces). So a
worker writes a bundle's arrays into a free slot of a shared anonymous mapping, made before
the workers are forked, and sends the slot's number in their place: on the pointer fast path
its pointers and component ids, for packed sequences its batches' ``(B, seq_len)`` arrays,
for columnar batches their strings' offsets and bytes (:func:`stow`). The trainer's tensors
(and strings' bytes, until they are made ``str``) are views of the slot, not copies: the slot
is *leased* to them and freed when the last of them is gone (a finalizer on the array they
view). A worker that finds none of its slots free sends that bundle through the pipe, so a
training loop that keeps its batches slows down but never waits. The mapping is plain
``mmap``, not a torch tensor: filling or sharing a large tensor runs OpenMP threads, which hang
in a trainer that was itself forked after using them.
"""
from __future__ import annotations

import itertools
import logging
import mmap
import weakref
from typing import Any

import numpy as np
import torch

from zephon.torch._collate import Strings

SPARE = 2  # slots per worker beyond the bundles torch keeps in flight: the one being read, the one before
_RECORD = 28  # bytes per sample in a pointer slot: three int64 pointer fields and an int32 component id
STOW_BYTES = 4096  # arrays from this size on are stowed in a slot; smaller ones cross the pipe
ALIGN = 64  # stowed arrays start at multiples of this (a cache line)
log = logging.getLogger("zephon")
_tokens = itertools.count()
_open: weakref.WeakValueDictionary[int, Slots] = weakref.WeakValueDictionary()  # the trainer's, by token


class Slots:
    """``count`` slots of ``width`` bytes for each of ``workers`` workers, with a semaphore per
    worker from multiprocessing ``context`` (a "fork" one: the slots reach the workers by fork
    only) that counts the worker's free slots, and a busy flag per slot."""

    def __init__(self, workers: int, width: int, count: int, context: Any):
        self.width, self.count, self.token = width, count, next(_tokens)
        self.capacity = width // _RECORD  # pointer samples a slot holds
        size = workers * count * width
        self._map = mmap.mmap(-1, size + workers * count)  # MAP_SHARED: forks share it
        self._busy = np.frombuffer(self._map, dtype=np.uint8)[size:].reshape(workers, count)  # 1 while leased
        self.free = [context.Semaphore(count) for _ in range(workers)]
        self.piped = False  # in a worker: it said (once) that a bundle found no free slot
        _open[self.token] = self

    @classmethod
    def for_pointers(cls, workers: int, capacity: int, count: int, context: Any) -> Slots:
        """Slots of ``capacity`` pointer samples each."""
        return cls(workers, capacity * _RECORD, count, context)

    def __reduce__(self) -> Any:
        raise TypeError("zephon's shared slots reach DataLoader workers by fork only")

    def region(self, worker: int, slot: int) -> np.ndarray:
        """The slot's bytes as one new array (views of it keep it, and so a lease, alive)."""
        at = (worker * self.count + slot) * self.width
        return np.frombuffer(memoryview(self._map)[at:at + self.width], dtype=np.uint8)

    def views(self, worker: int, slot: int, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The slot's first ``n`` (default: all its) pointers and component ids, over one region array."""
        raw = self.region(worker, slot)
        n = self.capacity if n is None else n
        pointers = raw[:self.capacity * 24].view(np.int64)[:n * 3].reshape(n, 3)
        return pointers, raw[self.capacity * 24:self.capacity * _RECORD].view(np.int32)[:n]

    def claim(self, worker: int) -> int | None:
        """In a worker: one of its free slots, now busy; None when every one is still leased."""
        if not self.free[worker].acquire(block=False):
            return None
        free = np.flatnonzero(self._busy[worker] == 0)
        if not len(free):  # the count ran ahead of the flags: keep the slot counted as taken
            return None
        slot = int(free[0])
        self._busy[worker, slot] = 1
        return slot

    def compact(self, worker: int, slot: int, n: int, keep: np.ndarray) -> None:
        """Keep only rows ``keep`` (ascending) of the slot's ``n`` samples, moved to its front."""
        pointers, components = self.views(worker, slot, n)
        pointers[:len(keep)], components[:len(keep)] = pointers[keep], components[keep]

    def carried(self, slot: int, n: int) -> tuple[int, int, int]:
        """What a bundle carries in place of its ``n`` samples in ``slot``: ``(token, slot, n)``."""
        return self.token, slot, n

    def say_piped(self, worker: int) -> None:
        """In a worker that found every slot leased: say so, once (its bundle takes the pipe)."""
        if not self.piped:
            self.piped = True
            log.debug("zephon: reader %d sends bundles through the pipe: all %d of its shared slots are still leased "
                      "(batches the loop keeps, or bundles waiting in the trainer); slower, nothing lost", worker,
                      self.count)

    def release(self, worker: int, slot: int) -> None:
        """Free a slot (a worker's that went unused, or the trainer's last view gone)."""
        self._busy[worker, slot] = 0
        self.free[worker].release()


def take(worker: int, carried: tuple[int, int, int]) -> tuple[torch.Tensor, np.ndarray]:
    """In the trainer: a bundle's pointers (an int64 tensor) and component ids, over its slot,
    leased until the last view of either is gone."""
    token, slot, n = carried
    slots = _open[token]
    pointers, components = slots.views(worker, slot, n)
    weakref.finalize(pointers.base, slots.release, worker, slot)
    return torch.from_numpy(pointers), components


class _Stowed:
    """An array stowed in a slot, in its place in a unit: where it starts, its dtype and shape."""

    __slots__ = ("at", "dtype", "shape")

    def __init__(self, at: int, dtype: str, shape: tuple[int, ...]):
        self.at, self.dtype, self.shape = at, dtype, shape

    def __reduce__(self) -> tuple[Any, ...]:
        return _Stowed, (self.at, self.dtype, self.shape)

    def view(self, region: np.ndarray) -> np.ndarray:
        """The array, over the slot's ``region``."""
        size = int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize
        return region[self.at:self.at + size].view(self.dtype).reshape(self.shape)


class _StowedStrings:
    """A column of :class:`Strings` stowed in a slot: its offsets and its bytes."""

    __slots__ = ("offsets", "data")

    def __init__(self, offsets: _Stowed, data: _Stowed):
        self.offsets, self.data = offsets, data

    def __reduce__(self) -> tuple[Any, ...]:
        return _StowedStrings, (self.offsets, self.data)


def _put(region: np.ndarray, at: int, array: np.ndarray) -> tuple[_Stowed, int] | None:
    """``array`` copied into ``region`` from ``at`` on: its place, and where the next may start
    (None: it does not fit)."""
    end = at + array.nbytes
    if end > len(region):
        return None
    region[at:end].view(array.dtype).reshape(array.shape)[...] = array
    return _Stowed(at, array.dtype.str, array.shape), -(-end // ALIGN) * ALIGN


def stow(slots: Slots, worker: int, units: list[Any], tensors: bool = True) -> tuple[int, int, int] | None:
    """In a worker: the large tensors (with ``tensors``) and the :class:`Strings` of dict
    ``units`` copied into a free slot, each replaced by its place there; what the bundle carries
    for them (None: no slot was free, or nothing was stowed). What does not fit stays as it is."""
    if not units:
        return None
    slot = slots.claim(worker)
    if slot is None:
        slots.say_piped(worker)
        return None
    region, at = slots.region(worker, slot), 0
    for unit in units:
        for key, value in unit.items():
            if type(value) is Strings:
                offsets = _put(region, at, value.offsets)
                data = None if offsets is None else _put(region, offsets[1], value.data)
                if offsets is not None and data is not None:
                    unit[key], at = _StowedStrings(offsets[0], data[0]), data[1]
            elif tensors and type(value) is torch.Tensor and value.nbytes >= STOW_BYTES:
                put = _put(region, at, value.numpy())
                if put is not None:
                    unit[key], at = put
    if at == 0:
        slots.release(worker, slot)
        return None
    return slots.carried(slot, at)


def unstow(worker: int, carried: tuple[int, int, int], units: list[Any]) -> list[Any]:
    """In the trainer: ``units`` with their stowed arrays as tensors, and their stowed strings as
    :class:`Strings`, over the slot, leased until the last of them is gone."""
    token, slot, _ = carried
    slots = _open[token]
    region = slots.region(worker, slot)
    weakref.finalize(region, slots.release, worker, slot)
    for unit in units:
        for key, value in unit.items():
            if type(value) is _Stowed:
                unit[key] = torch.from_numpy(value.view(region))
            elif type(value) is _StowedStrings:
                unit[key] = Strings(value.offsets.view(region), value.data.view(region))
    return units
