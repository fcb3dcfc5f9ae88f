"""The reader protocol: how a file format plugs into catalogs, reads and readahead.

A format is a :class:`Format` registered with :func:`register`: its name, file suffixes, a
``scan`` that the catalog runs once per file (rows, content digest, columns and an optional
per-file int64 *index*, e.g. JSONL line offsets or Arrow record-batch extents), and a
:class:`ShardReader` subclass.

A shard is read in *pieces*: Parquet row groups, Arrow record batches, spans of JSONL lines.
:class:`ShardReader` does everything around them, the same for every format: the shard's
identity check when it is first opened (size and mtime against the catalog), the retry
policy (:mod:`zephon.io.retry`), the fetch cache, and which pieces some offsets need
(:meth:`ShardReader.plan`, what the readahead prefetches). A subclass says how to open a
shard (``_open``), where its pieces end (``_ends``), how big one is (``_estimate``) and how to
load one (``_load``). A columnar format's pieces are Arrow tables, which :meth:`ShardReader.gather`
hands out whole so that a caller gathers the rows of many shards at once; any other format
says how to take records from a piece (``_take``).
"""
from __future__ import annotations

import functools
import os
import threading
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from zephon.io._cache import Piece, PieceKey, ShardCache
from zephon.io._fs import Entry, Location
from zephon.io._shared import SharedPieces, piece_name
from zephon.io._take import chunk_of, no_columns, take_rows
from zephon.io.retry import RetryPolicy, ShardChangedError, StorageError, in_background

T = TypeVar("T")
Meta = TypeVar("Meta")  # what a format keeps of an open shard (its footer, its line index, ...)
OPEN_SHARDS = 64  # shards whose metadata a reader keeps (LRU)
SECOND = 10**9  # ns
HANDLES_PER_FILE = 8  # open handles per file on filesystems that need one per concurrent read


class Handles:
    """Open handles of one file. pyarrow's own filesystems (local, S3, GCS, Azure, HDFS) serve
    positioned reads of one handle from many threads; a Python-implemented one (fsspec, a
    ``PyFileSystem``) does not, so it gets a handle per concurrent read, at most
    :data:`HANDLES_PER_FILE`, reused."""

    def __init__(self, location: Location, info: pafs.FileInfo):
        self._location, self._info = location, info
        self._shared = not location.fs.type_name.startswith("py")
        self._handle: pa.NativeFile | None = None  # the shared one
        self._idle: list[pa.NativeFile] = []
        self._opened = 0
        self._free = threading.Condition()

    @contextmanager
    def use(self) -> Iterator[pa.NativeFile]:
        """A handle for the duration of one read (a handle whose read failed is dropped)."""
        if self._shared:
            yield self._shared_handle()
            return
        file = self._acquire()
        try:
            yield file
        except BaseException:
            self._release(None)
            raise
        self._release(file)

    def _shared_handle(self) -> pa.NativeFile:
        with self._free:  # the first users wait for one open
            if self._handle is None:
                self._handle = self._location.open(self._info)
            return self._handle

    def _acquire(self) -> pa.NativeFile:
        with self._free:
            while not self._idle and self._opened >= HANDLES_PER_FILE:
                self._free.wait()
            if self._idle:
                return self._idle.pop()
            self._opened += 1
        try:
            return self._location.open(self._info)
        except BaseException:
            self._release(None)
            raise

    def _release(self, file: pa.NativeFile | None) -> None:
        with self._free:
            if file is None:
                self._opened -= 1
            else:
                self._idle.append(file)
            self._free.notify()


@dataclass(frozen=True, slots=True)
class Scan:
    """What the catalog keeps of one file."""

    rows: int
    digest: str  # content hash, hex
    columns: tuple[tuple[str, str], ...] | None  # (name, type) per column; None: no records to tell
    index: np.ndarray | None = None  # int64, format-specific (see each format)


@dataclass(frozen=True, eq=False)
class Shards:
    """What a reader needs of a dataset: its name, location, files and their catalog entries."""

    name: str
    location: Location
    files: tuple[str, ...]
    sizes: np.ndarray
    mtimes: np.ndarray
    rows: np.ndarray
    index: np.ndarray | None  # every file's index, concatenated
    index_starts: np.ndarray | None  # where each file's index starts in ``index`` (n + 1 entries)
    policy: RetryPolicy

    def index_of(self, k: int) -> np.ndarray:
        """File ``k``'s index (only for a format that keeps one: ``ValueError`` otherwise)."""
        if self.index is None or self.index_starts is None:
            raise ValueError(f"{self.location.uri_of(self.files[k])}: the catalog keeps no index of this format")
        return np.asarray(self.index[self.index_starts[k]:self.index_starts[k + 1]])


