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
with (``close``, or garbage collection), and at exit after their jobs in progress.
"""
from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import math
import threading
import time
import weakref
from typing import Any, Callable, Mapping, TypedDict, Union

import numpy as np

from zephon.io._cache import Piece, PieceKey, ShardCache
from zephon.io._shards import ShardReader
from zephon.io.retry import EXIT_WAIT_S

LOG = logging.getLogger("zephon")
QUEUED, RUNNING, DONE, CANCELLED = range(4)


class ReadaheadStats(TypedDict):
    """What a readahead did (``Readahead.stats()``; logged with ``extra={"readahead": stats}``)."""

    prefetch_bytes: int  # the bound on bytes loaded ahead and not yet read
    peak_bytes: int  # the most bytes held at once
    bytes_held: int  # bytes held now
    pieces: int  # pieces loaded ahead
    bytes: int  # their decoded bytes
    used: int  # pieces a read took from the readahead
    cancelled: int  # pieces a read got to first (it read them itself)
    stale: int  # pieces dropped unstarted: the stream was already past them
    too_large: int  # pieces larger than the whole bound, left to the read
    errors: int  # loads that failed (the read that needs the piece raises the error)


class Ticket:
    """A piece the readahead promised: queued, loading, loaded or cancelled."""

    __slots__ = ("pool", "state", "event", "value", "nbytes", "error", "reserved", "discarded", "where", "claimed",
                 "stale", "first", "done", "__weakref__")

    def __init__(self, pool: _Pool, reserved: int, where: tuple[ShardCache, int, PieceKey], first: int,
                 done: Callable[[], int]):
        self.pool, self.state, self.reserved, self.where = pool, QUEUED, reserved, where
        self.first, self.done = first, done  # its chunk's first pointer that needs it; how many the stream took
        self.stale = False  # dropped unstarted: the stream got there first
        self.event = threading.Event()
        self.value: Piece = None
        self.error: BaseException | None = None
        self.nbytes, self.discarded, self.claimed = 0, False, False

    def claim(self) -> bool:
        """A read wants the piece: True if it is (being) loaded, False if it was still queued (now cancelled)."""
        with self.pool.cond:
            if self.state == QUEUED:
                self.state = CANCELLED
                self.pool.counters["cancelled"] += 1
            self.claimed = self.state != CANCELLED and not self.discarded
            return self.claimed

    def result(self) -> tuple[Piece, int]:
        """Wait for the piece, hand it over and free its bytes (raises the load's error)."""
        self.event.wait()
        with self.pool.cond:
            self.pool.release(self)
            self.pool.counters["used"] += 1
        if self.error is not None:
            raise self.error
        value, self.value = self.value, None
        return value, self.nbytes

    def replaceable(self) -> bool:
        """Whether a new announcement may take this one's place (it was dropped as stale)."""
        with self.pool.cond:
            return self.stale

    def withdraw(self) -> bool:
        """Take the piece back unless a read claimed it (the stream is closed); True if withdrawn."""
        with self.pool.cond:
            if self.claimed:
                return False
        self.discard()
        return True

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


Load = tuple[Ticket, "ShardReader[Any]", int, int, int]  # a piece to load: (ticket, reader, shard, piece, estimate)
Job = Union[Load, Callable[[], None]]  # a piece to load, or a shard's plan (which queues its pieces)


class _Pool:
    """The threads, the queue and the byte budget (what the threads hold on to; see :class:`Readahead`)."""

    def __init__(self, budget: int, threads: int, columns: tuple[str, ...] | None):
        self.budget, self.threads, self.columns = budget, threads, columns
        self.cond = threading.Condition()
        self.queue: list[tuple[float, int, Job]] = []
        self.sequence = itertools.count()
        self.used = self.peak = self.running = 0
        self.scale = 1.0
        self.counters = {"pieces": 0, "bytes": 0, "used": 0, "cancelled": 0, "stale": 0, "too_large": 0, "errors": 0}
        self.workers: list[threading.Thread] = []
        self.closed = False
        self.tickets: weakref.WeakSet[Ticket] = weakref.WeakSet()

    def release(self, ticket: Ticket) -> None:
        if ticket.reserved:
            self.used -= ticket.reserved
            ticket.reserved = 0
            self.cond.notify_all()

    def push(self, priority: float, job: Job) -> None:
        with self.cond:
            if self.closed:
                if isinstance(job, tuple):  # announced while closing: take it back
                    job[0].state, job[0].stale = CANCELLED, True
                return
            heapq.heappush(self.queue, (priority, next(self.sequence), job))
            if len(self.workers) < self.threads:
                worker = threading.Thread(target=self.run, name="zephon-readahead", daemon=True)
                self.workers.append(worker)
                worker.start()
            self.cond.notify()

    def _next(self) -> Job | None:
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
                    if ticket.done() > ticket.first:  # the stream is past it: it reads (or read) it itself
                        ticket.state, ticket.stale = CANCELLED, True
                        self.counters["stale"] += 1
                        heapq.heappop(self.queue)
                        continue
                    need = int(ticket.reserved * self.scale)
                    if self.used and self.used + need > self.budget:
                        self.cond.wait()
                        continue
                    ticket.state, ticket.reserved = RUNNING, need
                    self.running += 1
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

    def _load(self, ticket: Ticket, reader: ShardReader[Any], k: int, piece: int, estimate: int) -> None:
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
            self.running -= 1
            if ticket.discarded:
                self.release(ticket)
                ticket.value = None
            ticket.event.set()
            self.cond.notify_all()

    def plan(self, reader: ShardReader[Any], k: int, positions: np.ndarray, offsets: np.ndarray, priority: float,
             done: Callable[[], int]) -> None:
        """Announce and queue the pieces of one ``(dataset, shard)`` group of a chunk.

        ``positions``: where in the chunk the group's ``offsets`` are; ``done()``: how many of the
        chunk's pointers the stream took (pieces first needed before that are left to the stream).
        """
        keep = positions >= done()
        positions, offsets = positions[keep], offsets[keep]
        span = max(1, int(positions[-1]) + 1) if len(positions) else 1
        for piece, first in reader.plan(k, offsets) if len(offsets) else ():
            estimate = reader.estimate(k, piece, self.columns)
            if not estimate:
                continue  # nothing to load (a memory-mapped file)
            if estimate * self.scale > self.budget:
                with self.cond:
                    self.counters["too_large"] += 1
                continue
            key = reader.key(piece, self.columns)
            ticket = Ticket(self, estimate, (reader.cache, k, key), int(positions[first]), done)
            if reader.cache.expect(k, key, ticket):
                with self.cond:
                    self.tickets.add(ticket)
                self.push(priority + int(positions[first]) / span, (ticket, reader, k, piece, estimate))

    def stats(self) -> ReadaheadStats:
        with self.cond:
            counts = self.counters
            return ReadaheadStats(prefetch_bytes=self.budget, peak_bytes=self.peak, bytes_held=self.used,
                                  pieces=counts["pieces"], bytes=counts["bytes"], used=counts["used"],
                                  cancelled=counts["cancelled"], stale=counts["stale"],
                                  too_large=counts["too_large"], errors=counts["errors"])

    def close(self, wait_s: float = 0.0) -> None:
        """Stop; withdraw the pieces nobody took (loaded ones free their bytes, queued ones are cancelled).

        ``wait_s``: first let the threads finish the jobs in progress, for up to this long (each
        load is bounded by its retry policy; ``math.inf``: until they end)."""
        with self.cond:
            self.closed = True
            self.queue.clear()
            self.cond.notify_all()
        deadline = time.monotonic() + wait_s
        for worker in self.workers if wait_s > 0 else ():
            if worker is not threading.current_thread():
                worker.join(max(0.0, deadline - time.monotonic()) if math.isfinite(wait_s) else None)
        with self.cond:
            tickets = list(self.tickets)
        for ticket in tickets:
            cache, shard, key = ticket.where
            cache.withdraw(shard, key, ticket)


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
        self._readers: dict[int, ShardReader[Any]] = {
            i: d.reader for i, d in datasets_by_id.items() if getattr(d, "reader", None) is not None}
        self._pool = _Pool(int(prefetch_bytes), int(threads), columns)
        self._finalizer = weakref.finalize(self, _finish, self._pool, 0.0)
        _POOLS.add(self._pool)

    def feed(self, pointers: np.ndarray, priority: float, done: Callable[[], int]) -> None:
        """Read ahead the pieces of one lane's chunk (``pointers``, in read order).

        Lower ``priority`` goes first (a lane's chunk number); ``done()`` says how many of these
        pointers the stream has taken so far (0 until the chunk starts).
        """
        if not len(pointers):
            return
        keys = pointers[:, 0] * (1 << 40) + pointers[:, 1]
        order = np.argsort(keys, kind="stable")
        cuts = np.flatnonzero(np.diff(keys[order])) + 1
        groups = sorted(np.split(order, cuts), key=lambda positions: int(positions[0]))  # ascending positions each
        pool, span = self._pool, len(pointers)
        for positions in groups:
            reader = self._readers.get(int(pointers[positions[0], 0]))
            if reader is None:
                continue

            def plan(reader: ShardReader[Any] = reader, k: int = int(pointers[positions[0], 1]),
                     at: np.ndarray = positions) -> None:
                try:
                    pool.plan(reader, k, at, pointers[at, 2], priority, done)
                except Exception as error:  # noqa: BLE001 - the read itself meets (and raises) it
                    LOG.debug("zephon: readahead could not plan shard %s: %s", k, error)
            pool.push(priority + positions[0] / span - 1e-9, plan)

    def stats(self) -> ReadaheadStats:
        """Bound, peak and current bytes, pieces loaded, read, cancelled (read first), stale, too large, failed."""
        return self._pool.stats()

    def close(self, wait_s: float = math.inf) -> None:
        """Stop the threads (after the jobs in progress, waiting up to ``wait_s``) and log what was read ahead."""
        if self._finalizer.detach() is not None:
            _finish(self._pool, wait_s)


def _finish(pool: _Pool, wait_s: float) -> None:
    """Close the pool and log its figures on the ``zephon`` logger (``extra={"readahead": stats}``)."""
    pool.close(wait_s)
    stats = pool.stats()
    LOG.info("zephon: readahead: %d pieces (%d bytes) loaded ahead, %d read from there, %d read first, %d left as "
             "stale; peak %d of %d bytes", stats["pieces"], stats["bytes"], stats["used"], stats["cancelled"],
             stats["stale"], stats["peak_bytes"], stats["prefetch_bytes"], extra={"readahead": stats})


_POOLS: weakref.WeakSet[_Pool] = weakref.WeakSet()  # a pool stays while its threads run, its readahead gone or not


def _close_at_exit() -> None:
    """Stop every readahead's threads at exit once their jobs in progress end, within
    :data:`~zephon.io.retry.EXIT_WAIT_S` in all (see :func:`zephon.io.retry._settle_at_exit`);
    threads still running after that are counted in a warning."""
    deadline = time.monotonic() + EXIT_WAIT_S
    pools = list(_POOLS)
    for pool in pools:
        pool.close(max(0.0, deadline - time.monotonic()))
    running = sum(worker.is_alive() for pool in pools for worker in pool.workers)
    if running:
        LOG.warning("zephon: %d readahead threads still running at exit after %.0f s", running, EXIT_WAIT_S)


atexit.register(_close_at_exit)
