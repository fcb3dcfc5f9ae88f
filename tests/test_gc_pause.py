"""paused_gc: the collector is off while any block (in any thread) is inside, back on after the
last, and on in a child forked while another thread was inside."""
from __future__ import annotations

import gc
import os
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.runtime import paused_gc


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_overlapping_pauses_in_threads_restore_the_collector_after_the_last(turns):
    """Four threads enter and leave in a drawn interleaving (a thread's first turn enters, its
    second leaves); the collector is off exactly while one of them is inside."""
    assert gc.isenabled()
    entered, leave = [threading.Event() for _ in range(4)], [threading.Event() for _ in range(4)]

    def block(k: int) -> None:
        with paused_gc():
            entered[k].set()
            leave[k].wait()

    threads = [threading.Thread(target=block, args=(k,), daemon=True) for k in range(4)]
    inside: set[int] = set()
    try:
        for k in turns:
            if not entered[k].is_set():
                threads[k].start()
                entered[k].wait()
                inside.add(k)
            elif k in inside:
                leave[k].set()
                threads[k].join()
                inside.discard(k)
            assert gc.isenabled() == (not inside)
    finally:  # every thread leaves, whatever failed
        for k in inside:
            leave[k].set()
            threads[k].join()
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_child_forked_during_another_threads_pause_collects():
    inside, leave = threading.Event(), threading.Event()

    def block() -> None:
        with paused_gc():
            inside.set()
            leave.wait()

    thread = threading.Thread(target=block, daemon=True)
    thread.start()
    inside.wait()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the pausing thread is not here
        with paused_gc():
            paused = not gc.isenabled()
        os.write(write, b"%d%d" % (gc.isenabled(), paused))
        os._exit(0)
    os.close(write)
    answer = os.read(read, 2)
    os.waitpid(pid, 0)
    leave.set()
    thread.join()
    assert answer == b"11"  # on after fork, off inside a pause of its own, on again after it
    assert gc.isenabled()
