"""The pure step of a mixture source: ``step(state, config) -> (chunk | None, state')``."""
from __future__ import annotations

from collections import deque
from typing import Callable, Protocol, TypeVar

import numpy as np

from zephon.core.alloc import AccumulatorAllocator, FixedAllocator
from zephon.core.cache import derived_table
from zephon.core.chunk import WorkChunk
from zephon.core.config import CARRY, REDISTRIBUTE, REPEAT, DatasetPlan, SourceConfig
from zephon.core.cursor import take
from zephon.core.keys import derive
from zephon.core.requeue import step_region
from zephon.core.schedule import CursorState, Ended, Planned, SourceState, active_weights, can_carry, plan_next
from zephon.core.tokens import plan_next_tokens, plan_token_chunk_once


class _Positioned(Protocol):
    @property
    def chunk_index(self) -> int: ...


S = TypeVar("S", bound=_Positioned)


def step(state: SourceState, config: SourceConfig) -> tuple[WorkChunk | None, SourceState]:
    """Advance ``state`` by one chunk of the config's lane.

    Parameters: ``state``, where the lane stands; ``config``, the resolved source.
    Returns ``(chunk, state')``: the lane's next chunk and the state after it, or
    ``(None, state)`` once the stream has ended (END changes nothing, so it repeats).
    Raises ``ValueError`` naming the dataset if global chunk 0 of a stream from its start
    cannot be produced.

    Pure: equal inputs give equal outputs, and the arguments are never mutated.

    **Compatibility**: for a given config the chunks are frozen across versions of the same
    checkpoint version (``zephon.core.checkpoint.VERSION``); tests pin their digests.
    """
    if not config.primed:
        raise RuntimeError("this token-aware source is not primed yet: call prime() before reading from it")
    before = state
    if state.requeue:
        chunk, state = step_region(state, config)
        if chunk is not None:
            return chunk, state
    planned = plan_next_tokens(state, config) if config.token_mode else plan_next(state, config)
    if isinstance(planned, Ended):
        if planned.chunk_index == 0 and at_start(state):
            raise ValueError(first_chunk_error(config, planned))
        return None, before
    return materialize(planned, config), planned.state


def stream_end(state: SourceState, config: SourceConfig) -> tuple[SourceState, int | None]:
    """Where the whole stream (every lane's chunks) stands at its end, and the dataset that ends
    it (None: every dataset is done, or none is active), from a lane's state: the chunks after
    it planned on numbers (from a lane's end, fewer than two rounds of lanes), the walk's last
    states kept in the config's ``derived`` table, which its lanes share (see :func:`walk_to_end`)."""
    whole = config.for_lane(0, 1)
    planner = plan_next_tokens if config.token_mode else plan_next

    def following(state: SourceState) -> SourceState | Ended:
        planned = planner(state, whole)
        return planned if isinstance(planned, Ended) else planned.state

    known = derived_table(config, _ENDS)
    return walk_to_end(state, following, known, 2 * config.lane_binding[1] + 1)


_ENDS = "stream ends"  # a config's derived key: walk_to_end's memo


def walk_to_end(state: S, following: Callable[[S], S | Ended], known: dict[int, tuple[S, tuple[S, int | None]]],
                keep: int) -> tuple[S, int | None]:
    """The last state of the stream that ``following`` steps ``state`` through (the state after
    a chunk, or the stream's ``Ended``), and the dataset that ended it. ``known`` keeps the last
    ``keep`` states of each walk (by chunk index) with that end, and a walk that reaches one of
    them, equal, takes its end from there: the lanes of one process, ending a chunk or a few
    apart, each walked up to two rounds of every lane's chunks to the end (at 1,024 lanes, 20 s
    in all; at 16,384, hours), where they now walk to another's walk."""
    walked: deque[S] = deque(maxlen=keep)
    while True:
        seen = known.get(state.chunk_index)
        if seen is not None and seen[0] == state:
            end = seen[1]
            break
        walked.append(state)
        after = following(state)
        if isinstance(after, Ended):
            end = (state, after.dataset)
            break
        state = after
    if len(known) > max(4 * keep, 4096):  # walks from states of other streams (a loaded state's) need not pile up
        known.clear()
    known.update((s.chunk_index, (s, end)) for s in walked)
    return end


