"""The global chunk schedule on numbers only: quotas, passes, exhaustion, lane routing.

``plan_chunk_reference`` is the exhaustion and repeat rules for one global chunk, written to be
read. A ``pass_tail="carry"`` dataset reads its passes back to back: its cursor is what was read
(``epoch`` the pass being read, ``position`` the samples read of it, ``total`` once it is read
to the end) and its draws run on into the next pass, so its rules are decided on what was read.
A ``"drop"`` dataset starts its next pass when the current one cannot serve its quota, skipping
the tail (``tails`` counts what was skipped) and planning the chunk again: the earlier rule, kept exactly.
Both give the same quotas on every chunk both produce.
``plan_next`` walks the schedule from a state to the next chunk owned by the lane, with the
scheduling kernel for the built-in allocators (the kernel is tested against this module)
and in Python for an allocator a fork brings. No pointer is generated here: a chunk that
belongs to another lane costs O(datasets) arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from zephon.core.cache import scheduler
from zephon.core.config import CARRY, REDISTRIBUTE, REPEAT, STOP, DatasetPlan, SourceConfig
from zephon.limits import show


WALK_STEPS = 1 << 21  # work (chunks planned, blocks skipped) x datasets a kernel walk does between checks for Ctrl-C


@dataclass(frozen=True, slots=True, kw_only=True)
class CursorState:
    """What one dataset's stream has read: pass ``epoch``, ``position`` samples of it.

    ``position == total`` means the pass is read to its end; a "carry" dataset moves to the next
    pass only when it draws from it, so its cursor is never at the start of a pass other than
    the first. ``tails`` counts the samples of "drop" pass tails skipped, never read (0 under
    "carry").
    """

    epoch: int  # the pass being read, >= 0 (pass ``epoch`` is the dataset's epoch-th repeat)
    position: int  # samples read of this pass, 0..total; == total: read to its end
    tails: int = 0  # samples of earlier passes skipped when each next one started ("drop" only)


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceState:
    """Everything that moves in a mixture source: a few numbers per dataset.

    ``chunk_index`` is the next global chunk, ``alloc`` the allocator's state,
    ``cursors`` one :class:`CursorState` per dataset and ``requeue`` the samples a migrated
    stream re-serves first (empty otherwise).
    """

    chunk_index: int  # the next global chunk to plan, >= 0
    alloc: Any  # the allocator's state (JSON-able; floats for the accumulator)
    cursors: tuple[CursorState, ...]  # one per dataset, in dataset order
    requeue: tuple[tuple[int, int, int, int], ...] = ()  # samples served first (zephon.core.requeue)


Token = tuple[int, Any, tuple[tuple[int, int, int], ...], tuple[tuple[int, int, int, int], ...]]


def state_token(state: SourceState) -> Token:
    """``state`` as plain numbers: a reader records one per chunk and sends it between
    processes, where the dataclasses would cost ten times as much to pickle."""
    cursors = tuple((c.epoch, c.position, c.tails) for c in state.cursors)
    return state.chunk_index, state.alloc, cursors, state.requeue


def token_chunk_index(token: Token) -> int:
    """The ``chunk_index`` of the state ``token`` holds, read without rebuilding the state."""
    return token[0]


def state_of_token(token: Token) -> SourceState:
    """The state ``state_token`` made ``token`` of."""
    chunk_index, alloc, cursors, requeue = token
    return SourceState(chunk_index=chunk_index, alloc=alloc, requeue=requeue,
                       cursors=tuple(CursorState(epoch=e, position=p, tails=t) for e, p, t in cursors))


def initial_state(config: SourceConfig) -> SourceState:
    """The state at the start of the stream."""
    n = len(config.datasets)
    return SourceState(
        chunk_index=0,
        alloc=(0,) * n if config.token_mode else config.allocator.init(n),
        cursors=(CursorState(epoch=0, position=0),) * n,  # frozen: one object serves every dataset
    )


@dataclass(frozen=True, slots=True)
class Planned:
    """The next chunk of the lane, on numbers: who draws how many from where."""

    chunk_index: int  # its global index
    quotas: tuple[int, ...]  # pointers per dataset (0 = omitted)
    starts: tuple[CursorState, ...]  # where each dataset's draw begins (``draw_start``), maybe running on
    weights: tuple[float, ...]  # active weights, normalised; 0.0 = inactive
    state: SourceState  # the state after this chunk


@dataclass(frozen=True, slots=True)
class Ended:
    """The stream ends at global chunk ``chunk_index``; ``dataset`` caused it (None: all done)."""

    chunk_index: int
    dataset: int | None


def lane_of(config: SourceConfig, g: int) -> int:
    """The lane that owns global chunk ``g`` under the config's routing (zephon.core.routing)."""
    _, replicas = config.lane_binding
    return config.routing.lane_of(config.lane_key, g, replicas)


