"""The trainer side of zephon.torch.DataLoader: the readers' bundles reassembled into batches.

The main process unpacks the bundles the readers send (``zephon.torch._bundles``) and yields
their batches round robin over the readers, like a plain torch DataLoader; after every batch
it knows each reader's position, so the loader's ``state_dict()`` is exact for what the
training loop has received, whatever was prefetched.

With ``even_batches`` the iterator stops after the rank's equal-steps budget
(``zephon.runtime.Even``) and counts what it holds back; ``stats()`` counts what the loop
received (``zephon.runtime.LoaderStats``). A worker that dies is reported by name
(``zephon.torch._workers``).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Mapping

import numpy as np
import torch

from zephon.runtime import (
    KEY_COMPONENT, KEY_SAMPLE_ID, SERVED, Entry, Even, LoaderStats, Pipeline, RankCount, Tracker, log_once,
)
from zephon.torch._bundles import Bundle, Plan
from zephon.torch._workers import WorkerDiedError, dead_worker


class _Cursor:
    """The main process's place in one bundle."""

    __slots__ = ("bundle", "next", "count", "pointers", "names", "ids", "size")

    def __init__(self, bundle: Bundle, pipeline: Pipeline, size: int | None):
        self.bundle, self.next, self.size = bundle, 0, size
        self.pointers: Any = None  # torch tensor of the bundle's pointers
        self.names: Any = None  # component names, one per pointer
        self.ids: Any = None  # pointers as lists (one item at a time)
        if bundle.pointers is not None:
            pointers = bundle.pointers
            if isinstance(pointers, np.ndarray):  # int32 where its pointers fit (numpy widens them single-threaded)
                pointers = torch.from_numpy(pointers.astype(np.int64, copy=not pointers.flags.writeable))
            self.pointers = pointers.to(torch.int64)
            n = len(pointers)
            self.count = n if size is None else len(bundle.ends or ())
            assert bundle.components is not None  # bundles of pointers carry their components
            self.names = pipeline.component_names(bundle.components)
            if size is None:
                self.ids = pointers.tolist()
        else:
            assert bundle.units is not None  # a bundle holds pointers or units
            self.count = len(bundle.units)

    def take(self, stats: LoaderStats) -> tuple[Any, int]:
        k, bundle = self.next, self.bundle
        self.next += 1
        if bundle.units is not None:
            assert bundle.ends is not None and bundle.tally is not None and bundle.dropped is not None  # units carry these
            unit, bundle.units[k] = bundle.units[k], None
            stats.count(bundle.tally[k])
            stats.filtered += bundle.dropped[k]
            stats.drop_last += bundle.skipped[k] if bundle.skipped is not None else 0
            return unit, bundle.ends[k]
        assert bundle.components is not None  # a bundle of pointers carries their components
        if self.size is None:
            stats.count(bundle.components[k:k + 1])
            return {KEY_SAMPLE_ID: tuple(self.ids[k]), KEY_COMPONENT: self.names[k]}, bundle.start + k + 1
        assert bundle.bounds is not None and bundle.ends is not None and bundle.skipped is not None  # batched ones
        a, b = bundle.bounds[k], bundle.bounds[k + 1]
        if bundle.tallies is not None:
            stats.add(bundle.tallies[k])
        else:
            stats.count(bundle.components[a:b])
        stats.drop_last += bundle.skipped[k]
        return {KEY_SAMPLE_ID: self.pointers[a:b], KEY_COMPONENT: self.names[a:b]}, bundle.ends[k]