def materialize(planned: Planned, config: SourceConfig, following: SourceConfig | None = None,
                after: SourceState | None = None) -> WorkChunk:
    """Write the pointers of a planned chunk into one ``(n, 3)`` buffer and wrap it.

    ``following`` and ``after``: the config and the state the next global chunk is planned
    from (default: ``config`` and the planned state; a curriculum's next phase differs), which
    say which capped datasets cannot supply their next quota (``source_exhausted``).
    """
    pointers = np.empty((sum(planned.quotas), 3), dtype=np.int64)
    names, counts, row = [], [], 0
    for c, (quota, start) in enumerate(zip(planned.quotas, planned.starts)):
        if quota:
            take(pointers, row, config, c, start.epoch, start.position, quota)
            names.append(config.datasets[c].name)
            counts.append(quota)
            row += quota
    target = None
    if config.token_mode or any(d.policy == REDISTRIBUTE for d in config.datasets):
        target = {d.name: w for d, w in zip(config.datasets, planned.weights) if w > 0.0}
    return WorkChunk.from_buffer(
        names, pointers, counts,
        seed=derive(config.chunk_key, planned.chunk_index) >> 1,
        target_mixture=target,
        source_exhausted=exhausted_names(following or config, after or planned.state),
    )


def exhausted_names(config: SourceConfig, state: SourceState) -> tuple[str, ...]:
    """``source_exhausted`` of the chunk that left ``state`` (planned next under ``config``):
    drained "stop" and "redistribute" datasets, and capped repeating ones that cannot supply
    their next quota in their last allowed pass (drained there, or with fewer samples left of it
    than the quota). Sorted; the stream ends at the next chunk once a capped one is listed."""
    names = []
    short = _short_of_next_quota(config, state)
    for c, (d, cur) in enumerate(zip(config.datasets, state.cursors)):
        if d.policy != REPEAT:
            if cur.position >= d.total:
                names.append(d.name)
        elif d.max_repeats is not None and (c in short or (cur.epoch >= d.max_repeats and cur.position >= d.total)):
            names.append(d.name)
    return tuple(sorted(names))


def _in_last_pass(plan: DatasetPlan, cursor: CursorState, quota: int) -> bool:
    """Whether capped repeating ``plan`` cannot draw ``quota`` from ``cursor`` without a pass past
    ``max_repeats`` (a "carry" draw runs on into its allowed passes, a "drop" one starts the next)."""
    if plan.total - cursor.position >= quota:
        return False
    if plan.pass_tail == CARRY:
        return not can_carry(plan, cursor, quota)
    return plan.max_repeats is not None and cursor.epoch >= plan.max_repeats


def _short_of_next_quota(config: SourceConfig, state: SourceState) -> set[int]:
    """The capped repeating datasets that cannot supply their quota of the chunk planned from
    ``state``: quotas of the allocator in sample mode; in token mode, the dataset whose shortage
    ends that chunk (planned once: the next step takes the plan). Asked only when a capped
    dataset may read fewer samples than a chunk draws of it at most: ``chunk_size``, or for the
    built-in allocators its share of a chunk, its accumulator and 1 (their rounding adds one)."""
    left = {c: n for c, (d, cur) in enumerate(zip(config.datasets, state.cursors))
            if d.policy == REPEAT and d.max_repeats is not None  # n: the samples it may still read
            and (n := (d.max_repeats - cur.epoch + 1) * d.total - cur.position) < config.chunk_size}
    if not left:  # most chunks: no capped dataset within a chunk of its cap
        return set()
    weights = active_weights(config, state.cursors)
    if not any(weights):
        return set()
    near = list(left)
    if not config.token_mode and type(config.allocator) in (AccumulatorAllocator, FixedAllocator):
        carried = state.alloc or (0.0,) * len(weights)
        near = [c for c in near if left[c] < weights[c] * config.chunk_size + max(0.0, carried[c]) + 1.0]
        if not near:
            return set()
    if config.token_mode:
        ended = plan_token_chunk_once(config, state.alloc, state.cursors)
        return {ended.dataset} & set(near) if isinstance(ended, Ended) and ended.dataset is not None else set()
    quotas, _ = config.allocator.allocate(state.alloc, weights, config.chunk_size)
    return {c for c in near if _in_last_pass(config.datasets[c], state.cursors[c], int(quotas[c]))}


def at_start(state: SourceState) -> bool:
    """Whether ``state`` is the start of a stream (a migrated one starts with cursors that moved:
    if it cannot produce a chunk, it has simply nothing left)."""
    return state.chunk_index == 0 and all(c.epoch == 0 and c.position == 0 for c in state.cursors)


def first_chunk_error(config: SourceConfig, ended: Ended) -> str:
    """Why global chunk 0 cannot be produced, naming the dataset and what to change."""
    if ended.dataset is None:
        return "global chunk 0 cannot be produced: no dataset has samples; give at least one dataset samples"
    d = config.datasets[ended.dataset]
    return (
        f"global chunk 0 cannot be produced: dataset {d.name!r} (exhausted_policy={d.policy!r}, "
        f"max_repeats={d.max_repeats}) holds {d.total} samples, fewer than its share of one chunk "
        f"of {config.chunk_size}; lower chunk_size or its weight, or let it repeat "
        f"(exhausted_policy='repeat')"
    )
