"""Random access into a lane's stream: exact length and the i-th sample, without pointers.

Every allocation decision depends only on counts and every shuffle is a random-access
bijection, so the i-th sample of the mixed, shuffled, multi-pass stream is arithmetic;
``sample_at_reference`` is the readable definition.

1. **Index** — one walk of the lane's schedule (numbers only, in the scheduling kernel)
   records the state before every ``every``-th chunk of the lane and the samples before it:
   ``16 + 32·datasets`` bytes per snapshot, 14 bytes per chunk for three datasets at the
   default ``every=8``; nothing per sample.
2. **Lookup** — one kernel (``_ext/lookup.pyx``, built on first use and kept in
   ``zephon.core.cache`` by config; a pickled index carries none) answers any batch of indices in one call:

   * *bucket*: each index gets its snapshot interval and its chunk there as if every chunk
     were full, by arithmetic (chunks are full but where a redistributing dataset drains;
     past that the interval is found by a galloping search from the guess), and an LSD
     radix sort orders the indices by interval and chunk: O(m), no comparison sort, and no
     sort at all for indices already in order;
   * *walk*: each interval holding indices is walked once from its snapshot, only as far as
     its last index: at most ``every`` chunks, O(every · R · datasets) arithmetic for lane
     ``R`` routing. An index's chunk gives its dataset and rank by the chunk's weighted round
     robin, which depends only on the quotas: a table per distinct quota vector
     (8 bytes per sample of a chunk), cached on the kernel, oldest out first beyond
     ``MAX_SHAPES`` vectors or ``SHAPE_BUDGET`` bytes (the one in use stays even if larger).
     A stream has few distinct vectors (quotas move by one sample between chunks);
   * *pointers*: indices are grouped by dataset and pass, and each group goes through the
     cursor kernel (core.cursor) in one batch, which may first build the pass's tables in
     pass order; the kernel keeps each dataset's current pass layout.

   ``sample_at`` is the same kernel for one index, without arrays.

**Trade-offs.** ``every`` trades index memory for lookup time: a lookup costs up to
``every`` chunk plans, shared by all the indices of a batch that fall in the same interval,
so a batch with about one index per chunk (or more) costs about one plan per index, while
sparse batches and single lookups cost about ``every / 2`` each. A batch takes 32 bytes of
scratch per index besides its ``(m, 3)`` result; the shape cache stays under
``max(SHAPE_BUDGET, one chunk's table)``.

Finite sample-mode streams are indexable. With a fork's allocator the walk runs in Python
over the reference planner and keeps whole states as snapshots (slower, same answers).
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from zephon._ext.layout import PassLayout
from zephon._ext.lookup import Lookup
from zephon.core.cache import memoised, scheduler
from zephon.core.config import REDISTRIBUTE, REPEAT, STOP, SourceConfig
from zephon.core.cursor import epoch_layout, in_pass, pointer_reference, take_at
from zephon.core.readorder import read_order, round_robin_reference
from zephon.core.requeue import past_region, region_samples
from zephon.core.schedule import WALK_STEPS, Ended, SourceState, initial_state, plan_next_reference, state_arrays
from zephon.core.step import step
from zephon.core.tokens import plan_next_tokens
from zephon.limits import MAX_INDEX_CHUNKS

SNAPSHOT_EVERY = 8  # lane chunks between snapshots
_FIRST_CAPACITY = 1024  # snapshots; the index grows by doubling
MAX_SHAPES = 64  # round-robin tables (distinct chunk quota vectors) a Lookup keeps
SHAPE_BUDGET = 32 << 20  # bytes of round-robin tables a Lookup keeps (8 per sample of a chunk)
LOOKUP = "random-access lookup"  # this module's key prefix in zephon.core.cache


def is_finite(config: SourceConfig) -> bool:
    """Whether the stream ends: some dataset stops it, or no dataset repeats without bound."""
    if config.stop_after_passes is not None:
        return True
    if any(d.policy == STOP or (d.policy == REPEAT and d.max_repeats is not None) for d in config.datasets):
        return True
    return not any(d.policy == REPEAT for d in config.datasets)


def supports_indexing(config: SourceConfig) -> bool:
    return not config.token_mode and is_finite(config) and least_chunks(config)[0] <= MAX_INDEX_CHUNKS


def least_chunks(config: SourceConfig) -> tuple[float, int]:
    """A lower bound on the global chunks of a finite stream, and the dataset that sets it.

    The stream ends at the first of: a ``"stop"`` dataset drains, a capped repeat finishes its
    last pass, every dataset finishes ``stop_after_passes`` passes, or (when nothing repeats)
    every dataset drains. A dataset's share only grows as redistributing datasets retire, so
    its share over the non-redistributing datasets bounds how fast it gets there.
    """
    n, cs = config.normalised, config.chunk_size
    staying = sum(w for w, d in zip(n, config.datasets) if d.policy != REDISTRIBUTE) or 1.0
    def chunks(c: int, passes: int) -> float:
        return passes * config.datasets[c].total / (min(1.0, n[c] / staying) * cs)
    enders = [(chunks(c, 1 if d.policy == STOP or d.max_repeats is None else d.max_repeats + 1), c) for c, d in enumerate(config.datasets)
              if d.policy == STOP or (d.policy == REPEAT and d.max_repeats is not None)]
    if config.stop_after_passes is not None:
        enders.append(max((chunks(c, config.stop_after_passes), c) for c in range(len(n))))
    if not any(d.policy == REPEAT for d in config.datasets):
        enders.append((sum(d.total for d in config.datasets) / cs, max(range(len(n)), key=lambda c: config.datasets[c].total)))
    return min(enders) if enders else (math.inf, 0)


def _check_length(config: SourceConfig) -> None:
    """Refuse at once a stream too long to walk, naming the dataset that makes it long."""
    chunks, c = least_chunks(config)
    if chunks > MAX_INDEX_CHUNKS:
        d = config.datasets[c]
        raise ValueError(
            f"this stream is too long to index: it runs at least {chunks:.3g} chunks before dataset {d.name!r} "
            f"(share {config.normalised[c]:.3g} of the mixture, {d.total} samples a pass) lets it end, more than the "
            f"{MAX_INDEX_CHUNKS} (2**28) len() and sample_id_at() walk; raise its weight or chunk_size, or use "
            "fewer passes"
        )


@dataclass(frozen=True, slots=True, eq=False)
class StreamIndex:
    """Snapshots of a lane's stream; see the module docstring for the trade-off."""

    every: int  # lane chunks between snapshots
    ints: np.ndarray  # (m, 2 + 3n) int64: global chunk, samples before, epochs, positions, tails
    acc: np.ndarray  # (m, n) float64: accumulators
    length: int  # samples in the whole stream
    chunks: int  # chunks of the lane in the whole stream
    states: tuple[tuple[int, SourceState], ...] = ()  # (samples before, state) snapshots instead, for a fork's allocator (Python)
    span: Hashable = None  # the part of the lane's stream indexed: None, all of it from its start; else a
    # value naming the part (a phase of a curriculum: its start state and end), part of the lookup's cache key

    @property
    def nbytes(self) -> int:
        return self.ints.nbytes + self.acc.nbytes


