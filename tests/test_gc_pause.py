"""paused_gc: the collector is off while any block (in any thread) is inside, back on after the
last, and on in a child forked while another thread was inside."""
from __future__ import annotations

import gc
import os
import threading

from helpers import three_datasets
from hypothesis import given, settings
from hypothesis import strategies as st

import zephon.runtime._book as book_module
import zephon.runtime._state as state_module
from zephon import Pipeline, StaticMixtureWorkSource
from zephon.runtime import LaneBook, LaneMux, initial_entries, make_state, merge_states, paused_gc
from zephon.runtime._even import lanes_remaining
from zephon.runtime._state import dataset_fingerprints


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


def test_the_states_of_many_lanes_are_built_with_the_collector_paused(monkeypatch):
    """Restoring a reader's lanes, making their first states, counting them, loading a state,
    checking another rank's lanes and merging ranks' states build thousands of long-lived
    objects: the collector is off while they are made."""
    seen: dict[str, list[bool]] = {}

    def watched(owner, name):
        original = getattr(owner, name)

        def call(*args, **kwargs):
            seen.setdefault(name, []).append(gc.isenabled())
            return original(*args, **kwargs)
        monkeypatch.setattr(owner, name, call)

    for name in ("state_dict", "restore_checked", "remaining_by_lane"):
        watched(StaticMixtureWorkSource, name)
    watched(state_module, "parse_state")
    watched(book_module, "parse_state")
    watched(book_module, "_all_restore")  # the column check of the lanes a book hands out
    source = StaticMixtureWorkSource(three_datasets(), {"web": 3, "code": 2, "math": 1}, chunk_size=8, seed=3)
    entries = initial_entries(source, range(4), 4)
    LaneMux(source, range(4), 4, entries, source.component_ids())
    lanes_remaining(source, 4, entries)
    made = make_state(4, entries, dataset_fingerprints(source.datasets_by_id), {})
    merge_states([made, made])
    book = LaneBook(Pipeline(source), canonical_replicas=4, mapping="contiguous", rank=0, world_size=2)
    book.load(made)
    book.entries(range(4))  # the other rank's lanes are checked now
    assert sorted(seen) == ["_all_restore", "parse_state", "remaining_by_lane", "restore_checked", "state_dict"]
    assert len(seen["parse_state"]) == 3 and len(seen["_all_restore"]) == 2  # on load, then the other rank's lanes
    assert not any(flag for flags in seen.values() for flag in flags) and gc.isenabled()
