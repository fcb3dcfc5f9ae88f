"""Elastic resume: stop a job on one topology, resume it on another, and check every lane.

A job reads ``canonical_replicas`` lanes with ``world_size`` ranks of ``num_workers`` readers
each (``0``: the rank's main process reads), exactly as ``zephon.torch.DataLoader`` places
them; each reader reads its lanes round robin (``zephon.runtime``). The first job hands out
``cut`` samples, reader after reader, as a loader cycles its workers; every rank's ledger
is turned into a loader state and the states are merged into one global checkpoint, as a
trainer does; the second job restores it on its own topology and reads to the end. Then,
lane by lane, what the two jobs read must be the lane's uninterrupted stream: nothing lost,
nothing read twice.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from zephon.runtime import (MAPPINGS, DatasetRecord, Entry, LaneMux, LoaderStateDict, Segment, Tracker, initial_entries,
                            make_state, merge_states, parse_state, rank_lanes, run_fingerprint, worker_lanes)
from zephon.testing._assertions import Pointer, SourceFactory
from zephon.testing._streams import as_source, read_order
from zephon.work import WorkSource


def _check_topology(name: str, topology: Any) -> tuple[int, int, str]:
    try:
        world, workers, mapping = topology
    except (TypeError, ValueError):
        raise ValueError(f"{name}={topology!r} must be (world_size, num_workers, mapping), "
                         "e.g. (2, 1, 'contiguous')") from None
    if type(world) is not int or world < 1 or type(workers) is not int or workers < 0 or mapping not in MAPPINGS:
        raise ValueError(f"{name}={topology!r} needs world_size >= 1, num_workers >= 0 and a mapping in "
                         f"{list(MAPPINGS)}")
    return world, workers, mapping


def _readers(replicas: int, topology: tuple[int, int, str]) -> list[tuple[int, list[int]]]:
    """``(rank, lanes)`` of every reader that owns lanes, rank by rank, worker by worker."""
    world, workers, mapping = topology
    out = []
    for rank in range(world):
        lanes = rank_lanes(replicas, rank, world, mapping)
        for worker in range(max(1, workers)):
            mine = worker_lanes(lanes, worker, max(1, workers), mapping)
            if mine:
                out.append((rank, mine))
    return out


class _Reader:
    """One reader's round-robin stream, with the lane of every sample and its exact ledger."""

    def __init__(self, template: WorkSource, lanes: Sequence[int], replicas: int, entries: Mapping[int, Entry]):
        self._mux = LaneMux(template, lanes, replicas, entries, template.component_ids())
        self._tracker = Tracker({lane: entries[lane] for lane in lanes}, template, replicas)
        self._segments: list[Segment] = []
        self.position = 0

    def take(self, n: int) -> list[tuple[int, Pointer]]:
        """The next ``n`` samples (fewer at the end) as ``(lane, pointer)``."""
        pointers, _, _ = self._mux.take(n)
        segments, events = self._mux.drain()
        self._tracker.extend(segments, events)
        self._segments.extend(segments)
        out = []
        for k, pointer in enumerate(pointers.tolist()):
            at = self.position + k
            segment = next(s for s in reversed(self._segments) if s.start <= at)
            out.append((segment.lane_at(at), tuple(pointer)))
        self.position += len(out)
        return out

    def entries(self) -> dict[int, Entry]:
        return self._tracker.entries_at(self.position)


def _lane_streams(template: WorkSource, replicas: int) -> dict[int, tuple[list[Pointer], list[int]]]:
    """Every lane's uninterrupted stream in read order, with the lane chunk of each sample."""
    out = {}
    for lane in range(replicas):
        source, pointers, chunk_of = template.clone_for_lane(lane, replicas), [], []
        k = 0
        while (chunk := source.next_chunk()) is not None:
            ids, _ = read_order(chunk)
            pointers.extend(ids)
            chunk_of.extend([k] * len(ids))
            k += 1
        out[lane] = (pointers, chunk_of)
    return out


