"""Storage errors: transient failures retried with bounded backoff, the rest named and raised.

Every read of a shard (opening it, a row group, a record batch, a span of lines) runs under a
:class:`RetryPolicy`. An attempt that raises a *transient* error (an ``OSError`` other than
"not found" or "permission denied": object-store 5xx, throttling, timeouts, connection resets)
is retried after ``backoff_s``, doubling up to ``max_backoff_s``, at most ``attempts`` times in
all. An attempt that runs longer than ``timeout_s`` is abandoned (its thread finishes in the
background) and counts as a transient failure. Timed attempts run on a small pool of
long-lived daemon threads (a new one only when every one is busy or stuck), never a thread per
read; at exit the reads in progress are let finish first (up to ``EXIT_WAIT_S``). When the
attempts are spent, or the error is not transient, the read raises a :class:`StorageError`
naming the dataset, the shard and the URI: a timed read never hangs and data is never skipped
silently. Retries are logged on the ``zephon`` logger. A ``Dataset`` reads files on a local
disk under :data:`LOCAL_DISK_POLICY` unless told otherwise: untimed, in the calling thread.

A shard that disappeared or changed (size or modification time) since its catalog was built
raises :class:`ShardChangedError`, never retried: the run must be restarted on a new catalog.
"""
from __future__ import annotations

import atexit
import logging
import numbers
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

T = TypeVar("T")
LOG = logging.getLogger("zephon")
_CONTENT = ("deserialize", "magic", "corrupt", "Invalid", "invalid", "out of bounds", "Unexpected end",
            "Parquet", "IPC", "flatbuffer", "inflate", "compress", "ZSTD", "zstd", "LZ4", "Snappy", "GZip", "Brotli",
            "BZ2", "Codec")  # what a damaged file, not the storage, makes pyarrow say (a short read may be the storage's)
_PERMANENT = ("NoSuchBucket", "NoSuchKey", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
              "ACCESS_DENIED", "RESOURCE_NOT_FOUND", "NO_SUCH_BUCKET", "INVALID_ACCESS_KEY_ID")


class StorageError(OSError):
    """A read that failed for good; ``dataset``, ``shard`` and ``uri`` say which."""

    def __init__(self, message: str, *, dataset: str, shard: int | None, uri: str):
        super().__init__(message)
        self.dataset, self.shard, self.uri = dataset, shard, uri


class ShardChangedError(StorageError, ValueError):
    """A shard disappeared or changed since its catalog was built (also a ``ValueError``: the data is not
    what the catalog says)."""


class StorageTimeoutError(StorageError, TimeoutError):
    """Every attempt of a read ran longer than the policy's ``timeout_s``."""


def _positive(parameter: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) > 0:
        hint = " or None (no timeout)" if allow_none else ""
        raise ValueError(f"RetryPolicy: {parameter}={value!r} must be a number > 0{hint}")


def damaged(error: BaseException) -> bool:
    """Whether pyarrow's error is about the file's content (never retried; readers report it as ``ValueError``)."""
    return isinstance(error, OSError) and any(marker in str(error) for marker in _CONTENT)


def transient(error: BaseException) -> bool:
    """Whether a failed read is worth another attempt."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(error, TimeoutError):
        return True
    return isinstance(error, OSError) and not any(marker in str(error) for marker in _PERMANENT)


@dataclass(frozen=True)
class RetryPolicy:
    """How reads of a dataset's shards are retried and timed out.

    Parameters
    ----------
    attempts : int, default 5
        Attempts per read, the first included (``1``: never retry).
    backoff_s : float, default 0.2
        Wait before the second attempt; doubled before each further one.
    max_backoff_s : float, default 5.0
        The longest wait between two attempts.
    timeout_s : float or None, default 120.0
        The longest one attempt may take before it is abandoned and counted as a transient
        failure (``None``: no limit, the attempt runs in the calling thread).
    """

    attempts: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    timeout_s: float | None = 120.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, numbers.Integral) or self.attempts < 1:
            raise ValueError(f"RetryPolicy: attempts={self.attempts!r} must be an int >= 1 (1: no retry)")
        _positive("backoff_s", self.backoff_s)
        _positive("max_backoff_s", self.max_backoff_s)
        _positive("timeout_s", self.timeout_s, allow_none=True)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** (attempt - 1))

    def call(self, fn: Callable[[], T], *, what: str, dataset: str, shard: int | None, uri: str) -> T:
        """``fn()`` under this policy; a final failure raises :class:`StorageError` naming ``what`` and the shard."""
        for attempt in range(1, self.attempts + 1):
            try:
                return self._attempt(fn)
            except StorageError:
                raise
            except BaseException as error:  # noqa: BLE001 - classified right below
                if not isinstance(error, (OSError, TimeoutError)) or damaged(error):
                    raise
                timed_out = isinstance(error, _Timeout)
                if not transient(error) or attempt == self.attempts:
                    where = f"Dataset {dataset!r}, shard {shard} ({uri})" if shard is not None else \
                        f"Dataset {dataset!r} ({uri})"
                    kind = StorageTimeoutError if timed_out else StorageError
                    tries = f" after {attempt} attempts" if attempt > 1 else ""
                    raise kind(f"{where}: {what} failed{tries}: {error}", dataset=dataset, shard=shard,
                               uri=uri) from error
                pause = self.delay(attempt)
                LOG.warning("zephon: dataset %r, shard %s (%s): %s failed (%s); attempt %d of %d in %.2f s",
                            dataset, shard, uri, what, error, attempt + 1, self.attempts, pause)
                time.sleep(pause)
        raise AssertionError("unreachable")

    def _attempt(self, fn: Callable[[], T]) -> T:
        if self.timeout_s is None:
            return fn()
        return _timed(fn, self.timeout_s)


class _Timeout(TimeoutError):
    pass


class _Task:
    """One call handed to the pool: the call, and its outcome once it has ended. Its end is
    signalled by releasing a lock taken at its start (a lock is far cheaper to make and to
    hand over than an ``Event``, and a load of every row group makes one)."""

    __slots__ = ("fn", "_running", "result", "error", "ended", "abandoned")

    def __init__(self, fn: Callable[[], Any]):
        self.fn, self._running = fn, threading.Lock()
        self._running.acquire()
        self.result: Any = None
        self.error: BaseException | None = None
        self.ended = self.abandoned = False  # under the pool's lock

    def finish(self) -> None:
        self._running.release()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether the call has ended (waiting up to ``timeout_s``; ``None``: as long as it takes)."""
        if not self._running.acquire(timeout=-1 if timeout_s is None else timeout_s):
            return False
        self._running.release()  # later waits return at once
        return True


