"""Shared-memory slots that carry pointer bundles from forked DataLoader workers to the trainer.

Pickled through a worker's pipe, a bundle of pointers costs the trainer about as much as it
costs the worker to make it (the bytes are copied four times and cross the pipe in pieces).
So on the pointer fast path each worker writes a bundle's pointers and component ids into one
of :data:`SLOTS` slots of a shared anonymous mapping, made before the workers are forked, and
sends the slot's number in their place; the trainer copies them out when the bundle arrives
and frees the slot. A semaphore per worker counts its free slots, so a worker never overwrites
a slot the trainer has not copied; torch keeps ``prefetch_factor`` bundles in flight per
worker, so with its default of 2 a worker seldom waits. The mapping is plain ``mmap``, not a
torch tensor: filling or sharing a large tensor runs OpenMP threads, which hang in a trainer
that was itself forked after using them.
"""
from __future__ import annotations

import itertools
import mmap
import weakref
from typing import Any

import numpy as np
import torch

SLOTS = 3  # per worker
WAIT = 0.1  # seconds a waiting worker sleeps between checks that the iteration is still open
_RECORD = 28  # bytes per sample in a slot: three int64 pointer fields and an int32 component id
_tokens = itertools.count()
_open: weakref.WeakValueDictionary[int, Slots] = weakref.WeakValueDictionary()  # the trainer's, by token


class Slots:
    """:data:`SLOTS` slots of ``capacity`` samples for each of ``workers`` workers, with the
    semaphores and the closing event of multiprocessing ``context`` (a "fork" one: the slots
    reach the workers by fork only)."""

    def __init__(self, workers: int, capacity: int, context: Any):
        self.capacity, self.token = capacity, next(_tokens)
        self._map = mmap.mmap(-1, max(1, workers * SLOTS * capacity * _RECORD))  # MAP_SHARED: forks share it
        self._raw = np.frombuffer(self._map, dtype=np.uint8)[:workers * SLOTS * capacity * _RECORD].reshape(
            workers, SLOTS, capacity * _RECORD)
        self.free = [context.Semaphore(SLOTS) for _ in range(workers)]
        self.closed = context.Event()
        self._written: dict[int, int] = {}  # in a worker: bundles written so far
        _open[self.token] = self

    def __reduce__(self) -> Any:
        raise TypeError("zephon's pointer slots reach DataLoader workers by fork only")

    def _views(self, worker: int, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        raw = self._raw[worker, slot]
        pointers = raw[:self.capacity * 24].view(np.int64)[:n * 3].reshape(n, 3)
        return pointers, raw[self.capacity * 24:].view(np.int32)[:n]

    def put(self, worker: int, pointers: np.ndarray, components: np.ndarray) -> tuple[int, int, int] | None:
        """Write a bundle's samples into the worker's next slot (waiting for it to be free);
        returns what the bundle carries instead (``(token, slot, n)``), None once closed."""
        while not self.free[worker].acquire(timeout=WAIT):
            if self.closed.is_set():
                return None
        slot = self._written.get(worker, 0) % SLOTS
        self._written[worker] = self._written.get(worker, 0) + 1
        n = len(pointers)
        into_pointers, into_components = self._views(worker, slot, n)
        into_pointers[...] = pointers
        into_components[...] = components
        return self.token, slot, n

    def close(self) -> None:
        """The iteration is over: workers stop waiting for slots."""
        self.closed.set()


def take(worker: int, carried: tuple[int, int, int]) -> tuple[torch.Tensor, np.ndarray]:
    """In the trainer: copy a bundle's pointers (int64 tensor) and component ids out of its slot
    and free the slot."""
    token, slot, n = carried
    slots = _open[token]
    pointers, components = slots._views(worker, slot, n)
    out = torch.from_numpy(pointers.copy()), components.copy()
    slots.free[worker].release()
    return out
