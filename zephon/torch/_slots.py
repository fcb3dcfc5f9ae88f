"""Shared-memory slots that carry pointer bundles from forked DataLoader workers to the trainer.

Pickled through a worker's pipe, a bundle of pointers costs the trainer about as much as it
costs the worker to make it (the bytes are copied four times and cross the pipe in pieces).
So on the pointer fast path each worker writes a bundle's pointers and component ids into a
free slot of a shared anonymous mapping, made before the workers are forked, and sends the
slot's number in their place. The trainer's batches and the bundle's component ids are views
of the slot, not copies: the slot is *leased* to them and freed when the last of them is gone
(a finalizer on the array they view). A worker that finds none of its slots free sends that bundle through the pipe, so
a training loop that keeps its batches slows down but never waits. The mapping is plain
``mmap``, not a torch tensor: filling or sharing a large tensor runs OpenMP threads, which
hang in a trainer that was itself forked after using them.
"""
from __future__ import annotations

import itertools
import mmap
import weakref
from typing import Any, Sequence

import numpy as np
import torch

SPARE = 2  # slots per worker beyond the bundles torch keeps in flight: the one being read, the one before
_RECORD = 28  # bytes per sample in a slot: three int64 pointer fields and an int32 component id
_tokens = itertools.count()
_open: weakref.WeakValueDictionary[int, Slots] = weakref.WeakValueDictionary()  # the trainer's, by token


class Slots:
    """``count`` slots of ``capacity`` samples for each of ``workers`` workers, with a semaphore
    per worker from multiprocessing ``context`` (a "fork" one: the slots reach the workers by
    fork only) that counts the worker's free slots, and a busy flag per slot."""

    def __init__(self, workers: int, capacity: int, count: int, context: Any):
        self.capacity, self.count, self.token = capacity, count, next(_tokens)
        size = workers * count * capacity * _RECORD
        self._map = mmap.mmap(-1, size + workers * count)  # MAP_SHARED: forks share it
        self._busy = np.frombuffer(self._map, dtype=np.uint8)[size:].reshape(workers, count)  # 1 while leased
        self.free = [context.Semaphore(count) for _ in range(workers)]
        self.piped = False  # in a worker: it said (once) that a bundle found no free slot
        _open[self.token] = self

    def __reduce__(self) -> Any:
        raise TypeError("zephon's pointer slots reach DataLoader workers by fork only")

    def _views(self, worker: int, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The slot's first ``n`` pointers and component ids, over one new array of its bytes
        (views of that array keep it, and so the lease, alive)."""
        width = self.capacity * _RECORD
        at = (worker * self.count + slot) * width
        raw = np.frombuffer(memoryview(self._map)[at:at + width], dtype=np.uint8)
        pointers = raw[:self.capacity * 24].view(np.int64)[:n * 3].reshape(n, 3)
        return pointers, raw[self.capacity * 24:].view(np.int32)[:n]

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

    def write(self, worker: int, slot: int, at: int, pieces: Sequence[tuple[np.ndarray, np.ndarray]]) -> int:
        """Write consecutive ``(pointers, component ids)`` pieces into a claimed slot from
        sample ``at`` on; returns where they end."""
        end = at + sum(len(components) for _, components in pieces)
        into_pointers, into_components = self._views(worker, slot, end)
        for pointers, components in pieces:
            into_pointers[at:at + len(pointers)] = pointers
            into_components[at:at + len(pointers)] = components
            at += len(pointers)
        return end

    def compact(self, worker: int, slot: int, n: int, keep: np.ndarray) -> None:
        """Keep only rows ``keep`` (ascending) of the slot's ``n`` samples, moved to its front."""
        pointers, components = self._views(worker, slot, n)
        pointers[:len(keep)], components[:len(keep)] = pointers[keep], components[keep]

    def carried(self, slot: int, n: int) -> tuple[int, int, int]:
        """What a bundle carries in place of its ``n`` samples in ``slot``: ``(token, slot, n)``."""
        return self.token, slot, n

    def _release(self, worker: int, slot: int) -> None:
        self._busy[worker, slot] = 0
        self.free[worker].release()


def take(worker: int, carried: tuple[int, int, int]) -> tuple[torch.Tensor, np.ndarray]:
    """In the trainer: a bundle's pointers (an int64 tensor) and component ids, over its slot,
    leased until the last view of either is gone."""
    token, slot, n = carried
    slots = _open[token]
    pointers, components = slots._views(worker, slot, n)
    weakref.finalize(pointers.base, slots._release, worker, slot)
    return torch.from_numpy(pointers), components
