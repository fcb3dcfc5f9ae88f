"""The fetch cache: decoded pieces of recently read shards, bounded in shards and in bytes.

Policy
------
Entries are grouped by shard. A shard holds its decoded pieces: Parquet row groups and Arrow
record batches keyed by ``(piece, columns)``, spans of JSONL lines (or a whole decompressed
file). Shards are evicted least recently used first, whole, as soon as more than
``max_shards`` are held or, with ``max_bytes`` set, the pieces exceed ``max_bytes`` bytes
(then, if one shard alone is over the limit, its own oldest pieces go, never the newest).

Sizing for the shuffle level (see :func:`zephon.io.block_span`):

* sequential reading or ``shuffle_within_shard`` only: a chunk reads one shard (two at a shard
  boundary), so ``max_shards=1`` (the default) decodes every row group once per pass;
* block shuffle: consecutive chunks draw from every shard a block spans, so hold
  ``block_span(counts, block_size)`` shards.

Memory is then at most ``max_shards`` x (the largest decoded shard), or ``max_bytes``.
After a ``fork`` the child starts with an empty cache.

A reader of several lanes reads as many shards at once: :meth:`ShardCache.follow` makes the
bound ``max_shards`` per lane while the reader runs (``zephon.torch.DataLoader`` does it in each
reader, with its ``cache_bytes`` as a further byte bound), so no lane evicts what another lane
reads next; with several readers in one process the largest lane count and the smallest byte
bound hold, and each reader's bounds go when it ends.

Readahead (:mod:`zephon.io._readahead`) announces the pieces it will load with
:meth:`ShardCache.expect`; a read that finds its piece announced takes it from there (waiting
for it if it is still loading), so a prefetched piece is read exactly once and leaves the
readahead's memory bound as it enters this cache. Likewise a read that finds another read
loading its piece waits for that load rather than decoding the piece a second time.
"""
from __future__ import annotations

import itertools
import numbers
import os
import threading
import weakref
from typing import Any, Callable, Protocol, TypedDict

_FOLLOWERS = itertools.count()  # tokens of ShardCache.follow
PieceKey = tuple[int, "tuple[str, ...] | None"]  # (piece, columns) of a decoded piece (see ShardReader.key)
Piece = Any  # a decoded piece, as its format holds it: an Arrow table, or a span of JSONL lines


def _count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 1


class Ticket(Protocol):
    """A piece the readahead announced (:class:`zephon.io._readahead.Ticket`): what the cache asks of it."""

    def claim(self) -> bool: ...  # a read wants it: True if it is (being) loaded, False if now cancelled

    def result(self) -> tuple[Piece, int]: ...  # wait for it: (piece, bytes); raises the load's error

    def replaceable(self) -> bool: ...  # a new announcement may take its place

    def withdraw(self) -> bool: ...  # taken back unless claimed; True if withdrawn

    def discard(self) -> None: ...  # nobody will take it: free it


class CacheInfo(TypedDict):
    """The figures of a fetch cache (``Dataset.cache_info()``): its bounds, what it holds, what it did."""

    max_shards: int  # the bound on shards held
    max_bytes: int | None  # the bound on decoded bytes held (None: none)
    shards: int  # shards held now
    bytes: int  # decoded bytes held now
    peak_bytes: int  # the most decoded bytes held at once
    hits: int  # pieces found in the cache (or waited for while another read loaded them)
    misses: int  # pieces not found: decoded by the read (or taken from the readahead)
    evictions: int  # pieces dropped to stay within the bounds
    prefetched: int  # pieces the readahead had loaded before the read asked


class _Shard:
    __slots__ = ("pieces", "nbytes")

    def __init__(self) -> None:
        self.pieces: dict[PieceKey, tuple[Piece, int]] = {}  # insertion order = recency
        self.nbytes = 0


