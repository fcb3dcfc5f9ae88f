"""Replay and lane-partition assertions for any WorkSource.

Checkpoints are tested Grain's way: save the state before every chunk, restore each saved
state into a *fresh* source (through a JSON round trip), and compare the rest of the stream
with the uninterrupted run.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterable

from zephon.core.chunk import WorkChunk
from zephon.core.schedule import lane_of
from zephon.work.source import WorkSource

SourceFactory = Callable[[], WorkSource]


def collect(source: WorkSource, max_chunks: int = 1000) -> list[WorkChunk]:
    """The source's chunks until it ends, or ``max_chunks`` of them."""
    chunks: list[WorkChunk] = []
    while len(chunks) < max_chunks:
        chunk = source.next_chunk()
        if chunk is None:
            break
        chunks.append(chunk)
    return chunks


def assert_replay_equivalent(factory: SourceFactory, cuts: Iterable[int], *, max_chunks: int = 1000) -> None:
    """Restoring the checkpoint taken before chunk ``c`` replays exactly the rest, for every cut.

    ``factory()`` must return a fresh source bound to a lane. Cuts past the end of the stream
    are taken at the end (where the restored source must return None).
    """
    source = factory()
    states: list[dict[str, Any]] = []
    chunks: list[WorkChunk | None] = []
    ended = False
    while len(chunks) < max_chunks and not ended:
        states.append(json.loads(json.dumps(source.state_dict())))
        chunk = source.next_chunk()
        ended = chunk is None
        if not ended:
            chunks.append(chunk)
    for cut in cuts:
        cut = min(cut, len(states) - 1)
        fresh = factory()
        fresh.load_state_dict(states[cut])
        replay = collect(fresh, len(chunks) - cut + (1 if ended else 0))
        if replay != chunks[cut:]:
            first = next((i for i, (a, b) in enumerate(zip(replay, chunks[cut:])) if a != b), min(len(replay), len(chunks) - cut))
            raise AssertionError(
                f"restoring the checkpoint taken before chunk {cut} diverges at chunk {cut + first}: "
                f"{len(replay)} chunks replayed, {len(chunks) - cut} expected"
            )


def _owner_of(template: WorkSource, replicas: int) -> Callable[[int], int] | None:
    """The routing function of a StaticMixtureWorkSource, or None for other sources."""
    config = getattr(template, "config", None)
    if config is None:
        return None
    bound = dataclasses.replace(config, lane=0, canonical_replicas=replicas)
    return lambda g: lane_of(bound, g)


def assert_lanes_partition(factory: SourceFactory, replicas: int, *, max_chunks: int = 1000) -> None:
    """The lanes' streams are disjoint and, merged in global chunk order, equal lane 0 of 1.

    ``factory()`` must return a fresh *template*. The merge takes, for each chunk of the
    single-lane stream, the next chunk of the lane that owns it (by the source's routing when
    it exposes ``config``, else any lane whose next chunk matches); a mismatch, or chunks left
    over on any lane, fail the assertion.
    """
    single = collect(factory().clone_for_lane(0, 1), max_chunks)
    template = factory()
    lanes = [collect(template.clone_for_lane(lane, replicas), max_chunks) for lane in range(replicas)]
    owner = _owner_of(template, replicas)
    taken = [0] * replicas
    for g, chunk in enumerate(single):
        candidates = [owner(g)] if owner else range(replicas)
        owners = [lane for lane in candidates if taken[lane] < len(lanes[lane]) and lanes[lane][taken[lane]] == chunk]
        if not owners:
            raise AssertionError(f"global chunk {g} of the single-lane stream is not the next chunk of its lane (of {replicas})")
        taken[owners[0]] += 1
    left = {lane: len(lanes[lane]) - taken[lane] for lane in range(replicas) if taken[lane] < len(lanes[lane])}
    if left and len(single) < max_chunks:
        raise AssertionError(f"lanes hold chunks the single-lane stream does not: {left}")