class Format:
    """A file format: ``name``, ``suffixes``, ``scan`` and the ``reader`` class."""

    name = ""
    suffixes: tuple[str, ...] = ()
    label = ""  # e.g. "*.parquet", for messages
    detect = True  # found by from_path(fmt=None); False: only when named (fmt=, or its own constructor)

    def scan(self, location: Location, entry: Entry) -> Scan:
        raise NotImplementedError

    def reader(self, shards: Shards, cache: ShardCache) -> ShardReader[Any]:
        raise NotImplementedError

    def matches(self, file: str) -> bool:
        return file.endswith(self.suffixes) and not file.startswith(".")


Rows = Any  # rows taken from a piece: an Arrow table (a columnar format) or a list of records


class UnevenRecordsError(ValueError):
    """Records that one Arrow table cannot hold as they are: their fields differ (a table fills
    missing ones with nulls), or a column's values differ in type (a table makes ints floats).
    A reader that batches from tables reads them as records instead."""


_AS_IS = (pa.types.is_int64, pa.types.is_boolean, pa.types.is_string, pa.types.is_null)  # Python values kept exactly


def _kept(kind: pa.DataType) -> bool:
    """Whether a column of ``kind`` inferred from Python values gives those very values back
    (ints, bools, strings, ``None`` and lists of them; not floats, which ints among them turn
    into, nor structs, which take every record's fields)."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _kept(kind.value_type)
    return any(test(kind) for test in _AS_IS)


def records_table(where: str, records: list[Any], exact: bool = False) -> pa.Table:
    """``records`` (dicts) as one Arrow table: a column per field any record has, in order of
    first appearance, null where a record lacks it. ``exact``: raise
    :class:`UnevenRecordsError` unless the table's rows are the records themselves (the same
    fields in every record, each column's values of one type): what a batch made from the
    table's columns needs to equal the records' batch."""
    fields = records[0].keys() if records else {}.keys()
    even = all(record.keys() == fields for record in records)
    if exact and not even:
        raise UnevenRecordsError(f"{where}: these records have different fields")
    if even and not fields:  # Arrow makes no rows of empty dicts
        return no_columns(len(records))
    try:
        if even:
            table = pa.Table.from_pylist(records)
        else:  # from_pylist takes its columns from the first record alone
            names = dict.fromkeys(name for record in records for name in record)
            table = pa.table({name: [record.get(name) for record in records] for name in names})
    except (pa.ArrowException, TypeError, OverflowError) as error:
        kind = UnevenRecordsError if exact else ValueError
        raise kind(f"{where}: these records do not form one Arrow table ({error})") from error
    if exact:
        for name, column in zip(table.column_names, table.columns):
            if not _kept(column.type) and not (pa.types.is_float64(column.type)
                                               and not any(type(r[name]) is int for r in records)):
                raise UnevenRecordsError(f"{where}: column {name!r} becomes {column.type} in a table, not its values")
    return table
FORMATS: dict[str, Format] = {}
_READERS: weakref.WeakSet[ShardReader[Any]] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for reader in list(_READERS):
        reader._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


def register(fmt: Format) -> Format:
    """Make ``fmt`` known to catalogs and ``Dataset.from_path(fmt=...)``."""
    FORMATS[fmt.name] = fmt
    return fmt


LOAD_THREADS = 4  # a gather's pieces loading at once, at most (and at most the machine's cores)


def _each(fn: Callable[[Any], T], items: list[Any], threads: int) -> list[T]:
    """``[fn(item) for item in items]`` on ``threads`` threads, this one and the others from the
    retry pool's long-lived ones (thread ``t`` takes items ``t``, ``t + threads``, ...); the
    first error, in item order, is raised once all have ended."""
    results: list[Any] = [None] * len(items)
    errors: list[BaseException | None] = [None] * len(items)
    threads = max(1, min(threads, len(items)))

    def run(t: int) -> None:
        for j in range(t, len(items), threads):
            try:
                results[j] = fn(items[j])
            except BaseException as error:  # noqa: BLE001 - raised below, in item order
                errors[j] = error

    others = [in_background(functools.partial(run, t)) for t in range(1, threads)]
    run(0)
    for wait in others:
        wait()
    error = next((error for error in errors if error is not None), None)
    if error is not None:
        raise error
    return results


def widened(name: str, kinds: Sequence[pa.DataType], problem: type[ValueError] = ValueError) -> pa.DataType:
    """The type that holds every value of column ``name`` typed ``kinds`` unchanged, and batches
    as each of them does (``zephon.torch`` makes every int an int64 and every float a float64):
    the widest of ints of one signedness (or signed ints wider than the unsigned ones), of
    floats, or of strings or binaries; ``null`` goes with any type. Else ``problem``."""
    distinct = list(dict.fromkeys(kind for kind in kinds if not pa.types.is_null(kind)))
    if len(distinct) <= 1:
        return distinct[0] if distinct else pa.null()
    ints = [kind for kind in distinct if pa.types.is_integer(kind)]
    if len(ints) == len(distinct):
        signed = [kind.bit_width for kind in ints if pa.types.is_signed_integer(kind)]
        unsigned = [kind.bit_width for kind in ints if pa.types.is_unsigned_integer(kind)]
        if not signed:
            return pa.from_numpy_dtype(np.dtype(f"uint{max(unsigned)}"))
        if not unsigned or max(unsigned) < max(signed):
            return pa.from_numpy_dtype(np.dtype(f"int{max(signed)}"))
    elif all(pa.types.is_floating(kind) for kind in distinct):
        return max(distinct, key=lambda kind: kind.bit_width)
    elif all(pa.types.is_string(kind) or pa.types.is_large_string(kind) for kind in distinct):
        return pa.large_string()
    elif all(pa.types.is_binary(kind) or pa.types.is_large_binary(kind) for kind in distinct):
        return pa.large_binary()
    raise problem(f"the rows do not combine into one table: column {name!r} is "
                  f"{' in some rows, '.join(map(str, distinct))} in others, and no one type holds them all unchanged; "
                  "read its rows with fetch() (as records), or leave it out with columns=")


class ShardReader(Generic[Meta]):
    """Reads rows of a dataset's shards piece by piece (see the module docstring); ``Meta`` is
    what the format keeps of an open shard."""

    columnar = True  # pieces are Arrow tables, read by ``gather`` (False: ``_take`` returns records)
    tabular = True  # not columnar: the records are plain values a table can hold (False: numpy arrays, as tokens)
    piece_name = "piece"  # what a piece is called in messages
    decodes = False  # loading a piece is work (a Parquet row group's decoding): ``gather`` loads its misses at once

    def __init__(self, shards: Shards, cache: ShardCache):
        self._setup(shards, cache)

    def _setup(self, shards: Shards, cache: ShardCache) -> None:
        self.shards, self.cache = shards, cache
        self.shared: SharedPieces | None = None  # a DataLoader worker's store of decoded pieces (see share)
        self._after_fork()
        _READERS.add(self)

    def _after_fork(self) -> None:
        """Fresh lock and no open files (a forked child must not share a lock some thread held)."""
        self._lock = threading.Lock()
        self._metas: OrderedDict[int, Meta] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {"shards": self.shards, "cache": self.cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["shards"], state["cache"])

    # -- naming -------------------------------------------------------------------------

    @property
    def policy(self) -> RetryPolicy:
        return self.shards.policy

    def uri(self, k: int) -> str:
        return self.shards.location.uri_of(self.shards.files[k])

    def path(self, k: int) -> str:
        return self.shards.location.path(self.shards.files[k])

    def call(self, k: int, what: str, fn: Callable[[], T]) -> T:
        return self.policy.call(fn, what=what, dataset=self.shards.name, shard=k, uri=self.uri(k))

    # -- opening --------------------------------------------------------------------------

    def meta(self, k: int) -> Meta:
        """The shard's open metadata (identity checked on first use; kept for :data:`OPEN_SHARDS` shards)."""
        with self._lock:
            found = self._metas.get(k)
            if found is not None:
                self._metas.move_to_end(k)
                return found
        info = self.call(k, "stat", lambda: self.shards.location.fs.get_file_info(self.path(k)))
        self.check_identity(k, info)
        meta = self.call(k, "open", lambda: self._open(k, info))
        with self._lock:
            self._metas[k] = meta
            while len(self._metas) > OPEN_SHARDS:
                self._metas.popitem(last=False)
        return meta

    def check_identity(self, k: int, info: pafs.FileInfo) -> None:
        """Raise :class:`ShardChangedError` if shard ``k`` is gone or differs from its catalog entry."""
        where = f"Dataset {self.shards.name!r}, shard {k} ({self.uri(k)})"
        if info.type != pafs.FileType.File:
            raise ShardChangedError(f"{where}: the file disappeared since the catalog was built; restore it or "
                                    "build the Dataset again", dataset=self.shards.name, shard=k, uri=self.uri(k))
        size, mtime = int(self.shards.sizes[k]), int(self.shards.mtimes[k])
        now = int(info.mtime_ns or 0)
        unit = 1 if mtime % SECOND and now % SECOND else SECOND  # one side in whole seconds (an object store's
        # HEAD against its listing's milliseconds): the two are compared in seconds
        if info.size != size or (mtime and now and now // unit != mtime // unit):
            raise ShardChangedError(
                f"{where}: the file changed since its catalog was built ({size:,} -> {info.size:,} bytes, mtime "
                f"{mtime} -> {now} ns); build the Dataset again", dataset=self.shards.name, shard=k, uri=self.uri(k))

    def unchanged(self, k: int, retried: bool = True) -> None:
        """After a read failed: raise :class:`ShardChangedError` if shard ``k`` changed since its
        catalog was built. ``retried=False``, inside a read's failed attempt: one stat, and one
        that fails too leaves the read's error to the retry policy."""
        def stat() -> pafs.FileInfo:
            return self.shards.location.fs.get_file_info(self.path(k))
        if retried:
            info = self.call(k, "stat", stat)
        else:
            try:
                info = stat()
            except OSError:
                return
        self.check_identity(k, info)

    def recheck(self, k: int, error: BaseException, what: str) -> None:
        """After a decoding error: raise ShardChangedError if the shard changed meanwhile, else ValueError."""
        self.unchanged(k)
        raise ValueError(f"Dataset {self.shards.name!r}, shard {k} ({self.uri(k)}): cannot read {what} ({error}); "
                         "the file is corrupted") from error

    # -- format hooks -----------------------------------------------------------------------

    def _open(self, k: int, info: pafs.FileInfo) -> Meta:
        raise NotImplementedError

    def _ends(self, k: int, meta: Meta) -> np.ndarray:
        raise NotImplementedError

    def _estimate(self, k: int, meta: Meta, piece: int, columns: tuple[str, ...] | None) -> int:
        raise NotImplementedError

    def _load(self, k: int, meta: Meta, piece: int, columns: tuple[str, ...] | None) -> tuple[Piece, int]:
        raise NotImplementedError

    def _take(self, k: int, value: Piece, local: np.ndarray, columns: tuple[str, ...] | None) -> Rows:
        """Records at ``local`` offsets of a piece (readers that are not ``columnar``)."""
        raise NotImplementedError

    # -- pieces ---------------------------------------------------------------------------------

    def plan(self, k: int, offsets: np.ndarray) -> list[tuple[int, int]]:
        """``(piece, position of its first use)`` for the pieces ``offsets`` need, in order of first use."""
        pieces = chunk_of(self._ends(k, self.meta(k)), offsets)
        unique, first = np.unique(pieces, return_index=True)
        order = np.argsort(first, kind="stable")
        return list(zip(unique[order].tolist(), first[order].tolist()))

    def estimate(self, k: int, piece: int, columns: tuple[str, ...] | None) -> int:
        """Roughly the bytes piece ``piece`` takes once loaded (what the readahead reserves)."""
        return int(self._estimate(k, self.meta(k), piece, columns))

    def share(self, store: SharedPieces | None) -> None:
        """Take decoded pieces from ``store`` (and publish there those loaded here), when loading
        one is work (``decodes``) and it is an Arrow table (``columnar``); ``None``: stop."""
        if self.decodes and self.columnar:
            self.shared = store

    def load(self, k: int, piece: int, columns: tuple[str, ...] | None) -> tuple[Piece, int]:
        """Load one piece: from the shared store if there is one, else :meth:`decode` it."""
        shared = self.shared
        if shared is None:
            return self.decode(k, piece, columns)
        name = piece_name(self.shards.name, self.uri(k), piece, columns)
        return shared.get(name, lambda: self.decode(k, piece, columns))

    def decode(self, k: int, piece: int, columns: tuple[str, ...] | None) -> tuple[Piece, int]:
        """Load one piece from its shard under the retry policy: ``(value, bytes)``."""
        meta = self.meta(k)

        def attempt() -> tuple[Piece, int]:
            try:
                loaded = self._load(k, meta, piece, columns)
            except OSError:  # a file cut or rewritten since its catalog fails so too: said at once, not retried
                self.unchanged(k, retried=False)
                raise
            self.unchanged(k, retried=False)  # a file replaced since it was opened is read without an error
            return loaded
        try:
            return self.call(k, f"read {self.piece_name} {piece}", attempt)
        except (pa.ArrowException, ValueError, OSError) as error:
            if isinstance(error, StorageError):
                raise
            self.recheck(k, error, f"{self.piece_name} {piece}")
            raise

    def key(self, piece: int, columns: tuple[str, ...] | None) -> PieceKey:
        return piece, columns

    def piece(self, k: int, piece: int, columns: tuple[str, ...] | None) -> Piece:
        """A piece from the fetch cache (or the readahead), loaded on a miss."""
        key = self.key(piece, columns)
        value = self.cache.get(k, key)
        if value is None:
            try:
                value, nbytes = self.load(k, piece, columns)
                self.cache.put(k, key, value, nbytes)
            except BaseException as error:
                self.cache.failed(k, key, error)
                raise
        return value

    def pieces(self, k: int, pieces: list[int], columns: tuple[str, ...] | None) -> list[Piece]:
        """:meth:`piece` of each of ``pieces``. When loading one is work (``decodes``) and the
        cache misses several, they load on up to :data:`LOAD_THREADS` threads at once (a Parquet
        row group decodes without the GIL); each enters the cache as it is loaded, so a failed
        one leaves the others cached, and the first failure in piece order is raised."""
        keys = [self.key(p, columns) for p in pieces]
        missing = 0 if not self.decodes else sum(not self.cache.holds(k, key) for key in keys)
        threads = min(missing, LOAD_THREADS, os.cpu_count() or 1)
        return _each(lambda p: self.piece(k, p, columns), pieces, threads)

    def parts(self, k: int, offsets: np.ndarray, columns: tuple[str, ...] | None
              ) -> tuple[np.ndarray | None, Iterator[tuple[np.ndarray, Rows]]]:
        """``(order, parts)``: per piece, the positions of ``offsets`` it holds and the rows taken from it.

        ``order`` is None when the parts come in the order of ``offsets`` (else the parts follow
        ``order``, a permutation of positions).
        """
        ends = self._ends(k, self.meta(k))
        starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
        pieces = chunk_of(ends, offsets)
        ascending = bool((pieces[1:] >= pieces[:-1]).all())
        order = np.arange(len(pieces)) if ascending else np.argsort(pieces, kind="stable")
        cuts = np.flatnonzero(np.diff(pieces[order])) + 1

        def generate() -> Iterator[tuple[np.ndarray, Rows]]:
            for segment in np.split(order, cuts) if len(order) else []:
                p = int(pieces[segment[0]])
                value = self.piece(k, p, columns)
                yield segment, self._take(k, value, offsets[segment] - starts[p], columns)
        return (None if ascending else order), generate()

    # -- reading --------------------------------------------------------------------------------

    def empty(self, k: int, columns: tuple[str, ...] | None) -> pa.Table:
        raise NotImplementedError

    def read_table(self, k: int, offsets: np.ndarray, columns: Sequence[str] | None, exact: bool = False
                   ) -> pa.Table:
        """Rows ``offsets`` of shard ``k`` (validated by the caller), in that order. A reader of
        records makes them one table by :func:`records_table` (``exact``: or raises
        :class:`UnevenRecordsError`)."""
        columns = None if columns is None else tuple(columns)
        if not self.columnar:
            return records_table(self.uri(k), self.read(k, offsets, columns), exact)
        if not len(offsets):
            return self.empty(k, columns)
        tables, rows = self.gather(k, offsets, columns)
        return take_rows(pa.concat_tables(tables), rows)

    def gather(self, k: int, offsets: np.ndarray, columns: tuple[str, ...] | None
               ) -> tuple[list[pa.Table], np.ndarray]:
        """A columnar reader's pieces that rows ``offsets`` of shard ``k`` fall in (validated by
        the caller, at least one), in piece order, and each offset's row in their concatenation:
        the rows are ``concat_tables(tables).take(rows)``, gathered at once by a caller that
        reads several shards."""
        ends = self._ends(k, self.meta(k))
        pieces = chunk_of(ends, offsets)
        used = np.flatnonzero(np.bincount(pieces, minlength=len(ends)))
        tables: list[pa.Table] = self.pieces(k, used.tolist(), columns)
        # per used piece: its first row in the concatenation, less its first offset
        shift = np.zeros(len(ends), dtype=np.int64)
        sizes = np.fromiter((table.num_rows for table in tables), np.int64, len(tables))
        shift[used] = np.cumsum(sizes) - ends[used]
        return tables, offsets + shift[pieces]

    def read(self, k: int, offsets: np.ndarray, columns: Sequence[str] | None) -> list[Any]:
        columns = None if columns is None else tuple(columns)
        if self.columnar:
            records: list[Any] = self.read_table(k, offsets, columns).to_pylist()
            return records
        out: list[Any] = [None] * len(offsets)
        _, parts = self.parts(k, offsets, columns)
        for segment, records in parts:
            for position, record in zip(segment.tolist(), records):
                out[position] = record
        return out