class _Reading:
    """The announcement of a piece a read is loading (see :meth:`ShardCache.get`): other reads of
    it wait for the piece, for the load's error, or for None when the load was interrupted or the
    cache let it go."""

    __slots__ = ("_done", "_piece", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._piece: Piece = None
        self._error: Exception | None = None

    def replaceable(self) -> bool:
        return False

    def finish(self, piece: Piece) -> None:
        self._piece = piece
        self._done.set()

    def discard(self, error: Exception | None = None) -> None:
        self._error = error
        self._done.set()

    def wait(self) -> Piece:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._piece


_CACHES: weakref.WeakSet[ShardCache] = weakref.WeakSet()


def _reset_after_fork() -> None:
    """A forked child starts every cache empty, with a fresh lock (some parent thread may have held it)."""
    for cache in list(_CACHES):
        cache._lock = threading.RLock()
        cache._shards.clear()
        cache._ahead.clear()
        cache._reset_counters()


os.register_at_fork(after_in_child=_reset_after_fork)


class ShardCache:
    """LRU of decoded shard pieces; ``ShardCache(max_shards=1, max_bytes=None)``."""

    _max_shards: int  # the bounds in force: per lane x lanes, and the smaller byte bound
    _max_bytes: int | None
    _per_lane: int  # resize()'s bounds
    _own_bytes: int | None
    _readers: dict[int, tuple[int, int | None]]  # follow()'s: reader -> (lanes, max_bytes)
    _pid: int  # the process the pieces belong to (a forked child drops them)
    _bytes: int  # the counters of CacheInfo
    _peak: int
    _hits: int
    _misses: int
    _evictions: int
    _prefetched: int

    def __init__(self, max_shards: int = 1, max_bytes: int | None = None):
        self._setup(max_shards, max_bytes)

    def _setup(self, max_shards: int, max_bytes: int | None) -> None:
        self._lock = threading.RLock()
        _CACHES.add(self)
        self._shards: dict[int, _Shard] = {}  # insertion order = recency
        self._ahead: dict[tuple[int, PieceKey], Ticket | _Reading] = {}  # (shard, key) -> announcement
        self._max_shards, self._max_bytes, self._readers = 1, None, {}
        self._reset_counters()
        self.resize(max_shards, max_bytes)

    # -- configuration ------------------------------------------------------------------

    def resize(self, max_shards: int, max_bytes: int | None) -> None:
        """Set both bounds (``max_bytes=None``: no byte bound) and evict down to them."""
        if not _count(max_shards):
            raise ValueError(f"max_shards={max_shards!r} must be an int >= 1; pass e.g. block_span(counts, b)")
        if max_bytes is not None and not _count(max_bytes):
            raise ValueError(f"max_bytes={max_bytes!r} must be an int >= 1 or None (no byte bound)")
        with self._lock:
            self._per_lane = int(max_shards)
            self._own_bytes = None if max_bytes is None else int(max_bytes)
            self._apply()

    def follow(self, lanes: int, max_bytes: int | None) -> Callable[[], None]:
        """While a reader of ``lanes`` lanes runs, hold ``max_shards`` shards for each of them (they
        read that many shards at once), within ``max_bytes`` decoded bytes too (``None``: only the
        cache's own bound). Returns the call that ends it (idempotent)."""
        if not _count(lanes):
            raise ValueError(f"lanes={lanes!r} must be an int >= 1")
        if max_bytes is not None and not _count(max_bytes):
            raise ValueError(f"max_bytes={max_bytes!r} must be an int >= 1 or None (no byte bound)")
        token = next(_FOLLOWERS)
        with self._lock:
            self._readers[token] = (int(lanes), None if max_bytes is None else int(max_bytes))
            self._apply()

        def release() -> None:
            with self._lock:
                if self._readers.pop(token, None) is not None:
                    self._apply()
        return release

    def _apply(self) -> None:
        self._max_shards = self._per_lane * max((lanes for lanes, _ in self._readers.values()), default=1)
        bounds = [b for b in (self._own_bytes, *(b for _, b in self._readers.values())) if b is not None]
        self._max_bytes = min(bounds) if bounds else None
        self._evict(None)

    def clear(self) -> None:
        """Drop every shard and reset the counters."""
        with self._lock:
            self._shards.clear()
            self._drop_tickets()
            self._reset_counters()

    def info(self) -> CacheInfo:
        """Bounds, current and peak size, hits and misses (pieces decoded)."""
        with self._lock:
            return CacheInfo(max_shards=self._max_shards, max_bytes=self._max_bytes, shards=len(self._shards),
                             bytes=self._bytes, peak_bytes=self._peak, hits=self._hits, misses=self._misses,
                             evictions=self._evictions, prefetched=self._prefetched)

    # -- use ----------------------------------------------------------------------------

    def get(self, shard: int, key: PieceKey) -> Piece:
        """A cached piece (or one the readahead or another read is loading, waited for) or
        ``None``; counts a hit or a miss.

        On ``None`` the caller loads the piece and :meth:`put` s it, or says :meth:`failed`;
        until then an announcement stays in place, so that neither the readahead nor another
        read loads the piece a second time.
        """
        while True:
            with self._lock:
                entry = self._touch(shard)
                found = entry.pieces.pop(key, None)
                if found is not None:
                    entry.pieces[key] = found
                    self._hits += 1
                    return found[0]
                ticket = self._ahead.get((shard, key))
                if not isinstance(ticket, _Reading):
                    self._misses += 1
                    self._ahead[(shard, key)] = _Reading()  # the caller reads it (from the readahead if claimed)
                    if ticket is None or not ticket.claim():
                        return None
                    break
            piece = ticket.wait()  # another read's load: found once it ends, else looked up anew
            if piece is not None:
                with self._lock:
                    self._hits += 1
                return piece
        return self._collect(shard, key, ticket)

    def _collect(self, shard: int, key: PieceKey, ticket: Ticket) -> Piece:
        """The piece of a readahead ticket :meth:`get` claimed (and so took out of ``_ahead``:
        nothing else discards it or takes its piece), cached."""
        try:
            value, nbytes = ticket.result()  # raises the readahead's error, naming the shard
        except BaseException as error:
            self.failed(shard, key, error)
            raise
        with self._lock:
            self._prefetched += 1
            self.put(shard, key, value, nbytes)
        return value

    def failed(self, shard: int, key: PieceKey, error: BaseException | None = None) -> None:
        """The caller's load of a piece :meth:`get` left to it failed with ``error``: the reads
        waiting for it raise that error too (the retry policy has run its course), or look the
        piece up anew (one of them loads it) when the load was interrupted (not an ``Exception``)."""
        with self._lock:
            ticket = self._ahead.get((shard, key))
            if isinstance(ticket, _Reading):
                del self._ahead[(shard, key)]
                ticket.discard(error if isinstance(error, Exception) else None)

    def holds(self, shard: int, key: PieceKey) -> bool:
        """Whether the piece is cached now (neither counted nor touched)."""
        with self._lock:
            entry = self._shards.get(shard)
            return entry is not None and key in entry.pieces

    def expect(self, shard: int, key: PieceKey, ticket: Ticket) -> bool:
        """Announce a piece the readahead will load; False (nothing announced) if it is cached or announced."""
        with self._lock:
            if self._pid != os.getpid():
                self._touch(shard)
            entry = self._shards.get(shard)
            if entry is not None and key in entry.pieces:
                return False
            found = self._ahead.get((shard, key))
            if found is not None and not found.replaceable():
                return False
            self._ahead[(shard, key)] = ticket
            return True

    def withdraw(self, shard: int, key: PieceKey, ticket: Ticket) -> None:
        """The readahead takes back an announcement nobody claimed (its stream is closed)."""
        with self._lock:
            if self._ahead.get((shard, key)) is ticket and ticket.withdraw():
                del self._ahead[(shard, key)]

    def put(self, shard: int, key: PieceKey, value: Piece, nbytes: int) -> None:
        """Store a piece of ``nbytes`` bytes, then evict down to the bounds."""
        with self._lock:
            entry = self._touch(shard)
            ticket = self._ahead.pop((shard, key), None)
            if isinstance(ticket, _Reading):
                ticket.finish(value)
            elif ticket is not None:
                ticket.discard()  # read without it: never keep a second copy
            old = entry.pieces.pop(key, None)
            if old is not None:
                entry.nbytes -= old[1]
                self._bytes -= old[1]
            entry.pieces[key] = (value, nbytes)
            entry.nbytes += nbytes
            self._bytes += nbytes
            self._peak = max(self._peak, self._bytes)
            self._evict(key)

    def __getstate__(self) -> dict[str, Any]:  # pickles and deep copies start empty, with no reader following
        return {"max_shards": self._per_lane, "max_bytes": self._own_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["max_shards"], state["max_bytes"])

    # -- internals ----------------------------------------------------------------------

    def _reset_counters(self) -> None:
        self._pid = os.getpid()
        self._bytes = self._peak = self._hits = self._misses = self._evictions = self._prefetched = 0

    def _touch(self, shard: int) -> _Shard:
        if self._pid != os.getpid():  # forked: never share buffers or readahead with the parent
            self._shards.clear()
            self._ahead.clear()
            self._reset_counters()
        entry = self._shards.pop(shard, None)
        if entry is None:
            entry = _Shard()
        self._shards[shard] = entry
        self._evict(None)
        return entry

    def _evict(self, keep: PieceKey | None) -> None:
        while len(self._shards) > self._max_shards or (
                self._max_bytes is not None and self._bytes > self._max_bytes and len(self._shards) > 1):
            self._drop(next(iter(self._shards)))
        if self._max_bytes is None or self._bytes <= self._max_bytes or not self._shards:
            return
        entry = self._shards[next(reversed(self._shards))]
        for key in [k for k, (_, n) in entry.pieces.items() if n and k != keep]:
            if self._bytes <= self._max_bytes:
                break
            _, nbytes = entry.pieces.pop(key)
            entry.nbytes -= nbytes
            self._bytes -= nbytes
            self._evictions += 1

    def _drop_tickets(self) -> None:
        for ticket in self._ahead.values():
            ticket.discard()
        self._ahead.clear()

    def _drop(self, shard: int) -> None:
        entry = self._shards.pop(shard)
        self._bytes -= entry.nbytes
        self._evictions += len(entry.pieces)