def _global_checkpoint(readers: list[tuple[int, _Reader]], replicas: int, template: WorkSource,
                       topology: tuple[int, int, str]) -> LoaderStateDict:
    """Each rank's loader state from its readers' ledgers, merged, through JSON."""
    datasets: list[DatasetRecord] = [{"id": i, "name": d.name, "fingerprint": None}
                                     for i, d in sorted(template.datasets_by_id.items())]
    world, workers, mapping = topology
    ranks: dict[int, dict[int, Entry]] = {}
    for rank, reader in readers:
        ranks.setdefault(rank, {}).update(reader.entries())
    run = run_fingerprint(template, replicas, datasets)
    states = [make_state(replicas, entries, datasets, {"world_size": world, "ranks": [rank], "mapping": mapping,
                                                       "num_workers": workers}, run=run)
              for rank, entries in sorted(ranks.items())]
    merged: LoaderStateDict = json.loads(json.dumps(merge_states(states)))
    return merged


def assert_elastic_resume_equivalent(factory: SourceFactory, first: Any, cut: int, second: Any, *,
                                     canonical_replicas: int | None = None) -> None:
    """A job stopped after ``cut`` samples on topology ``first`` and resumed on ``second`` reads
    every lane exactly: each lane's samples, first job then second, are its uninterrupted stream.

    Parameters
    ----------
    factory : callable
        ``factory()`` returns a fresh template source or a pipeline over one (finite).
    first, second : tuple
        ``(world_size, num_workers, mapping)`` of the two jobs (see ``loader_topologies()``);
        ``num_workers=0`` means each rank's main process reads.
    cut : int
        Samples the first job hands out before its checkpoint, one per reader in turn (past
        the end of the stream: all of them).
    canonical_replicas : int or None, default None
        The number of lanes, fixed for the run; None takes the larger reader count of the
        two topologies.

    Raises
    ------
    AssertionError
        Naming the lane, its chunk and position, and the expected and read pointers; or the
        samples a lane lost or read twice.
    """
    first, second = _check_topology("first", first), _check_topology("second", second)
    if type(cut) is not int or cut < 0:
        raise ValueError(f"cut={cut!r} must be an int >= 0 (samples read before the checkpoint)")
    replicas = canonical_replicas or max(t[0] * max(1, t[1]) for t in (first, second))
    template = as_source(factory())
    read: dict[int, list[Pointer]] = {lane: [] for lane in range(replicas)}
    placed = _readers(replicas, first)
    start = initial_entries(template, range(replicas), replicas)
    readers = [(rank, _Reader(template, lanes, replicas, start)) for rank, lanes in placed]
    handed, live = 0, list(readers)
    while handed < cut and live:
        for pair in list(live):
            if handed == cut:
                break
            got = pair[1].take(1)
            if not got:
                live.remove(pair)
                continue
            read[got[0][0]].append(got[0][1])
            handed += 1
    resumed = parse_state(_global_checkpoint(readers, replicas, template, first))
    missing = [lane for lane in range(replicas) if lane not in resumed.entries]
    if missing:
        raise AssertionError(f"the merged checkpoint of topology {first} lacks lanes {missing}")
    resuming = as_source(factory())
    for lane in range(replicas):  # what a loader checks of each lane's state when it loads it
        resuming.clone_for_lane(lane, replicas).load_state_dict(resumed.entries[lane][0])
    for _, lanes in _readers(replicas, second):
        for lane, pointer in _Reader(resuming, lanes, replicas, resumed.entries).take(2**62):
            read[lane].append(pointer)
    _compare_lanes(_lane_streams(as_source(factory()), replicas), read, first, cut, second, replicas)


def _compare_lanes(expected: dict[int, tuple[list[Pointer], list[int]]], read: dict[int, list[Pointer]],
                   first: tuple[int, int, str], cut: int, second: tuple[int, int, str], replicas: int) -> None:
    for lane, (want, chunk_of) in expected.items():
        got = read[lane]
        at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        story = f"lane {lane} of {replicas} (stopped after {cut} samples on {first}, resumed on {second})"
        if at is not None:
            start = chunk_of.index(chunk_of[at])
            raise AssertionError(f"{story} parts from its stream at chunk {chunk_of[at]}, position {at - start} "
                                 f"(sample {at} of the lane): expected {want[at]}, read {got[at]}")
        if len(got) < len(want):
            raise AssertionError(f"{story} lost {len(want) - len(got)} samples, from {want[len(got)]} on "
                                 f"(chunk {chunk_of[len(got)]})")
        if len(got) > len(want):
            raise AssertionError(f"{story} read {len(got) - len(want)} samples more than its stream holds, "
                                 f"from {got[len(want)]} on")
