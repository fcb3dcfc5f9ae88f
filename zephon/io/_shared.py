"""Decoded pieces shared by the processes that read one DataLoader iteration.

Each DataLoader worker has its own fetch cache, but their lanes draw on the same shards: a
shuffled chunk touches most row groups of its shard, and consecutive chunks go to different
lanes. Without sharing, K workers decode each row group about K times. A :class:`SharedPieces`
store keeps each decoded piece (an Arrow table) once, as an Arrow IPC file in a directory in
memory (``/dev/shm``): the first process that misses it decodes and publishes it, the others
read the file (a row group of 500 KB: 0.07 ms against 1.1-1.5 ms to decode it; writing it
costs 0.24 ms), and a process that finds a publication in progress waits for it rather than
decoding the piece again.

Every race ends in at most a second decoding, never in a wrong or lost piece: a piece is
published by an atomic rename of a complete file; a publisher announces itself with a lock
file holding its pid, which waiters drop when that process has died. Each process removes the
oldest pieces it published once the store holds more than its byte bound. A piece that cannot
be written (the directory is full, a type IPC cannot hold) is kept by its reader alone, and
counted; the first such failure is logged.
"""
from __future__ import annotations

import hashlib
import logging
import mmap
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from typing import Callable

import numpy as np
import pyarrow as pa

from zephon.io.local import process_alive

log = logging.getLogger("zephon")
ROOT = "/dev/shm"  # where stores are made: memory, shared by every process of the machine
PREFIX = "zephon-pieces-"
COUNTERS = ("published", "shared", "waited", "unshared", "bytes", "evicted")  # per reader, in the counters file
_BYTES, _EVICTED = COUNTERS.index("bytes"), COUNTERS.index("evicted")  # bytes published, bytes removed
_PIECES, _WAIT_FIRST, _WAIT_MOST = ".arrow", 0.0002, 0.005  # file suffix; polling interval (s), doubling to a ceiling


class SharedPieces:
    """Reader ``reader``'s handle on a :class:`PieceStore`: ``get(name, load)`` is the piece
    ``name``, read from the store or loaded (``load()``: ``(table, nbytes)``) and published."""

    def __init__(self, store: PieceStore, reader: int):
        if not 0 <= reader < store.readers:
            raise ValueError(f"reader {reader} is not one of the store's {store.readers}")
        self.directory, self.reader, self.max_bytes = store.directory, reader, store.max_bytes
        with open(os.path.join(store.directory, "counters"), "r+b") as file:
            self._map = mmap.mmap(file.fileno(), store.readers * len(COUNTERS) * 8)
        self.counts = np.frombuffer(self._map, dtype=np.int64).reshape(store.readers, len(COUNTERS))
        self._mine: deque[tuple[str, int]] = deque()  # pieces this process published, oldest first
        self._lock = threading.Lock()  # guards _mine and this reader's counters (readahead threads share them)
        self._full = False  # a write failed: publish no more

    def get(self, name: str, load: Callable[[], tuple[pa.Table, int]]) -> tuple[pa.Table, int]:
        """The piece ``name``: read from the store, else loaded here and published."""
        path = os.path.join(self.directory, name + _PIECES)
        while True:
            found = _read(path)
            if found is not None:
                self._count("shared")
                return found
            lock = path + ".lock"
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                self._await(path, lock)
                continue
            except OSError:  # the store is gone (the iteration ended) or unwritable
                self._count("unshared")
                return load()
            return self._publish(path, lock, fd, load)

    def _publish(self, path: str, lock: str, fd: int, load: Callable[[], tuple[pa.Table, int]]
                 ) -> tuple[pa.Table, int]:
        """Holding the lock: load the piece, publish it, and return it."""
        try:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            found = _read(path)  # published between the look and the lock
            if found is not None:
                self._count("shared")
                return found
            table, nbytes = load()
            written = None if self._full else self._write(path, table)
        finally:
            _remove(lock)
        if written is None:
            self._count("unshared")
            return table, nbytes
        self._count("published", written)
        self._evict()
        return table, nbytes

    def _write(self, path: str, table: pa.Table) -> int | None:
        """Write ``table`` to ``path`` (whole or not at all); its bytes, or None if it cannot."""
        part = f"{path}.{os.getpid()}.{threading.get_ident()}.part"
        try:
            with pa.OSFile(part, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            size = os.path.getsize(part)
            os.rename(part, path)
        except (OSError, pa.ArrowException) as error:
            _remove(part)
            self._full = isinstance(error, OSError)  # the directory is full or gone: so it stays
            if not isinstance(error, FileNotFoundError):  # gone: the iteration ended, nothing is lost
                log.warning("zephon: DataLoader reader %d cannot share a decoded piece through %s (%s: %s); it keeps "
                            "%s for itself (the others decode it too)", self.reader, self.directory,
                            type(error).__name__, error, "this and every later one" if self._full else "this one")
            return None
        with self._lock:
            self._mine.append((path, size))
        return size

    def _await(self, path: str, lock: str) -> None:
        """Wait while another process publishes ``path``: until it is there or ``lock`` is gone
        (dropped here if the process that held it has died)."""
        self._count("waited")
        pause = _WAIT_FIRST
        while os.path.exists(lock) and not os.path.exists(path):
            if not _alive(lock):
                _remove(lock)
                return
            time.sleep(pause)
            pause = min(2 * pause, _WAIT_MOST)

    def _evict(self) -> None:
        """Remove this process's oldest pieces while the store holds more than ``max_bytes``."""
        with self._lock:
            held = int(self.counts[:, _BYTES].sum() - self.counts[:, _EVICTED].sum())
            while held > self.max_bytes and len(self._mine) > 1:
                path, size = self._mine.popleft()
                _remove(path)
                self.counts[self.reader, _EVICTED] += size
                held -= size

    def _count(self, what: str, nbytes: int = 0) -> None:
        with self._lock:
            self.counts[self.reader, COUNTERS.index(what)] += 1
            self.counts[self.reader, _BYTES] += nbytes


def piece_name(*parts: object) -> str:
    """A file name for a piece identified by ``parts`` (a dataset, a shard's uri, the piece, its columns)."""
    return hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=16).hexdigest()