class _Pool:
    """Daemon threads that run timed attempts (a stuck read delays exit by :data:`EXIT_WAIT_S`
    at most, after the readaheads' own wait). A thread is started only when none is idle: one
    stuck in an abandoned read is replaced, the others are reused. A forked child starts with
    none."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        self._lock = threading.Condition()
        self._idle = self._busy = 0

    def submit(self, fn: Callable[[], Any]) -> _Task:
        """Run ``fn()`` on an idle thread (a new one when none is): ``task.wait()`` returns once
        it has ended."""
        task = _Task(fn)
        with self._lock:
            self._busy += 1
            start = self._idle == 0
            if not start:
                self._idle -= 1
        if start:
            try:
                threading.Thread(target=self._serve, name="zephon-read", daemon=True).start()
            except BaseException:  # e.g. no new threads at exit: nothing runs, nothing is counted
                with self._lock:
                    self._not_busy()
                raise
        self._tasks.put(task)
        return task

    def run(self, fn: Callable[[], T], timeout_s: float) -> T:
        task = self.submit(fn)
        if not task.wait(timeout_s):
            with self._lock:
                if not task.ended:  # stuck: exit does not wait for it
                    task.abandoned = True
                    self._not_busy()
            raise _Timeout(f"no answer within timeout_s={timeout_s} s")
        if task.error is not None:
            raise task.error
        result: T = task.result
        return result

    def _serve(self) -> None:
        while True:
            task = self._tasks.get()
            try:
                task.result = task.fn()
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                task.error = error
            task.finish()
            with self._lock:
                task.ended = True
                self._idle += 1
                if not task.abandoned:
                    self._not_busy()
            del task  # an idle thread keeps no result (a decoded piece) alive

    def _not_busy(self) -> None:
        """One call fewer to wait for at exit (under ``_lock``)."""
        self._busy -= 1
        self._lock.notify_all()

    def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every call in progress (and not abandoned after its
        timeout) to end; whether they all have."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._busy, timeout_s)


_POOL = _Pool()
EXIT_WAIT_S = 30.0  # at exit, how long the reads in progress may take to end (the readaheads wait as long first)


def _settle_at_exit() -> None:
    """At exit, let the reads in progress end (up to :data:`EXIT_WAIT_S`; not those abandoned
    after their timeout): a daemon thread that comes back from pyarrow while the interpreter
    shuts down aborts the process ("terminate called without an active exception")."""
    if not _POOL.settle(EXIT_WAIT_S):
        LOG.warning("zephon: %d storage reads still running at exit after %.0f s", _POOL._busy, EXIT_WAIT_S)


atexit.register(_settle_at_exit)


def _timed(fn: Callable[[], T], timeout_s: float) -> T:
    """``fn()`` on the pool's threads, abandoned after ``timeout_s``."""
    return _POOL.run(fn, timeout_s)


def in_background(fn: Callable[[], Any]) -> Callable[[], bool]:
    """Start ``fn()`` on one of the pool's long-lived daemon threads (no thread is started per
    call); the returned ``wait()`` returns once it has ended. ``fn`` keeps its own outcome."""
    return _POOL.submit(fn).wait


DEFAULT_POLICY = RetryPolicy()
LOCAL_DISK_POLICY = RetryPolicy(timeout_s=None)  # a Dataset's default for files on a local disk