def check_drawn(state: SourceState, config: SourceConfig, start: SourceState) -> None:
    """Refuse a state whose chunk index disagrees with what its cursors have read since ``start``
    (a state of the same stream): in sample mode with no dataset redistributing, every chunk
    draws exactly ``chunk_size`` samples, so no stream reaches such a state."""
    if config.token_mode or any(d.policy == REDISTRIBUTE for d in config.datasets):
        return
    drawn = samples_read(config, state.cursors) - samples_read(config, start.cursors)
    chunks = state.chunk_index - start.chunk_index
    if drawn != chunks * config.chunk_size:
        raise ValueError(f"checkpoint is at chunk {state.chunk_index}, but its cursors have read {drawn} samples "
                         f"since chunk {start.chunk_index}, not {chunks} x {config.chunk_size}; no stream reaches "
                         "this state, the checkpoint is corrupted")


def samples_read(config: SourceConfig, cursors: tuple[CursorState, ...]) -> int:
    """Samples the ``cursors`` have read since the start of the stream, every pass counted."""
    return sum(c.epoch * d.total + c.position - c.tails for c, d in zip(cursors, config.datasets))


def active_weights(config: SourceConfig, cursors: tuple[CursorState, ...]) -> tuple[float, ...]:
    """Weights normalised over the active datasets (redistributing drained ones retire).

    Two double-precision stages: the weights normalised over all
    datasets (``config.normalised``), then, once some have retired, those divided by their
    sum over the active ones (summed in mixture order).
    """
    active = [not (d.policy == REDISTRIBUTE and cur.position >= d.total) for d, cur in zip(config.datasets, cursors)]
    if all(active):
        return config.normalised
    total = 0.0
    for c in config.summing_order:
        if active[c]:
            total += config.normalised[c]
    if total == 0.0:  # only paused datasets (weight 0, a phase of a curriculum) are left: none is active
        return (0.0,) * len(active)
    return tuple(n / total if is_active else 0.0 for n, is_active in zip(config.normalised, active))


def passes_done(config: SourceConfig, cursors: list[CursorState], counting: int | None = None) -> bool:
    """Every dataset has completed ``stop_after_passes`` passes (``counting`` finishes its pass now).

    A cursor at the end of its pass counts that pass as completed: for a "carry" dataset that
    is ``read // total``, its complete passes.
    """
    n = config.stop_after_passes
    assert n is not None  # callers check that stop_after_passes is set
    for c, (d, cur) in enumerate(zip(config.datasets, cursors)):
        completed = cur.epoch + (1 if c == counting or cur.position >= d.total else 0)
        if completed < n:
            return False
    return True


def start_next_pass(config: SourceConfig, now: list[CursorState], c: int) -> Ended | None:
    """Move "drop" dataset ``c`` to its next pass in ``now`` (skipping its tail), or say why the
    stream ends: ``c`` when its own rule does (a pass too short, ``max_repeats``), None when
    every dataset has done its ``stop_after_passes`` (``c`` counting its pass as completed)."""
    d = config.datasets[c]
    if now[c].position == 0:  # a whole pass cannot serve one chunk: end rather than loop
        return Ended(-1, c)
    if d.max_repeats is not None and now[c].epoch >= d.max_repeats:
        return Ended(-1, c)
    if config.stop_after_passes is not None and passes_done(config, now, counting=c):
        return Ended(-1, None)  # every dataset is done (c with the pass it cannot finish): none ends it
    now[c] = CursorState(epoch=now[c].epoch + 1, position=0, tails=now[c].tails + d.total - now[c].position)
    return None


