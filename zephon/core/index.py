"""Random access into a lane's stream: exact length and the i-th sample, without pointers.

Every allocation decision depends only on counts and every shuffle is a random-access
bijection, so the i-th sample of the mixed, shuffled, multi-pass stream is arithmetic:

1. **Index** — one walk of the lane's schedule (numbers only, in the scheduling kernel)
   records the state before every ``every``-th chunk of the lane and the samples before it:
   ``16 + 24·datasets`` bytes per snapshot, about 11 bytes per chunk for three datasets at
   the default ``every=8``; nothing per sample. A lookup walks at most ``every − 1`` chunks
   of the lane from the nearest snapshot (O(every · R · datasets) arithmetic for lane ``R``
   routing), so ``every`` trades index memory for lookup time.
2. **Chunk** — the chunk's quotas give its weighted-round-robin order (SPEC §6), which depends
   only on the counts; it is computed once per distinct count vector and cached.
3. **Pointer** — the position in the dataset's pass goes through the cursor (core.cursor).

Finite sample-mode streams are indexable. With a fork's allocator the same walk runs in Python
over the reference planner and keeps whole states as snapshots (slower, same answers).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from zephon.core.config import REPEAT, STOP, SourceConfig
from zephon.core.cursor import take, take_at
from zephon.core.readorder import read_order
from zephon.core.schedule import Ended, SourceState, initial_state, plan_next_reference, state_arrays
from zephon.core.step import step

SNAPSHOT_EVERY = 8  # lane chunks between snapshots
_FIRST_CAPACITY = 1024  # snapshots; the index grows by doubling


def is_finite(config: SourceConfig) -> bool:
    """Whether the stream ends: some dataset stops it, or no dataset repeats without bound."""
    if config.stop_after_passes is not None:
        return True
    if any(d.policy == STOP or (d.policy == REPEAT and d.max_repeats is not None) for d in config.datasets):
        return True
    return not any(d.policy == REPEAT for d in config.datasets)


def supports_indexing(config: SourceConfig) -> bool:
    return not config.token_mode and is_finite(config)


@dataclass(frozen=True, slots=True, eq=False)
class StreamIndex:
    """Snapshots of a lane's stream; see the module docstring for the trade-off."""

    every: int  # lane chunks between snapshots
    ints: np.ndarray  # (m, 2 + 2n) int64: global chunk, samples before, epochs, positions
    acc: np.ndarray  # (m, n) float64: accumulators
    length: int  # samples in the whole stream
    chunks: int  # chunks of the lane in the whole stream
    states: tuple = ()  # (samples before, state) snapshots instead, for a fork's allocator (Python)

    @property
    def nbytes(self) -> int:
        return self.ints.nbytes + self.acc.nbytes


def _check_finite(config: SourceConfig) -> None:
    if not is_finite(config):
        raise TypeError(
            "this source repeats forever, so it has no length; set stop_after_passes, max_repeats "
            "or a 'stop' policy to make it finite"
        )


def _check_indexable(config: SourceConfig) -> None:
    if config.token_mode:
        raise TypeError("a token-aware source has a length but no random access (sample_id_at) yet")
    _check_finite(config)


def _walk(config: SourceConfig, state: SourceState, every: int, capacity: int):
    """Run the kernel's index walk from ``state`` until the stream ends, growing the arrays."""
    n = len(config.datasets)
    acc, epochs, positions = state_arrays(state, n)
    ints, accs = np.empty((capacity, 2 + 2 * n), dtype=np.int64), np.empty((capacity, n), dtype=np.float64)
    g, own, samples, filled = state.chunk_index, 0, 0, 0
    while True:
        got, g, own, samples, ended = config.scheduler.index(
            g, acc, epochs, positions, own, samples, every, ints[filled:], accs[filled:])
        filled += got
        if ended:
            return ints[:filled], accs[:filled], own, samples
        ints = np.concatenate([ints, np.empty_like(ints)])
        accs = np.concatenate([accs, np.empty_like(accs)])


def build_index(config: SourceConfig, every: int = SNAPSHOT_EVERY) -> StreamIndex:
    """Index the lane's stream from its start.

    Raises ``TypeError`` if it is not indexable, and the first-chunk ``ValueError`` of
    ``step`` if the stream cannot start.
    """
    _check_indexable(config)
    if config.scheduler is None:
        states, chunks, length = _python_walk(config, initial_state(config), every)
        ints, accs = np.empty((0, 0), dtype=np.int64), np.empty((0, 0))
    else:
        states, (ints, accs, chunks, length) = (), _walk(config, initial_state(config), every, _FIRST_CAPACITY)
    if length == 0:
        step(initial_state(config), config)  # raises the first-chunk error if there is one
    return StreamIndex(every=every, ints=ints.copy(), acc=accs.copy(), length=length, chunks=chunks,
                       states=tuple(states))


def _python_walk(config: SourceConfig, state: SourceState, every: int) -> tuple[list, int, int]:
    """The index walk for a fork's allocator, with the reference planner: slow but the same."""
    states, own, samples = [], 0, 0
    while True:
        if own % every == 0:
            states.append((samples, state))
        planned = plan_next_reference(state, config)
        if isinstance(planned, Ended):
            return states, own, samples
        own, samples, state = own + 1, samples + sum(planned.quotas), planned.state


def remaining_samples(state: SourceState, config: SourceConfig) -> int:
    """Samples the lane will still produce from ``state`` on (walks the schedule; pure)."""
    if config.token_mode:
        return _token_samples(state, config)
    _check_indexable(config)
    if config.scheduler is None:
        return _python_walk(config, state, 2**62)[2]
    return _walk(config, state, 2**62, 1)[3]


