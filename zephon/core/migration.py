"""Migration on the pure core: one cut across a run's lanes, the samples left unread, the cursors.

The lanes of a run stand at different places of the global schedule. Lane ``l``'s position
is its chunk-start state (the chunk in flight is its next own chunk ``a_l``) and how many
samples of that chunk were read. The **cut** is the first global chunk nothing was read from:
``C = max over lanes of (a_l + 1 if any sample of a_l was read else the state's chunk index)``.
Every pointer of a global chunk before ``C`` was assigned; those not read are listed (per
dataset, position ranges of a pass). The run continues from the global state at ``C``: each
dataset's cursor, so nothing assigned before the cut is served again by the new schedule.

A lane may also have read on past its chunk while some samples before its position stay
unread (a packer that holds documents back): ``consumed`` then runs into the lane's next chunks,
and ``held`` names the samples before it that count as unread.

Everything is numbers: no pointer is generated. A static config is walked as a phased config
with one phase (``as_phased``).
"""
from __future__ import annotations

from dataclasses import dataclass

from zephon.core import index
from zephon.core.config import SourceConfig
from zephon.core.phases import PhasedConfig, PhasedState, bind, plan_phased
from zephon.core.schedule import CursorState, Ended, Planned, SourceState

Range = tuple[int, int, int]  # (pass, start, stop): positions [start, stop) of a dataset's pass


def as_phased(config: SourceConfig | PhasedConfig, state: SourceState | PhasedState
              ) -> tuple[PhasedConfig, PhasedState]:
    """A static config and state as a one-phase curriculum (a phased one as is)."""
    if isinstance(config, PhasedConfig):
        assert isinstance(state, PhasedState)  # a phased source's state
        return config, state
    assert isinstance(state, SourceState)  # a static source's state
    return PhasedConfig(phases=(config,), bounds=(None,), lane=config.lane,
                        canonical_replicas=config.canonical_replicas), PhasedState(0, state)


@dataclass(frozen=True, slots=True)
class LaneAt:
    """One lane of the old run: its chunk-start state, the samples read from that chunk's start
    on (they may run into the lane's next chunks) and, of those, the ones ``held`` unread
    (offsets from the chunk's start, ascending)."""

    lane: int
    state: PhasedState
    consumed: int
    held: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Cut:
    """The outcome: the cut chunk, the global cursors there, and every assigned-but-unread range."""

    chunk_index: int
    cursors: tuple[CursorState, ...]
    unread: tuple[tuple[Range, ...], ...]  # per dataset, merged ranges in pass and position order
    in_flight: dict[int, int | None]  # lane -> global index of its chunk in flight (None: the lane had ended)
    skipped: tuple[int, ...]  # per dataset, the samples of "drop" pass tails skipped before the cut


def _read_prefix(quotas: tuple[int, ...], consumed: int) -> list[int]:
    """Per dataset, how many of its draws the first ``consumed`` samples of the chunk's default
    read order (weighted round robin) took."""
    taken = [0] * len(quotas)
    if consumed:
        datasets, _ = index.round_robin(tuple(quotas))
        for c in datasets[:consumed].tolist():
            taken[c] += 1
    return taken


def in_passes(epoch: int, start: int, stop: int, total: int) -> list[Range]:
    """Positions ``[start, stop)`` counted from the start of pass ``epoch`` as ranges inside
    passes: a draw that runs past the end of a pass continues in the next one."""
    out = []
    while start < stop:
        if start >= total:
            epoch, start, stop = epoch + start // total, start % total, stop - start // total * total
            continue
        out.append((epoch, start, min(stop, total)))
        start = min(stop, total)
    return out


def _merge(ranges: list[Range]) -> tuple[Range, ...]:
    merged: list[list[int]] = []
    for e, start, stop in sorted(ranges):
        if merged and merged[-1][0] == e and merged[-1][2] >= start:
            merged[-1][2] = max(merged[-1][2], stop)
        else:
            merged.append([e, start, stop])
    return tuple((e, a, b) for e, a, b in merged if b > a)