class LoaderIterator:
    """Yields the readers' batches round robin (reader 0, 1, …, skipping finished ones) and
    tracks, per reader, how far the training loop has consumed."""

    def __init__(self, base: Any, plan: Plan, stats: LoaderStats, even: Even | None,
                 count_left: Callable[[Mapping[int, Entry]], RankCount]):
        self._base = base
        self._plan = plan
        self._stats, self._even, self._count_left = stats, even, count_left
        readers = [w for w, lanes in sorted(plan.lanes.items()) if lanes]
        self._trackers = {w: Tracker({lane: plan.entries[lane] for lane in plan.lanes[w]}) for w in readers}
        self._positions = dict.fromkeys(readers, 0)
        self._pending: dict[int, deque[Bundle]] = {w: deque() for w in readers}
        self._cursors: dict[int, _Cursor | None] = dict.fromkeys(readers)
        # resume the round robin after the readers that already gave their batch of this cycle
        served = [w for w in readers if all(plan.entries[lane][2] & SERVED for lane in plan.lanes[w])]
        first = next((k for k, w in enumerate(readers) if w not in served), 0)
        self._rotation = deque(readers[first:] + readers[:first])

    def __iter__(self) -> LoaderIterator:
        return self

    def __next__(self) -> Any:
        try:
            return self._next()
        except RuntimeError as error:  # torch's "worker exited unexpectedly" and the like
            if isinstance(error, WorkerDiedError) or (died := self.dead_worker()) is None:
                raise
            raise died from error

    def dead_worker(self) -> WorkerDiedError | None:
        """The error for a worker of this iteration that died, if one did."""
        return dead_worker(self._base, self._plan.lanes)

    def _next(self) -> Any:
        even = self._even
        if even is not None and even.left <= 0:
            self._hold_back()
            raise StopIteration
        while self._rotation:
            worker = self._rotation[0]
            unit = self._next_unit(worker)
            if unit is None:
                self._rotation.popleft()
                continue
            self._rotation.rotate(-1)
            self._stats.batches += 1
            if even is not None:
                even.given += 1
            return unit
        self._stats.end(self._plan.replicas, self.entries(), "end")
        raise StopIteration

    def _next_unit(self, worker: int) -> Any:
        cursor = self._cursors[worker]
        while cursor is None or cursor.next == cursor.count:
            if cursor is not None and cursor.bundle.last:
                return None
            bundle = self._pull(worker)
            tracker = self._trackers[worker]
            tracker.fold(self._positions[worker])
            tracker.extend(bundle.segments, bundle.events)
            self._stats.observe(event.state for event in bundle.events)
            cursor = self._cursors[worker] = _Cursor(bundle.land(), self._plan.pipeline, self._plan.batch_size)
            if not cursor.count:  # nothing to yield (drop_last dropped every batch): the loop passes over it
                self._stats.drop_last += bundle.stop - self._positions[worker]
                self._positions[worker] = bundle.stop
        unit, self._positions[worker] = cursor.take(self._stats)
        return unit

    def _pull(self, worker: int) -> Bundle:
        pending = self._pending[worker]
        while not pending:
            try:
                bundle = next(self._base)
            except StopIteration:
                raise RuntimeError(f"zephon: DataLoader worker {worker} stopped before its last batch") from None
            self._pending[bundle.worker].append(bundle)
        return pending.popleft()

    def _hold_back(self) -> None:
        """The equal-steps budget ran out: count and say (once) what this rank holds back."""
        even, stats = self._even, self._stats
        assert even is not None  # only an equal-steps budget runs out
        if even.held_back_units or stats.ended:
            return
        entries = self.entries()
        left = self._count_left(entries)
        even.held_back_units, even.held_back_samples = left.units, left.samples
        if left.units:
            log_once(f"zephon: rank {stats.rank}: even_batches holds back {left.units} batches ({left.samples} "
                     f"samples) so that every rank takes {even.target} steps; they stay unread in the checkpoint")
        stats.end(self._plan.replicas, entries, f"even_batches: {even.target} steps on every rank" if left.units
                  else "end")

    def entries(self) -> dict[int, Entry]:
        """The ledger of the rank's lanes after the last unit yielded, with both turn flags."""
        upcoming = self._rotation[0] if self._rotation else None
        out: dict[int, Entry] = {}
        for worker, tracker in self._trackers.items():
            served = SERVED if upcoming is not None and worker < upcoming else 0
            for lane, (state, consumed, flags) in tracker.entries_at(self._positions[worker]).items():
                out[lane] = (state, consumed, flags | served)
        return out
