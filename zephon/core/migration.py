"""Migration on the pure core: one cut across a run's lanes, the samples left unread, the cursors.

The lanes of a run stand at different places of the global schedule. Lane ``l``'s position
is its chunk-start state (the chunk in flight is its next own chunk ``a_l``) and how many
samples of that chunk were read. The **cut** is the first global chunk nothing was read from:
``C = max over lanes of (a_l + 1 if any sample of a_l was read else the state's chunk index)``.
Every pointer of a global chunk before ``C`` was assigned; those not read are listed (per
dataset, position ranges of a pass). The run continues from the global state at ``C``: each
dataset's cursor, so nothing assigned before the cut is served again by the new schedule.

Everything is numbers: no pointer is generated. A static config is walked as a phased config
with one phase (``as_phased``).
"""
from __future__ import annotations

from dataclasses import dataclass

from zephon.core import index
from zephon.core.config import SourceConfig
from zephon.core.phases import PhasedConfig, PhasedState, bind, plan_phased
from zephon.core.schedule import CursorState, Ended, SourceState

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
    """One lane of the old run: its chunk-start state and the samples of that chunk read."""

    lane: int
    state: PhasedState
    consumed: int


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
        planned, _ = plan_phased(at.state, bind(config, at.lane, replicas))
        if isinstance(planned, Ended):
            if at.consumed:
                raise ValueError(f"lane {at.lane} read {at.consumed} samples of a chunk, but its stream has ended; "
                                 "the checkpoint is corrupted")
            firsts[at.lane] = None
            frontier = max(frontier, at.state.chunk_index)
            continue
        if at.consumed > sum(planned.quotas):
            raise ValueError(f"lane {at.lane} read {at.consumed} samples of a chunk of {sum(planned.quotas)}; "
                             "the checkpoint is corrupted")
        firsts[at.lane] = planned.chunk_index
        frontier = max(frontier, planned.chunk_index + 1 if at.consumed else at.state.chunk_index)
    ranges: list[list[Range]] = [[] for _ in config.datasets]
    for at in lanes:
        _unread_of_lane(bind(config, at.lane, replicas), at, frontier, ranges)
    cursors = _global_state_at(config, lanes, frontier).inner.cursors
    return Cut(frontier, tuple(_draw_position(cur) for cur in cursors),
               tuple(_merge(r) for r in ranges), firsts, tuple(cur.tails for cur in cursors))


def _draw_position(cursor: CursorState) -> CursorState:
    """What was read of the dataset at the cut (its skipped tails are not carried on): everything
    before was assigned, nothing after."""
    return CursorState(epoch=cursor.epoch, position=cursor.position)


def _unread_of_lane(config: PhasedConfig, at: LaneAt, frontier: int, ranges: list[list[Range]]) -> None:
    """Add the lane's assigned-but-unread ranges before ``frontier`` to ``ranges``."""
    state, consumed = at.state, at.consumed
    while True:
        planned, p = plan_phased(state, config)
        if isinstance(planned, Ended) or planned.chunk_index >= frontier:
            return
        taken = _read_prefix(planned.quotas, consumed)
        for c, (quota, start) in enumerate(zip(planned.quotas, planned.starts)):
            if quota > taken[c]:
                total = config.datasets[c].total
                ranges[c].extend(in_passes(start.epoch, start.position + taken[c], start.position + quota, total))
        state, consumed = PhasedState(p, planned.state, state.origin), 0


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
