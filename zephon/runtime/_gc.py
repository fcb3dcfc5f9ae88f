"""Pausing Python's cyclic garbage collector while a large, short-lived object graph is built."""
from __future__ import annotations

import gc
import os
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.RLock()  # reentrant: a finalizer or signal handler in the same thread may pause too
_pauses = 0  # blocks inside paused_gc, in every thread
_was_enabled = False  # whether the collector ran when the first of them began


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the block with the cyclic garbage collector off; it is on again once the last block
    that paused it (in any thread) ends, if it was on when the first began.

    The state of thousands of lanes is built from about ten dicts a lane that live until it is
    done; the full collections they set off walk every object of the process (0.25 s in one
    that reads 16,384 lanes), several times a state. A reader's bundle of records (thousands
    of dicts, mapped and collated) sets off collections that walk them again and again. Reference
    counting still frees them; cycles wait for the next collection after the block.
    """
    global _pauses, _was_enabled
    with _lock:
        if not _pauses:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses = max(_pauses - 1, 0)  # 0 already: the block began before a fork (see _forked)
            if not _pauses and _was_enabled:
                gc.enable()


def _forked() -> None:
    """In a child forked while blocks were paused: the collector runs as it did before them
    (threads that paused it are not in the child; the forking thread's block ends unpaused)."""
    global _lock, _pauses
    _lock = threading.RLock()
    if _pauses and _was_enabled:
        gc.enable()
    _pauses = 0


os.register_at_fork(after_in_child=_forked)
