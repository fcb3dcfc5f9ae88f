"""Readahead: load the pieces a reader's lanes will read next, in a bounded background pool.

The stream knows which pointers come next: each lane's chunk in flight and its next chunk.
:meth:`Readahead.feed` takes those pointers; background threads turn each ``(dataset,
shard)`` group into the pieces it needs (row groups, record batches, spans of JSONL lines) and
load them, most urgent first (a lane's earlier chunk first, then by position in the chunk, so
that lanes read round robin are served alike). A loaded piece waits in its dataset's fetch
cache (:meth:`ShardCache.expect`) for the read that needs it.

**Nothing is loaded that will not be read**: only pointers of chunks the lanes will read are
fed, a piece is announced once, and a read that gets to a piece before the readahead started
it cancels it and reads it itself. **Memory stays under** ``prefetch_bytes``: a piece starts
only when the bytes of the pieces loading or loaded but not yet read, plus its own estimate
(scaled by the largest decoded/estimated ratio seen so far), fit; a piece larger than the whole
bound is left to the read. ``stats()`` reports the peak. Threads stop when the stream is done
with (``close``, or garbage collection).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import weakref
from typing import Any, Mapping

import numpy as np

LOG = logging.getLogger("zephon")
QUEUED, RUNNING, DONE, CANCELLED = range(4)


class Ticket:
    """A piece the readahead promised: queued, loading, loaded or cancelled."""

    __slots__ = ("pool", "state", "event", "value", "nbytes", "error", "reserved", "discarded")

    def __init__(self, pool: _Pool, reserved: int):
        self.pool, self.state, self.reserved = pool, QUEUED, reserved
        self.event = threading.Event()
        self.value: Any = None
        self.nbytes, self.error, self.discarded = 0, None, False

    def claim(self) -> bool:
        """A read wants the piece: True if it is (being) loaded, False if it was still queued (now cancelled)."""
        with self.pool.cond:
            if self.state == QUEUED:
                self.state = CANCELLED
                self.pool.counters["cancelled"] += 1
            return self.state != CANCELLED

    def result(self) -> tuple[Any, int]:
        """Wait for the piece, hand it over and free its bytes (raises the load's error)."""
        self.event.wait()
        with self.pool.cond:
            self.pool.release(self)
            self.pool.counters["used"] += 1
        if self.error is not None:
            raise self.error
        value, self.value = self.value, None
        return value, self.nbytes

    def discard(self) -> None:
        """Nobody will take the piece (read without it, or its cache was cleared): free it."""
        with self.pool.cond:
            if self.state == QUEUED:
                self.state = CANCELLED
            elif self.state == DONE:
                self.pool.release(self)
            else:
                self.discarded = True
            self.value = None


class _Pool:
    """The threads, the queue and the byte budget (what the threads hold on to; see :class:`Readahead`)."""

    def __init__(self, budget: int, threads: int, columns: tuple[str, ...] | None):
        self.budget, self.threads, self.columns = budget, threads, columns
        self.cond = threading.Condition()
        self.queue: list[tuple[float, int, Any]] = []
        self.sequence = itertools.count()
        self.used = self.peak = 0
        self.scale = 1.0
        self.counters = {"pieces": 0, "bytes": 0, "used": 0, "cancelled": 0, "too_large": 0, "errors": 0}
        self.workers: list[threading.Thread] = []
        self.closed = False

    def release(self, ticket: Ticket) -> None:
        if ticket.reserved:
            self.used -= ticket.reserved
            ticket.reserved = 0
            self.cond.notify_all()

    def push(self, priority: float, job: Any) -> None:
        with self.cond:
            if self.closed:
                return
            heapq.heappush(self.queue, (priority, next(self.sequence), job))
            if len(self.workers) < self.threads:
                worker = threading.Thread(target=self.run, name="zephon-readahead", daemon=True)
                self.workers.append(worker)
                worker.start()
            self.cond.notify()

    def _next(self) -> Any:
        """The most urgent job that fits the budget (None when closed); marks a piece running."""
        with self.cond:
            while not self.closed:
                while self.queue and isinstance(self.queue[0][2], tuple) and self.queue[0][2][0].state != QUEUED:
                    heapq.heappop(self.queue)  # cancelled while queued
                if not self.queue:
                    self.cond.wait()
                    continue
                job = self.queue[0][2]
                if isinstance(job, tuple):
                    ticket = job[0]
                    need = int(ticket.reserved * self.scale)
                    if self.used and self.used + need > self.budget:
                        self.cond.wait()
                        continue
                    ticket.state, ticket.reserved = RUNNING, need
                    self.used += need
                    self.peak = max(self.peak, self.used)
                heapq.heappop(self.queue)
                return job
            return None

    def run(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            if isinstance(job, tuple):
                self._load(*job)
            else:
                job()

    def _load(self, ticket: Ticket, reader: Any, k: int, piece: int, estimate: int) -> None:
        try:
            value, nbytes = reader.load(k, piece, self.columns)
        except BaseException as error:  # noqa: BLE001 - handed to the read that needs the piece
            value, nbytes = None, 0
            ticket.error = error
        with self.cond:
            if ticket.error is not None:
                self.counters["errors"] += 1
            else:
                self.counters["pieces"] += 1
                self.counters["bytes"] += nbytes
                if estimate:
                    self.scale = max(self.scale, nbytes / estimate)
            self.used += nbytes - ticket.reserved
            ticket.reserved = nbytes
            self.peak = max(self.peak, self.used)
            ticket.value, ticket.nbytes, ticket.state = value, nbytes, DONE
            if ticket.discarded:
                self.release(ticket)
                ticket.value = None
            ticket.event.set()
            self.cond.notify_all()

    def plan(self, reader: Any, k: int, offsets: np.ndarray, priorities: np.ndarray) -> None:
        """Announce and queue the pieces of one ``(dataset, shard)`` group (``priorities``: per offset)."""
        for piece, first in reader.plan(k, offsets):
            estimate = reader.estimate(k, piece, self.columns)
            if not estimate:
                continue  # nothing to load (a memory-mapped file)
            if estimate * self.scale > self.budget:
                with self.cond:
                    self.counters["too_large"] += 1
                continue
            ticket = Ticket(self, estimate)
            if reader.cache.expect(k, reader.key(piece, self.columns), ticket):
                self.push(float(priorities[first]), (ticket, reader, k, piece, estimate))

    def close(self) -> None:
        with self.cond:
            self.closed = True
            for _, _, job in self.queue:
                if isinstance(job, tuple):
                    job[0].state = CANCELLED
            self.queue.clear()
            self.cond.notify_all()


class Readahead:
    """Background loading of the pieces that fed pointers need, under a byte bound.

    Parameters
    ----------
    datasets_by_id : mapping of int to Dataset
        The datasets pointers name; only path datasets (those with a ``reader``) are read ahead.
    prefetch_bytes : int
        The bound on bytes loaded ahead and not yet read.
    threads : int
        Background threads (each loads one piece at a time).
    columns : tuple of str or None
        The columns reads will ask for.
    """

    def __init__(self, datasets_by_id: Mapping[int, Any], prefetch_bytes: int, threads: int,
                 columns: tuple[str, ...] | None):
        self._readers = {i: d.reader for i, d in datasets_by_id.items() if getattr(d, "reader", None) is not None}
        self._pool = _Pool(int(prefetch_bytes), int(threads), columns)
        self._finalizer = weakref.finalize(self, _Pool.close, self._pool)

    def feed(self, pointers: np.ndarray, priority: float) -> None:
        """Read ahead the pieces of ``pointers`` (a lane's chunk, in read order); lower ``priority`` goes first."""
        if not len(pointers):
            return
        keys = pointers[:, 0] * (1 << 40) + pointers[:, 1]
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        for group in np.argsort(first, kind="stable").tolist():
            dataset_id, shard = int(pointers[first[group], 0]), int(pointers[first[group], 1])
            reader = self._readers.get(dataset_id)
            if reader is None:
                continue
            positions = np.flatnonzero(inverse == group)
            pool, span = self._pool, len(pointers)

            def plan(reader: Any = reader, k: int = shard, positions: np.ndarray = positions) -> None:
                try:
                    pool.plan(reader, k, pointers[positions, 2], priority + positions / span)
                except Exception as error:  # noqa: BLE001 - the read itself meets (and raises) it
                    LOG.debug("zephon: readahead could not plan shard %s: %s", k, error)
            pool.push(priority + positions[0] / span - 1e-9, plan)

    def stats(self) -> dict[str, int]:
        """Bound, peak and current bytes, pieces loaded, read, cancelled (read first), too large, failed."""
        pool = self._pool
        with pool.cond:
            return {"prefetch_bytes": pool.budget, "peak_bytes": pool.peak, "bytes_held": pool.used,
                    **pool.counters}

    def close(self) -> None:
        """Stop the threads and log what was read ahead (on the ``zephon`` logger)."""
        if self._finalizer.alive:
            stats = self.stats()
            LOG.info("zephon: readahead: %d pieces (%d bytes) loaded ahead, %d read from there, %d read first; "
                     "peak %d of %d bytes", stats["pieces"], stats["bytes"], stats["used"], stats["cancelled"],
                     stats["peak_bytes"], stats["prefetch_bytes"], extra={"readahead": stats})
            self._finalizer()