ChunkPlan = tuple[tuple[int, ...], tuple[CursorState, ...], tuple[float, ...], Any, tuple[CursorState, ...]]
"""One planned global chunk: ``(quotas, starts, weights, alloc', cursors')``."""
PlanChunk = Callable[[SourceConfig, Any, tuple[CursorState, ...]], "ChunkPlan | Ended"]


def plan_chunk_reference(config: SourceConfig, alloc: Any, cursors: tuple[CursorState, ...]) -> ChunkPlan | Ended:
    """Plan one global chunk: ``(quotas, starts, weights, alloc', cursors')`` or ``Ended``.

    Pure; ``Ended`` carries ``chunk_index=-1`` (the caller knows the index).
    """
    weights = active_weights(config, cursors)
    if not any(weights):
        return Ended(-1, None)
    now = list(cursors)
    restart = True
    while restart:
        restart = False
        allocated, new_alloc = config.allocator.allocate(alloc, weights, config.chunk_size)
        quotas = _checked_quotas(config, allocated, weights)
        for c, d in enumerate(config.datasets):
            remaining = d.total - now[c].position
            if remaining >= quotas[c]:
                continue
            if d.policy == STOP:
                return Ended(-1, c)
            if d.policy == REDISTRIBUTE:
                quotas[c] = remaining
                continue
            if d.pass_tail == CARRY:
                if not can_carry(d, now[c], quotas[c]):
                    return Ended(-1, c)
                continue
            ended = start_next_pass(config, now, c)
            if ended:
                return ended
            restart = True
            break
    if config.stop_after_passes is not None and passes_done(config, now):
        return Ended(-1, None)
    return tuple(quotas), tuple(now), weights, new_alloc, advance(config, now, quotas)


def _checked_quotas(config: SourceConfig, allocated: Any, weights: tuple[float, ...]) -> list[int]:
    """The allocator's quotas, refused unless they are what the allocator protocol promises."""
    quotas = list(allocated) if isinstance(allocated, (tuple, list, np.ndarray)) else []
    ok = (len(quotas) == len(weights)
          and all(isinstance(q, (int, np.integer)) and not isinstance(q, bool) and q >= 0 for q in quotas)
          and sum(quotas) == config.chunk_size and all(q == 0 for q, w in zip(quotas, weights) if w == 0.0))
    if not ok:
        raise ValueError(f"allocator {config.allocator.name!r} returned quotas {show(allocated)} for weights "
                         f"{show(weights)}: they must be {len(weights)} counts >= 0 summing to chunk_size="
                         f"{config.chunk_size}, 0 where the weight is 0; fix its allocate()")
    return [int(q) for q in quotas]


def can_carry(plan: DatasetPlan, cursor: CursorState, quota: int) -> bool:
    """Whether "carry" dataset ``plan`` can draw ``quota`` from ``cursor`` on into its next passes
    without starting a pass past ``max_repeats``."""
    if plan.total == 0:
        return False
    if plan.max_repeats is None:
        return True
    return cursor.epoch + (cursor.position + quota - 1) // plan.total <= plan.max_repeats  # the pass it ends in


def advance(config: SourceConfig, cursors: list[CursorState], quotas: tuple[int, ...] | list[int]) -> tuple[CursorState, ...]:
    """The cursors after drawing ``quotas``; a "carry" draw past its pass's end moves into the pass
    it ends in (a draw that ends a pass leaves the cursor at that pass's end)."""
    return tuple(_moved(d, cur, q) for d, cur, q in zip(config.datasets, cursors, quotas))


def _moved(plan: DatasetPlan, cursor: CursorState, quota: int) -> CursorState:
    position = cursor.position + quota
    if position <= plan.total:
        return CursorState(epoch=cursor.epoch, position=position, tails=cursor.tails)
    passes = (position - 1) // plan.total
    return CursorState(epoch=cursor.epoch + passes, position=position - passes * plan.total, tails=cursor.tails)


