"""DataLoader workers that die with their trainer, a clear error when one dies first, and a
garbage collector that leaves the trainer's inherited objects alone.

A worker whose trainer was SIGKILLed can outlive it: blocked writing a batch into a pipe
nobody drains, or busy in a fetch, it never reaches torch's own parent check. So every
zephon worker, when it starts, runs a watchdog thread that SIGKILLs it within
:data:`WATCH_INTERVAL` seconds of the trainer's death (every platform, and every start
method: under ``forkserver`` the parent is the server, so the watchdog checks the trainer).
When the trainer started its workers from its main thread, the worker also asks the kernel
to SIGKILL it the moment its parent dies (``PR_SET_PDEATHSIG``, Linux; the kernel ties it to
the *thread* that started the worker, so a worker started from another thread, which may end
before the trainer, relies on the watchdog alone).
"""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Mapping, Protocol, Sequence

import pyarrow as pa

from zephon.io.local import process_alive

log = logging.getLogger("zephon")

WATCH_INTERVAL = 0.5  # seconds between the watchdog's checks of the trainer
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
_guarded: list[int] = []  # the pid this process guarded itself in (a fork child starts unguarded)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _watch(trainer: int, is_parent: bool) -> None:
    while True:
        time.sleep(WATCH_INTERVAL)
        if (os.getppid() != trainer) if is_parent else not process_alive(trainer):
            _die()


def guard_worker(trainer: int, from_main_thread: bool) -> None:
    """Tie this worker process's life to the ``trainer`` process (idempotent per process);
    ``from_main_thread``: the trainer started the worker from its main thread."""
    if _guarded and _guarded[0] == os.getpid():
        return
    _guarded[:] = [os.getpid()]
    is_parent = os.getppid() == trainer
    if is_parent and from_main_thread and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog still covers it
    if not process_alive(trainer) or (is_parent and os.getppid() != trainer):
        _die()  # the trainer died before the guard was up
    threading.Thread(target=_watch, args=(trainer, is_parent), name="zephon-trainer-watchdog", daemon=True).start()


def freeze_inherited() -> None:
    """Leave the objects this worker started with out of garbage collection (``gc.freeze``).

    A worker inherits the trainer's whole heap (torch alone is some 10^5 objects); each full
    collection would walk it, writing every object's header, which costs a per-item ``map`` a
    third of its time and copies the inherited pages that fork shares. The Python docs advise
    this for processes forked without exec. Objects made in the worker are collected as usual."""
    gc.freeze()


def pick_arrow_pool(trainer: str) -> None:
    """Make Arrow's jemalloc pool this worker's default memory pool where Arrow's usual default,
    mimalloc, is the pool of the ``trainer`` and of this worker so far: not where
    ``ARROW_DEFAULT_MEMORY_POOL``, ``pyarrow.set_memory_pool`` or a ``worker_init_fn`` chose one,
    nor where pyarrow was built without jemalloc.

    Under mimalloc a Parquet-reading worker spent a seventh of its CPU in the kernel zeroing
    fresh pages for the row groups it decodes; under jemalloc its CPU per row is 5-7 % lower
    (docs/performance.md). Arrays already made keep the pool they came from; the trainer's
    process is left as it is."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") or trainer != "mimalloc" or \
            pa.default_memory_pool().backend_name != "mimalloc":
        return
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return
    pa.set_memory_pool(pool)
    log.debug("zephon: DataLoader worker %d allocates Arrow memory from the jemalloc pool", os.getpid())


class WorkerDiedError(RuntimeError):
    """A DataLoader worker died during the run (e.g. killed by the OOM killer).

    ``worker``, ``pid``, ``lanes`` and ``signal`` (its name, or None for an exit status) say
    which; the loader cannot go on. Restart from the last checkpoint: it is exact.
    """

    def __init__(self, worker: int, pid: int | None, lanes: Sequence[int], exitcode: int):
        self.worker, self.pid, self.lanes = worker, pid, list(lanes)
        self.signal = signal.Signals(-exitcode).name if exitcode < 0 else None
        how = f"killed by signal {self.signal}" if self.signal else f"exited with status {exitcode}"
        hint = " (the OOM killer sends SIGKILL when memory runs out)" if self.signal == "SIGKILL" else ""
        super().__init__(f"zephon: DataLoader worker {worker} (pid {pid}, lanes {self.lanes}) died: {how}{hint}; "
                         "this iteration cannot continue: resume from the last checkpoint (it is exact)")


def dead_worker(base: Any, lanes: Mapping[int, Sequence[int]]) -> WorkerDiedError | None:
    """The error for the first worker of torch iterator ``base`` that died, if any.

    A worker exits cleanly only when its iterator shuts down; any other exit is a death."""
    if getattr(base, "_shutdown", False):
        return None
    for worker, process in enumerate(getattr(base, "_workers", None) or ()):
        code = process.exitcode
        if code:
            return WorkerDiedError(worker, process.pid, lanes.get(worker, []), code)
    return None


class Watched(Protocol):
    """What :func:`watch_workers` watches: a loader iterator that can name its dead worker."""

    def dead_worker(self) -> WorkerDiedError | None: ...


_watched: weakref.WeakSet[Watched] = weakref.WeakSet()  # live loader iterators whose workers may die
_handler: list[Any] = []  # zephon's SIGCHLD handler, once installed


def watch_workers(iterator: Watched) -> None:
    """Raise :class:`WorkerDiedError` (via SIGCHLD) as soon as a worker of ``iterator`` dies.

    torch's own SIGCHLD handler raises a ``RuntimeError`` with the pid only, wherever the main
    thread happens to be (often in the training step); zephon's handler runs first and names
    the worker's lanes, then hands other children's signals to the handler it replaced.
    ``iterator`` needs a ``dead_worker()`` method. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGCHLD"):
        return
    _watched.add(iterator)
    if _handler and signal.getsignal(signal.SIGCHLD) is _handler[0]:
        return
    previous = signal.getsignal(signal.SIGCHLD)

    def on_child(signum: int, frame: Any) -> None:
        for watched in list(_watched):
            died = watched.dead_worker()
            if died is not None:
                _watched.discard(watched)
                raise died
        if callable(previous):
            previous(signum, frame)

    _handler[:] = [on_child]
    signal.signal(signal.SIGCHLD, on_child)