def _check_finite(config: SourceConfig) -> None:
    if not is_finite(config):
        raise TypeError(
            "this source repeats forever, so it has no length; set stop_after_passes, max_repeats "
            "or a 'stop' policy to make it finite"
        )


def check_indexable(config: SourceConfig) -> None:
    """Refuse a config whose stream cannot be counted or indexed: token mode, endless, too long."""
    if config.token_mode:
        raise TypeError("a token-aware source has a length but no random access (sample_id_at) yet")
    _check_finite(config)
    _check_length(config)


def _walk(config: SourceConfig, state: SourceState, every: int,
          capacity: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Run the kernel's index walk from ``state`` until the stream ends, growing the arrays.

    The kernel walks ``WALK_STEPS`` dataset-chunks per call, so Ctrl-C is answered between calls.
    """
    n = len(config.datasets)
    acc, epochs, positions, tails = state_arrays(state, n)
    ints, accs = np.empty((capacity, 2 + 3 * n), dtype=np.int64), np.empty((capacity, n), dtype=np.float64)
    g, own, samples, filled = state.chunk_index, 0, 0, 0
    budget = max(1, WALK_STEPS // n)
    kernel = scheduler(config)
    assert kernel is not None  # callers take the Python walk without a kernel
    while True:
        got, g, own, samples, ended = kernel.index(
            g, acc, epochs, positions, tails, own, samples, every, ints[filled:], accs[filled:], budget)
        filled += got
        if ended:
            return ints[:filled], accs[:filled], own, samples
        if filled == len(ints):
            ints = np.concatenate([ints, np.empty_like(ints)])
            accs = np.concatenate([accs, np.empty_like(accs)])


def build_index(config: SourceConfig, every: int = SNAPSHOT_EVERY) -> StreamIndex:
    """Index the lane's stream from its start.

    Raises ``TypeError`` if it is not indexable, and the first-chunk ``ValueError`` of
    ``step`` if the stream cannot start.
    """
    check_indexable(config)
    states: list[tuple[int, SourceState]] = []
    if scheduler(config) is None:
        states, chunks, length = _python_walk(config, initial_state(config), every)
        ints, accs = np.empty((0, 0), dtype=np.int64), np.empty((0, 0))
    else:
        ints, accs, chunks, length = _walk(config, initial_state(config), every, _FIRST_CAPACITY)
    if length == 0:
        step(initial_state(config), config)  # raises the first-chunk error if there is one
    return StreamIndex(every=every, ints=ints.copy(), acc=accs.copy(), length=length, chunks=chunks,
                       states=tuple(states))


def _python_walk(config: SourceConfig, state: SourceState, every: int) -> tuple[list[tuple[int, SourceState]], int, int]:
    """The index walk for a fork's allocator, with the reference planner: slow but the same."""
    states: list[tuple[int, SourceState]] = []
    own, samples = 0, 0
    while True:
        if own % every == 0:
            states.append((samples, state))
        planned = plan_next_reference(state, config)
        if isinstance(planned, Ended):
            return states, own, samples
        own, samples, state = own + 1, samples + sum(planned.quotas), planned.state


def remaining_samples(state: SourceState, config: SourceConfig) -> int:
    """Samples the lane will still produce from ``state`` on (walks the schedule; pure)."""
    if state.requeue:
        return region_samples(state, config) + remaining_samples(past_region(state, config), config)
    if config.token_mode:
        return _token_samples(state, config)
    check_indexable(config)
    if scheduler(config) is None:
        return _python_walk(config, state, 2**62)[2]
    return _walk(config, state, 2**62, 1)[3]


def _token_samples(state: SourceState, config: SourceConfig) -> int:
    """A token-mode lane's samples from ``state`` to the end: its chunks planned one by one, no
    pointers (the first goes through ``step``, which raises if unprimed or unable to start)."""
    _check_finite(config)
    _check_length(config)
    chunk, state = step(state, config)
    if chunk is None:
        return 0
    total = len(chunk)
    while not isinstance(planned := plan_next_tokens(state, config), Ended):
        total, state = total + sum(planned.quotas), planned.state
    return total


def sample_at_reference(config: SourceConfig, i: int) -> tuple[int, int, int]:
    """The ``i``-th sample of the lane's stream in default read order (pure; slow; the definition).

    Walks the reference planner from the start to the chunk holding ``i``, reads the chunk's
    weighted round robin (``round_robin_reference``) and asks ``pointer_reference``. Raises
    ``IndexError`` past the end.
    """
    return _sample_from(config, initial_state(config), 0, i, _draw_reference, pointer_reference)


def _sample_from(config: SourceConfig, state: SourceState, before: int, i: int,
                 draw: Callable[[tuple[int, ...], int], tuple[int, int]],
                 pointer: Callable[[SourceConfig, int, int, int], tuple[int, int, int]]) -> tuple[int, int, int]:
    """Walk the reference planner from ``state`` (``before`` samples into the stream) to sample
    ``i``; ``draw(quotas, offset)`` gives its dataset and rank, ``pointer`` its pointer."""
    while True:
        planned = plan_next_reference(state, config)
        if isinstance(planned, Ended):
            raise IndexError(f"sample index {i} is past the end of the stream ({before} samples)")
        if i < before + sum(planned.quotas):
            break
        before, state = before + sum(planned.quotas), planned.state
    c, rank = draw(planned.quotas, i - before)
    start = planned.starts[c]
    return pointer(config, c, start.epoch, start.position + rank)


def _draw_reference(quotas: tuple[int, ...], offset: int) -> tuple[int, int]:
    """The dataset of step ``offset`` of a chunk's round robin and its rank among that dataset's draws."""
    order = round_robin_reference(quotas)
    return order[offset], order[:offset].count(order[offset])


@lru_cache(maxsize=64)
def round_robin(quotas: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For every step of a chunk's default read order: the dataset it draws from and the rank
    of that draw among the dataset's draws (``quotas`` per dataset, zeros included)."""
    present = np.flatnonzero(quotas)
    counts = [quotas[c] for c in present]
    component, rows = read_order(counts, weighted_random=False, shuffle=False, seed=0)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return present[component], rows - starts[component]


def _draw(quotas: tuple[int, ...], offset: int) -> tuple[int, int]:
    """``_draw_reference`` from the readorder kernel's tables, cached per quota vector."""
    datasets, ranks = round_robin(quotas)
    return int(datasets[offset]), int(ranks[offset])


def _pointer(config: SourceConfig, c: int, epoch: int, position: int) -> tuple[int, int, int]:
    """``pointer_reference`` by the cursor kernel."""
    epoch, position = in_pass(config.datasets[c], epoch, position)
    return tuple(take_at(config, c, epoch, np.array([position], dtype=np.int64))[0].tolist())


def _sample_in_python(index: StreamIndex, config: SourceConfig, i: int) -> tuple[int, int, int]:
    """``sample_at`` for a fork's allocator: the reference planner from the nearest snapshot."""
    before, state = index.states[bisect.bisect_right([b for b, _ in index.states], i) - 1]
    return _sample_from(config, state, before, i, _draw, _pointer)


def lookup(index: StreamIndex, config: SourceConfig) -> Lookup:
    """The random-access kernel of ``index`` (built by ``build_index(config, index.every)``),
    built on first use and kept in :mod:`zephon.core.cache` under ``(config, every, span)``."""
    def build() -> Lookup:
        kernel = scheduler(config)
        assert kernel is not None  # callers answer a fork's allocator in Python
        reshuffle = np.array([d.reshuffle_on_repeat for d in config.datasets], dtype=np.int64)
        return Lookup(kernel, index.ints, index.acc, index.every, index.length, config.chunk_size,
                      reshuffle, _layouts(config), MAX_SHAPES, SHAPE_BUDGET)

    return memoised((LOOKUP, config, index.every, index.span), build)


def _layouts(config: SourceConfig) -> Callable[[int, int], PassLayout]:
    """``(dataset, key epoch) -> PassLayout`` straight from the datasets' shard tables: the
    Lookup keeps the current layout of each dataset, so the plans' memo would only cost time."""
    tables = [epoch_layout(config, c, 0).table for c in range(len(config.datasets))]
    return lambda c, key_epoch: tables[c].layout(key_epoch)


def samples_at(index: StreamIndex, config: SourceConfig, indices: np.ndarray) -> np.ndarray:
    """The samples at ``indices`` (any order, repeats allowed, all inside the stream) as an
    ``(n, 3)`` int64 array. Pure apart from the kernel cache; ``Lookup`` does the work."""
    if scheduler(config) is None:
        return np.array([_sample_in_python(index, config, int(i)) for i in indices], dtype=np.int64).reshape(-1, 3)
    out = np.empty((len(indices), 3), dtype=np.int64)
    lookup(index, config).samples_at(np.ascontiguousarray(indices, dtype=np.int64), out)
    return out


def sample_at(index: StreamIndex, config: SourceConfig, i: int) -> tuple[int, int, int]:
    """The ``i``-th sample of the lane's stream in default read order (``samples_at`` for one)."""
    if scheduler(config) is None:
        return _sample_in_python(index, config, i)
    return lookup(index, config).sample_at(i)
