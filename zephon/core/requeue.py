"""Re-serving samples first: the requeue region at the start of a migrated stream.

A migration with ``requeue=True`` puts the samples that were assigned but not read into the
state: ranges ``(dataset, pass, start, stop)`` of positions, sorted by dataset, pass and
position. They are served before the new schedule, as global chunks ``0 .. K-1`` of
``chunk_size`` pointers each (the last one shorter), which the lanes share by the usual
routing; the schedule proper starts at global chunk ``K``. The region is part of the state
only until the lane has passed it, so a checkpoint stays small: at most a few ranges per
lane of the old run, and nothing once the region is behind.
"""
from __future__ import annotations

import dataclasses
from math import ceil

import numpy as np

from zephon.core.chunk import WorkChunk
from zephon.core.config import SourceConfig
from zephon.core.cursor import take
from zephon.core.keys import derive
from zephon.core.schedule import SourceState, lane_of

Requeued = tuple[int, int, int, int]  # (dataset, pass, start, stop)


def region_chunks(requeue: tuple[Requeued, ...], chunk_size: int) -> int:
    """``K``: the global chunks the requeue region takes."""
    return ceil(sum(stop - start for _, _, start, stop in requeue) / chunk_size)


def _own_chunk(config: SourceConfig, g: int, end: int) -> int | None:
    """The lane's first chunk in ``[g, end)``, or None."""
    lane, _ = config.lane_binding
    for h in range(g, end):
        if lane_of(config, h) == lane:
            return h
    return None


def requeue_chunk(config: SourceConfig, requeue: tuple[Requeued, ...], g: int) -> WorkChunk:
    """Global chunk ``g`` of the region: its slice of the ranges, grouped by dataset."""
    first, last = g * config.chunk_size, (g + 1) * config.chunk_size
    pieces, offset = [], 0
    for c, epoch, start, stop in requeue:
        lo, hi = max(first, offset), min(last, offset + stop - start)
        if lo < hi:
            pieces.append((c, epoch, start + lo - offset, hi - lo))
        offset += stop - start
    pointers = np.empty((sum(p[3] for p in pieces), 3), dtype=np.int64)
    names: list[str] = []
    counts: list[int] = []
    row = 0
    for c, epoch, position, count in pieces:
        take(pointers, row, config, c, epoch, position, count)
        row += count
        if names and names[-1] == config.datasets[c].name:
            counts[-1] += count
        else:
            names.append(config.datasets[c].name)
            counts.append(count)
    return WorkChunk.from_buffer(names, pointers, counts, seed=derive(config.chunk_key, g) >> 1)


def step_region(state: SourceState, config: SourceConfig) -> tuple[WorkChunk | None, SourceState]:
    """The lane's next chunk of the region, or ``(None, state past the region)`` when it has none left."""
    end = region_chunks(state.requeue, config.chunk_size)
    g = _own_chunk(config, state.chunk_index, end)
    if g is None:
        return None, past_region(state, config)
    return requeue_chunk(config, state.requeue, g), dataclasses.replace(state, chunk_index=g + 1)


def past_region(state: SourceState, config: SourceConfig) -> SourceState:
    """The state where the schedule proper starts (the region behind, dropped from the state)."""
    end = region_chunks(state.requeue, config.chunk_size)
    return dataclasses.replace(state, chunk_index=max(state.chunk_index, end), requeue=())


def region_samples(state: SourceState, config: SourceConfig) -> int:
    """Samples of the region the lane will still serve from ``state``."""
    end = region_chunks(state.requeue, config.chunk_size)
    total = sum(stop - start for _, _, start, stop in state.requeue)
    lane, _ = config.lane_binding
    return sum(min(config.chunk_size, total - h * config.chunk_size)
               for h in range(state.chunk_index, end) if lane_of(config, h) == lane)