def _token_samples(state: SourceState, config: SourceConfig) -> int:
    """A token-mode lane's samples from ``state`` to the end: its chunks planned one by one."""
    _check_finite(config)
    total = 0
    while True:
        chunk, state = step(state, config)
        if chunk is None:
            return total
        total += len(chunk)


@lru_cache(maxsize=64)
def _round_robin(quotas: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For every step of a chunk's default read order: the dataset it draws from and the rank
    of that draw among the dataset's draws (``quotas`` per dataset, zeros included)."""
    present = np.flatnonzero(quotas)
    counts = [quotas[c] for c in present]
    component, rows = read_order(counts, weighted_random=False, shuffle=False, seed=0)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return present[component], rows - starts[component]


def _plans(index: StreamIndex, config: SourceConfig, targets: np.ndarray):
    """Quotas, start epochs, start positions and in-chunk offsets of ascending ``targets``."""
    m, n = len(targets), len(config.datasets)
    quotas, epochs, positions = (np.empty((m, n), dtype=np.int64) for _ in range(3))
    offsets = np.empty(m, dtype=np.int64)
    config.scheduler.locate_many(index.ints, index.acc, targets, quotas, epochs, positions, offsets)
    return quotas, epochs, positions, offsets


def _groups(keys: np.ndarray) -> list[np.ndarray]:
    """Row indices grouped by equal ``keys`` (one sort, no per-group scans)."""
    order = np.argsort(keys)
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    return np.split(order, bounds)


def _pass_groups(dataset: np.ndarray, epoch: np.ndarray) -> list[np.ndarray]:
    """Rows grouped by (dataset, pass). Rows follow the stream, so within a dataset the passes
    never go back: a stable radix sort by dataset alone puts every pass in one run."""
    order = np.argsort(dataset.astype(np.int16 if dataset.max(initial=0) < 2**15 else np.int64), kind="stable")
    d, e = dataset[order], epoch[order]
    return np.split(order, np.flatnonzero((np.diff(d) != 0) | (np.diff(e) != 0)) + 1)


def _shape_keys(quotas: np.ndarray) -> np.ndarray:
    """One int64 per quota row, equal for equal rows (rows are checked again when used)."""
    mix = np.array([0x9E3779B97F4A7C15 * (c + 1) % 2**63 | 1 for c in range(quotas.shape[1])], dtype=np.int64)
    with np.errstate(over="ignore"):
        return (quotas * mix).sum(axis=1)


def _draws(quotas: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each target: the dataset it is drawn from and its rank among that dataset's draws."""
    dataset, rank = np.empty(len(offsets), dtype=np.int64), np.empty(len(offsets), dtype=np.int64)
    for rows in _groups(_shape_keys(quotas)):
        shapes = quotas[rows[:1]]
        if not (quotas[rows] == shapes).all():  # two shapes share a key: rare, sort them apart
            shapes = np.unique(quotas[rows], axis=0)
        for shape in shapes:
            same = rows[(quotas[rows] == shape).all(axis=1)]
            datasets, ranks = _round_robin(tuple(shape.tolist()))
            dataset[same] = datasets[offsets[same]]
            rank[same] = ranks[offsets[same]]
    return dataset, rank


def samples_at(index: StreamIndex, config: SourceConfig, indices: np.ndarray) -> np.ndarray:
    """The samples at ``indices`` (any order, repeats allowed) as an ``(n, 3)`` int64 array.

    Pure. Targets are sorted so the schedule is walked forward once per snapshot interval;
    pointers are computed per (dataset, pass) group by the cursor kernel.
    """
    if len(indices) == 0 or config.scheduler is None:
        return np.array([sample_at(index, config, int(i)) for i in indices], dtype=np.int64).reshape(-1, 3)
    order = np.argsort(indices)
    quotas, epochs, positions, offsets = _plans(index, config, np.ascontiguousarray(indices[order]))
    dataset, rank = _draws(quotas, offsets)
    rows = np.arange(len(order))
    epoch, position = epochs[rows, dataset], positions[rows, dataset] + rank
    pointers = np.empty((len(order), 3), dtype=np.int64)
    for members in _pass_groups(dataset, epoch):
        c, e = int(dataset[members[0]]), int(epoch[members[0]])
        pointers[members] = take_at(config, c, e, position[members])
    result = np.empty_like(pointers)
    result[order] = pointers
    return result


def _locate_in_python(index: StreamIndex, config: SourceConfig, i: int, plan: np.ndarray) -> int:
    """``locate_one`` for a fork's allocator: walk the reference planner from the snapshot."""
    before, state = index.states[bisect.bisect_right([b for b, _ in index.states], i) - 1]
    while True:
        planned = plan_next_reference(state, config)
        if i < before + sum(planned.quotas):
            plan[:] = [planned.quotas, [c.epoch for c in planned.starts], [c.position for c in planned.starts]]
            return i - before
        before, state = before + sum(planned.quotas), planned.state


def sample_at(index: StreamIndex, config: SourceConfig, i: int) -> tuple[int, int, int]:
    """The ``i``-th sample of the lane's stream in default read order (``samples_at`` for one)."""
    plan = np.empty((3, len(config.datasets)), dtype=np.int64)
    if config.scheduler is None:
        offset = _locate_in_python(index, config, i, plan)
    else:
        offset = config.scheduler.locate_one(index.ints, index.acc, i, plan)
    quotas, epochs, positions = plan.tolist()
    datasets, ranks = _round_robin(tuple(quotas))
    c = int(datasets[offset])
    pointer = np.empty((1, 3), dtype=np.int64)
    take(pointer, 0, config, c, epochs[c], positions[c] + int(ranks[offset]), 1)
    return tuple(pointer[0].tolist())