def cut(config: PhasedConfig, lanes: list[LaneAt]) -> Cut:
    """The cut of a run whose ``lanes`` (all of them, of ``config``'s binding) stand as given.

    ``config`` may be bound to any lane; each lane is walked under its own binding. Raises
    ``ValueError`` if a lane says it read more than its chunk holds.
    """
    replicas = config.canonical_replicas or 1
    firsts: dict[int, int | None] = {}
    frontier = 0
    for at in lanes:
        state, planned, consumed = _read_to(bind(config, at.lane, replicas), at)
        if isinstance(planned, Ended):
            firsts[at.lane] = None
            frontier = max(frontier, state.chunk_index)
            continue
        firsts[at.lane] = planned.chunk_index
        frontier = max(frontier, planned.chunk_index + 1 if consumed else state.chunk_index)
    ranges: list[list[Range]] = [[] for _ in config.datasets]
    for at in lanes:
        _unread_of_lane(bind(config, at.lane, replicas), at, frontier, ranges)
    cursors = _global_state_at(config, lanes, frontier).inner.cursors
    return Cut(frontier, tuple(_draw_position(cur) for cur in cursors),
               tuple(_merge(r) for r in ranges), firsts, tuple(cur.tails for cur in cursors))


def _read_to(config: PhasedConfig, at: LaneAt) -> tuple[PhasedState, Planned | Ended, int]:
    """The lane's chunk where its reading stands: its start state, its plan, the samples of it
    read. Raises ``ValueError`` if the lane read more than its stream holds."""
    state, consumed = at.state, at.consumed
    while True:
        planned, p = plan_phased(state, config)
        size = 0 if isinstance(planned, Ended) else sum(planned.quotas)
        if consumed <= size:
            return state, planned, consumed
        if isinstance(planned, Ended):
            raise ValueError(f"lane {at.lane} read {at.consumed} samples from a chunk on, more than its stream holds; "
                             "the checkpoint is corrupted")
        state, consumed = PhasedState(p, planned.state, state.origin), consumed - size


def _draw_position(cursor: CursorState) -> CursorState:
    """What was read of the dataset at the cut (its skipped tails are not carried on): everything
    before was assigned, nothing after."""
    return CursorState(epoch=cursor.epoch, position=cursor.position)


def _unread_of_lane(config: PhasedConfig, at: LaneAt, frontier: int, ranges: list[list[Range]]) -> None:
    """Add the lane's assigned-but-unread ranges before ``frontier`` to ``ranges``."""
    state, consumed, held = at.state, at.consumed, at.held
    while True:
        planned, p = plan_phased(state, config)
        if isinstance(planned, Ended) or planned.chunk_index >= frontier:
            return
        size = sum(planned.quotas)
        taken = _read_prefix(planned.quotas, min(consumed, size))
        for c, (quota, start) in enumerate(zip(planned.quotas, planned.starts)):
            if quota > taken[c]:
                total = config.datasets[c].total
                ranges[c].extend(in_passes(start.epoch, start.position + taken[c], start.position + quota, total))
        _add_held(config, planned, [h for h in held if h < size], ranges)
        state, consumed, held = PhasedState(p, planned.state, state.origin), max(0, consumed - size), \
            tuple(h - size for h in held if h >= size)


def _add_held(config: PhasedConfig, planned: Planned, held: list[int], ranges: list[list[Range]]) -> None:
    """Add the draws of the chunk's samples ``held`` (offsets in its read order) to ``ranges``."""
    if not held:
        return
    datasets, _ = index.round_robin(tuple(planned.quotas))
    for j in held:
        c = int(datasets[j])
        start, draw = planned.starts[c], int((datasets[:j] == c).sum())
        ranges[c].extend(in_passes(start.epoch, start.position + draw, start.position + draw + 1,
                                   config.datasets[c].total))


def _global_state_at(config: PhasedConfig, lanes: list[LaneAt], frontier: int) -> PhasedState:
    """The whole stream's state at global chunk ``frontier``, walked from the furthest lane."""
    template = bind(config, None, None)
    state = max((at.state for at in lanes if at.state.chunk_index <= frontier), key=lambda s: s.chunk_index)
    while state.chunk_index < frontier:
        planned, p = plan_phased(state, template)
        if isinstance(planned, Ended):
            break
        state = PhasedState(p, planned.state, state.origin)
    return state