def draw_start(plan: DatasetPlan, cursor: CursorState) -> CursorState:
    """Where a dataset's next draw begins: the cursor, or the start of the next pass for a
    repeating "carry" cursor at the end of its pass. A start counts no tails."""
    if plan.pass_tail == CARRY and plan.policy == REPEAT and cursor.position >= plan.total > 0:
        return CursorState(epoch=cursor.epoch + 1, position=0)
    return CursorState(epoch=cursor.epoch, position=cursor.position)


def walk_to_lane(state: SourceState, config: SourceConfig, plan_chunk: PlanChunk) -> Planned | Ended:
    """Plan global chunks with ``plan_chunk(config, alloc, cursors)`` until one belongs to the lane."""
    lane, _ = config.lane_binding
    g, alloc, cursors = state.chunk_index, state.alloc, state.cursors
    while True:
        planned = plan_chunk(config, alloc, cursors)
        if isinstance(planned, Ended):
            return Ended(g, planned.dataset)
        quotas, starts, weights, alloc, cursors = planned
        if lane_of(config, g) == lane:
            starts = tuple(draw_start(d, cur) for d, cur in zip(config.datasets, starts))
            return Planned(g, quotas, starts, weights, SourceState(chunk_index=g + 1, alloc=alloc, cursors=cursors))
        g += 1


def plan_next_reference(state: SourceState, config: SourceConfig) -> Planned | Ended:
    """Walk the global schedule from ``state`` to the lane's next chunk (pure Python)."""
    return walk_to_lane(state, config, plan_chunk_reference)


def state_arrays(state: SourceState, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The state as the kernel's in-place arrays: accumulators, epochs, positions, tails."""
    acc = np.array(state.alloc if state.alloc else (0.0,) * n, dtype=np.float64)
    epochs = np.array([c.epoch for c in state.cursors], dtype=np.int64)
    positions = np.array([c.position for c in state.cursors], dtype=np.int64)
    tails = np.array([c.tails for c in state.cursors], dtype=np.int64)
    return acc, epochs, positions, tails


def state_from_arrays(g: int, alloc_like: Any, acc: np.ndarray, epochs: np.ndarray, positions: np.ndarray,
                      tails: np.ndarray) -> SourceState:
    """The kernel's arrays back as a state (``alloc_like`` tells whether the allocator keeps any)."""
    return SourceState(
        chunk_index=g,
        alloc=tuple(acc.tolist()) if alloc_like else alloc_like,
        cursors=tuple(CursorState(epoch=e, position=p, tails=t)
                      for e, p, t in zip(epochs.tolist(), positions.tolist(), tails.tolist())),
    )


def planned_from_kernel(g: int, out: np.ndarray, weights: np.ndarray, after: SourceState) -> Planned:
    quotas, start_epochs, start_positions = out.tolist()
    starts = tuple(CursorState(epoch=e, position=p) for e, p in zip(start_epochs, start_positions))
    return Planned(g, tuple(quotas), starts, tuple(weights.tolist()), after)


def plan_next(state: SourceState, config: SourceConfig) -> Planned | Ended:
    """Walk the global schedule from ``state`` to the lane's next chunk. Pure.

    Runs the scheduling kernel for the built-in allocators, the reference otherwise.
    """
    kernel = scheduler(config)
    if kernel is None:
        return plan_next_reference(state, config)
    n = len(config.datasets)
    acc, epochs, positions, tails = state_arrays(state, n)
    out, weights = np.empty((3, n), dtype=np.int64), np.empty(n, dtype=np.float64)
    budget = max(1, WALK_STEPS // n)
    ended, g, dataset = kernel.plan_next(state.chunk_index, acc, epochs, positions, tails, out, weights,
                                         budget)
    if ended:
        return Ended(g, None if dataset < 0 else dataset)
    return planned_from_kernel(g, out, weights, state_from_arrays(g + 1, state.alloc, acc, epochs, positions, tails))