class PieceStore:
    """A store directory for ``readers`` processes, holding up to ``max_bytes``: made with
    :meth:`make` by the process that starts them, handed to each (it pickles as its three
    fields) and opened there with :meth:`open`."""

    def __init__(self, directory: str, readers: int, max_bytes: int):
        self.directory, self.readers, self.max_bytes = directory, readers, max_bytes

    @classmethod
    def make(cls, readers: int, max_bytes: int | None, root: str | None = None) -> PieceStore | None:
        """A new store under ``root`` (default :data:`ROOT`) bounded at ``max_bytes`` (None: no
        bound of its own) and at half the space free there; None, with a debug line, where
        ``root`` is missing or not writable. Stores left by processes that died are removed."""
        root = ROOT if root is None else root
        try:
            _sweep(root)
            directory = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root)
            with open(os.path.join(directory, "counters"), "wb") as file:
                file.truncate(readers * len(COUNTERS) * 8)
            stat = os.statvfs(directory)
        except OSError as error:
            log.debug("zephon: DataLoader workers decode on their own: no store for decoded pieces in %s (%s)",
                      root, error)
            return None
        room = stat.f_bavail * stat.f_frsize // 2
        return cls(directory, readers, room if max_bytes is None else min(max_bytes, room))

    def open(self, reader: int) -> SharedPieces:
        """Reader ``reader``'s handle (``OSError`` once the store is removed)."""
        return SharedPieces(self, reader)

    def counts(self) -> dict[str, int]:
        """The counters summed over the readers ({} once the store is removed)."""
        try:
            counts = np.fromfile(os.path.join(self.directory, "counters"), dtype=np.int64)
        except OSError:
            return {}
        return dict(zip(COUNTERS, (int(c) for c in counts.reshape(-1, len(COUNTERS)).sum(axis=0))))

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _sweep(root: str) -> None:
    """Remove the stores of processes that no longer run (a trainer that was killed)."""
    for entry in os.scandir(root):
        if entry.name.startswith(PREFIX):
            pid = entry.name[len(PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not process_alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


def _read(path: str) -> tuple[pa.Table, int] | None:
    """The table of a published piece (None if there is none), read whole: a mapping of the file
    would cost a page fault per page touched, 3.4 x the time of reading it (500 KB on tmpfs)."""
    try:
        with pa.OSFile(path) as file:
            data = file.read_buffer()
    except FileNotFoundError:
        return None
    table = pa.ipc.open_file(data).read_all()
    return table, table.get_total_buffer_size()


def _alive(lock: str) -> bool:
    """Whether the process named in ``lock`` runs (True while it has not written its pid yet)."""
    try:
        with open(lock, "rb") as file:
            pid = file.read()
    except FileNotFoundError:
        return True
    return not pid or process_alive(int(pid))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
