"""Phased mixtures on the pure core: piecewise-constant weights over the global chunk stream.

A phased config is one :class:`SourceConfig` per phase (same datasets and settings, the
phase's weights; a paused dataset has weight 0) and the bound that ends every phase but the
last: a global chunk index, a global sample count or a global token count (estimated tokens,
token mode). A phase ends at the first chunk boundary where its bound is reached.

Phase ``p`` starts at global chunk ``E_p`` from the global state there: the cursors where
phase ``p - 1`` left them (a pass continues, nothing is skipped or repeated) and fresh
allocator state (accumulators restart at a boundary). These start states depend on the
configuration only, never on the lane, so they are resolved once, on first need, by walking
the whole stream (numbers only) and shared by every clone (``Starts``).

A lane plans its next chunk with the static planner of its phase; a chunk planned at or past
the next phase's start is dropped and planning resumes from that start, in the next phase.
Lanes therefore stay disjoint with the single-lane union, and a checkpoint is the phase
index and a static state: O(1).

A migrated stream (``zephon.work.migrate``) first re-serves its requeued samples
(``zephon.core.requeue``), then starts phase 0 from the cursors of the cut: its *origin*,
kept in the state; its phase starts are resolved from there (bounds count from the origin).

Random access walks each phase's part of the lane's stream once (the scheduling kernel)
and keeps a :class:`~zephon.core.index.StreamIndex` per phase; a lookup finds the phase by
binary search and asks that phase's lookup kernel (``zephon.core.index``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon._ext.schedule import Scheduler
from zephon.limits import MAX_PHASE_WALK, MAX_TOKEN_PHASE_WALK
from zephon.core import index
from zephon.core.cache import Remade, scheduler
from zephon.core.chunk import WorkChunk
from zephon.core.config import DatasetPlan, SourceConfig
from zephon.core.cursor import shard_runs
from zephon.core.schedule import (
    CursorState, Ended, Planned, SourceState, Token, initial_state, plan_next, state_arrays, state_of_token, state_token,
    token_chunk_index,
)
from zephon.core.routing import Routing
from zephon.core.requeue import past_region, region_samples, step_region
from zephon.core.step import at_start, first_chunk_error, materialize, walk_to_end
from zephon.core.tokens import _cost_of_shard_id, plan_next_tokens

CHUNK, SAMPLE, TOKEN = "chunk", "sample", "token"
BOUND_KINDS = (CHUNK, SAMPLE, TOKEN)
_BATCH = 1024  # lane chunks per kernel call when a phase's part of a lane is indexed


@dataclass(frozen=True, slots=True)
class Start:
    """Where a phase starts: global chunk, samples and token cost units before it, and its state."""

    chunk_index: int
    samples: int
    tokens: int  # estimated tokens before it, in cost units (token mode; 0 otherwise)
    state: SourceState  # the global state at ``chunk_index``, allocator reset


@dataclass(eq=False)
class Starts:
    """The memo of phase starts, shared by a template and its clones; ``None``: never reached.

    Keyed by the stream's origin: None for a stream from its start, else the state a migrated
    stream starts its phase 0 from. ``ends``: the memo of ``stream_end_phased``'s walks
    (``zephon.core.step.walk_to_end``), made again where it is used (it pickles empty, as the
    static source's does)."""

    known: dict[SourceState | None, list[Start | None]] = field(default_factory=dict)
    ends: Remade = field(default_factory=Remade)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PhasedConfig:
    """Everything a phased source's stream depends on, including the lane binding."""

    phases: tuple[SourceConfig, ...]  # one per phase, bound to the lane
    bounds: tuple[tuple[str, int] | None, ...]  # what ends each phase; None for the last
    lane: int | None = None
    canonical_replicas: int | None = None
    starts: Starts = field(default_factory=Starts, repr=False)

    @property
    def base(self) -> SourceConfig:
        """The first phase's config: the settings every phase shares."""
        return self.phases[0]

    @property
    def datasets(self) -> tuple[DatasetPlan, ...]:
        return self.base.datasets

    @property
    def names(self) -> tuple[str, ...]:
        return self.base.names

    @property
    def seed(self) -> int:
        return self.base.seed

    @property
    def stop_after_passes(self) -> int | None:
        return self.base.stop_after_passes

    @property
    def chunk_size(self) -> int:
        return self.base.chunk_size

    @property
    def token_mode(self) -> bool:
        return self.base.token_mode

    @property
    def primed(self) -> bool:
        return all(phase.primed for phase in self.phases)

    @property
    def lane_binding(self) -> tuple[int, int]:
        """``(lane, R)``; the template reads the whole stream as lane 0 of 1."""
        if self.lane is None:
            return 0, 1
        assert self.canonical_replicas is not None  # set together with lane (bind)
        return self.lane, self.canonical_replicas

    @property
    def lane_assignment(self) -> str:
        return self.base.lane_assignment

    @property
    def routing(self) -> Routing:
        return self.base.routing

    @property
    def lane_key(self) -> int:
        return self.base.lane_key

    def fingerprint(self) -> dict[str, Any]:
        """JSON summary of what shapes the stream: the shared settings and every phase."""
        prints = [phase.fingerprint() for phase in self.phases]
        return {
            "settings": {k: v for k, v in prints[0].items() if k not in ("weights", "mixture_order")},
            "phases": [
                {"weights": fp["weights"], "mixture_order": fp["mixture_order"], "until": list(bound) if bound else None}
                for fp, bound in zip(prints, self.bounds)
            ],
        }


def bind(config: PhasedConfig, lane: int | None, replicas: int | None) -> PhasedConfig:
    """The config bound to a lane; the phase starts stay shared."""
    phases = tuple(p.for_lane(lane, replicas) for p in config.phases)
    return dataclasses.replace(config, phases=phases, lane=lane, canonical_replicas=replicas)


def with_phases(config: PhasedConfig, phases: tuple[SourceConfig, ...]) -> PhasedConfig:
    """The config with new phase configs (token ratios set): the starts are resolved again."""
    return dataclasses.replace(config, phases=phases, starts=Starts())


@dataclass(frozen=True, slots=True)
class PhasedState:
    """Where a phased lane stands: its phase and the static state inside it."""

    phase: int
    inner: SourceState
    origin: SourceState | None = None  # where a migrated stream's phase 0 starts; None: the stream's start

    @property
    def chunk_index(self) -> int:
        return self.inner.chunk_index


PhasedToken = tuple[int, Token, Token | None]


def phased_token(state: PhasedState) -> PhasedToken:
    """``state`` as plain numbers (see ``zephon.core.schedule.state_token``)."""
    return state.phase, state_token(state.inner), None if state.origin is None else state_token(state.origin)


def phased_token_chunk_index(token: PhasedToken) -> int:
    """The ``chunk_index`` of the phased state ``token`` holds (its inner state's)."""
    return token_chunk_index(token[1])


def phased_of_token(token: PhasedToken) -> PhasedState:
    """The state ``phased_token`` made ``token`` of."""
    phase, inner, origin = token
    return PhasedState(phase, state_of_token(inner), None if origin is None else state_of_token(origin))


def initial_phased_state(config: PhasedConfig) -> PhasedState:
    return PhasedState(0, initial_state(config.base))


def restart(config: SourceConfig, state: SourceState) -> SourceState:
    """``state`` with the allocator state a phase starts with."""
    alloc = (0,) * len(config.datasets) if config.token_mode else config.allocator.init(len(config.datasets))
    return dataclasses.replace(state, alloc=alloc)


def plan(state: SourceState, config: SourceConfig) -> Planned | Ended:
    """The static planner of ``config``'s mode."""
    return plan_next_tokens(state, config) if config.token_mode else plan_next(state, config)


def chunk_cost(config: SourceConfig, planned: Planned) -> int:
    """Estimated tokens of a planned chunk, in cost units (0 in sample mode)."""
    if not config.token_mode:
        return 0
    total = 0
    for c, (quota, start) in enumerate(zip(planned.quotas, planned.starts)):
        if quota:
            ends, ids = shard_runs(config, c, start.epoch, start.position, quota)
            lengths = np.diff(ends, prepend=0)
            total += int((_cost_of_shard_id(config.datasets[c])(ids) * lengths).sum())
    return total


def _reached(bound: tuple[str, int], g: int, samples: int, tokens: int) -> bool:
    kind, value = bound
    if kind == CHUNK:
        return g >= value
    if kind == SAMPLE:
        return samples >= value
    return tokens >= value


def _resolve_next(config: PhasedConfig, p: int, start: Start, first_chunk: int) -> Start | None:
    """Walk phase ``p`` (whole stream) from its start to its bound: the next phase's start. A
    phase that cannot go on before its bound (its datasets ran out, or its rules end it) hands
    over there: only the last phase ends the stream. Chunk bounds count from ``first_chunk``
    (phase 0's start)."""
    phase = config.phases[p].for_lane(None, None)
    ends = config.bounds[p]
    assert ends is not None  # only the last phase is open-ended, and nothing follows it
    if at_start(start.state):  # the stream's start: a phase that cannot make its first chunk is a mistake
        first = plan(start.state, phase)
        if isinstance(first, Ended):
            raise ValueError(f"phases[{p}]: {first_chunk_error(phase, first)}")
    kind, value = ends
    bound = (kind, value + first_chunk if kind == CHUNK else value)
    kernel = scheduler(phase)
    if kernel is not None:
        return _resolve_in_kernel(config.phases[p + 1], phase, kernel, bound, start, p, ends)
    g, samples, tokens, state = start.chunk_index, start.samples, start.tokens, start.state
    while not _reached(bound, g, samples, tokens):
        if g - start.chunk_index > MAX_TOKEN_PHASE_WALK:
            raise _too_far(p, ends, MAX_TOKEN_PHASE_WALK, "MAX_TOKEN_PHASE_WALK")
        planned = plan(state, phase)
        if isinstance(planned, Ended):
            break
        g, state = planned.chunk_index + 1, planned.state
        samples += sum(planned.quotas)
        tokens += chunk_cost(phase, planned)
    return Start(g, samples, tokens, restart(config.phases[p + 1], state))


def _too_far(p: int, bound: tuple[str, int], limit: int, name: str) -> ValueError:
    kind, value = bound
    return ValueError(f"phases[{p}] ends at until_{kind}={value}, which the stream does not reach within {limit} "
                      f"chunks of the phase's start (zephon.limits.{name}: zephon walks the schedule to find where "
                      "a phase ends); lower the bound, or leave it off the last phase")


def _walk_arrays(state: SourceState, n: int
                 ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
    """The kernel's in-place state arrays for ``state`` and a batch of snapshot rows
    (``[g, samples before, one column block per cursor field]`` and the accumulators)."""
    arrays = state_arrays(state, n)
    rows = np.empty((_BATCH, 2 + (len(arrays) - 1) * n), dtype=np.int64)
    return arrays, rows, np.empty((_BATCH, n), dtype=np.float64)


def _cursors_of_row(row: list[int], n: int) -> tuple[CursorState, ...]:
    """The cursors of a snapshot row (its column blocks follow CursorState's fields)."""
    names = [f.name for f in dataclasses.fields(CursorState)]
    blocks = [row[2 + k * n:2 + (k + 1) * n] for k in range(len(names))]
    return tuple(CursorState(**dict(zip(names, values))) for values in zip(*blocks))


def _resolve_in_kernel(following: SourceConfig, phase: SourceConfig, kernel: Scheduler, bound: tuple[str, int],
                       start: Start, p: int, ends: tuple[str, int]) -> Start | None:
    """``_resolve_next`` for sample mode: the scheduling kernel snapshots the state before every
    chunk, in batches, and the bound is searched in the snapshots (numbers only)."""
    arrays, ints, accs = _walk_arrays(start.state, len(phase.datasets))
    g, own, samples, column = start.chunk_index, 0, start.samples, 0 if bound[0] == CHUNK else 1
    while True:
        filled, g, own, samples, ended = kernel.index(g, *arrays, own, samples, 1, ints, accs, _BATCH)
        k = int(np.searchsorted(ints[:filled, column], bound[1], side="left"))
        if k < filled or ended:  # the bound, or the phase's end: the state before the chunk it cannot make
            row = ints[min(k, filled - 1)].tolist()
            state = SourceState(chunk_index=row[0], alloc=(), cursors=_cursors_of_row(row, len(phase.datasets)))
            return Start(row[0], row[1], 0, restart(following, state))
        if g - start.chunk_index > MAX_PHASE_WALK:
            raise _too_far(p, ends, MAX_PHASE_WALK, "MAX_PHASE_WALK")


def phase_start(config: PhasedConfig, p: int, origin: SourceState | None = None) -> Start | None:
    """Where phase ``p`` starts (resolving the earlier ones on first need), or None if never reached.

    ``origin``: the state phase 0 starts from (a migrated stream); the bounds count chunks,
    samples and tokens from there."""
    known = config.starts.known.setdefault(origin, [])
    if not known:
        known.append(Start(0, 0, 0, initial_state(config.base)) if origin is None
                     else Start(origin.chunk_index, 0, 0, origin))
    first = known[0]
    assert first is not None  # phase 0 always starts
    while len(known) <= p:
        previous = known[-1]
        known.append(None if previous is None else _resolve_next(config, len(known) - 1, previous,
                                                                  first.chunk_index))
    return known[p]


def phase_end(config: PhasedConfig, p: int, origin: SourceState | None = None) -> int | None:
    """The global chunk where phase ``p`` ends (the next one starts), or None (it never does)."""
    if p + 1 >= len(config.phases):
        return None
    start = phase_start(config, p + 1, origin)
    return None if start is None else start.chunk_index


def plan_phased(state: PhasedState, config: PhasedConfig) -> tuple[Planned | Ended, int]:
    """The lane's next chunk (or where the stream ends) and its phase. Pure apart from the memo."""
    p, inner = state.phase, state.inner
    while True:
        planned = plan(inner, config.phases[p])
        end = phase_end(config, p, state.origin)
        if end is None or (not isinstance(planned, Ended) and planned.chunk_index < end):
            return planned, p
        following = phase_start(config, p + 1, state.origin)
        assert following is not None  # the phase ends: the next one starts
        p, inner = p + 1, following.state


def step_phased(state: PhasedState, config: PhasedConfig) -> tuple[WorkChunk | None, PhasedState]:
    """``zephon.core.step`` for a phased config: ``(chunk, state')``, ``(None, state)`` at the end."""
    if not config.primed:
        raise RuntimeError("this token-aware source is not primed yet: call prime() before reading from it")
    before = state
    if state.inner.requeue:
        chunk, inner = step_region(state.inner, config.phases[state.phase])
        state = dataclasses.replace(state, inner=inner)
        if chunk is not None:
            return chunk, state
    planned, p = plan_phased(state, config)
    if isinstance(planned, Ended):
        if planned.chunk_index == 0 and at_start(state.inner):
            raise ValueError(first_chunk_error(config.phases[p], planned))
        return None, before
    following, after = config.phases[p], planned.state
    end = phase_end(config, p, state.origin)
    if end is not None and planned.chunk_index + 1 >= end:  # the next global chunk is the next phase's first
        following = config.phases[p + 1]
        after = restart(following, after)
    return materialize(planned, config.phases[p], following, after), PhasedState(p, planned.state, state.origin)


def stream_end_phased(state: PhasedState, config: PhasedConfig) -> tuple[PhasedState, int | None]:
    """``zephon.core.step.stream_end`` for a phased config."""
    whole = bind(config, 0, 1)

    def following(state: PhasedState) -> PhasedState | Ended:
        planned, p = plan_phased(state, whole)
        return planned if isinstance(planned, Ended) else PhasedState(p, planned.state, state.origin)

    return walk_to_end(state, following, config.starts.ends, 2 * config.lane_binding[1] + 1)


def ended_early(config: PhasedConfig, p: int, origin: SourceState | None = None) -> bool:
    """Whether phase ``p`` (not the last) handed over before its bound: it could not go on."""
    first, following = phase_start(config, 0, origin), phase_start(config, p + 1, origin)
    assert first is not None and following is not None  # every phase starts
    kind, value = config.bounds[p] or (CHUNK, 0)
    bound = (kind, value + first.chunk_index if kind == CHUNK else value)
    return not _reached(bound, following.chunk_index, following.samples, following.tokens)


def phase_of_chunk(config: PhasedConfig, g: int) -> int:
    """The phase that global chunk ``g`` belongs to."""
    p = 0
    while (end := phase_end(config, p)) is not None and g >= end:
        p += 1
    return p


def is_finite(config: PhasedConfig) -> bool:
    """Whether the stream ends: the last phase it reaches ends."""
    last = len(config.phases) - 1
    if index.is_finite(config.phases[last]):
        return True
    reached = max(p for p in range(last + 1) if phase_start(config, p) is not None)
    return reached < last or index.is_finite(config.phases[reached])


def supports_indexing(config: PhasedConfig) -> bool:
    return not config.token_mode and scheduler(config.base) is not None and is_finite(config)


def remaining_samples(state: PhasedState, config: PhasedConfig) -> int:
    """Samples the lane will still produce from ``state`` (plans every chunk, no pointers; pure)."""
    if not is_finite(config):
        raise TypeError("this source repeats forever, so it has no length; set stop_after_passes, max_repeats "
                        "or a 'stop' policy to make it finite")
    total = 0
    if state.inner.requeue:
        total = region_samples(state.inner, config.phases[state.phase])
        state = dataclasses.replace(state, inner=past_region(state.inner, config.phases[state.phase]))
    chunk, state = step_phased(state, config)  # raises if the stream cannot start
    total += 0 if chunk is None else len(chunk)
    while chunk is not None:
        planned, p = plan_phased(state, config)
        if isinstance(planned, Ended):
            break
        total, state = total + sum(planned.quotas), PhasedState(p, planned.state, state.origin)
    return total


@dataclass(frozen=True, slots=True, eq=False)
class PhasedIndex:
    """The lane's stream as one random-access index per phase it reaches."""

    offsets: np.ndarray  # int64 (phases + 1,): samples before each phase's part, then the length
    parts: tuple[index.StreamIndex, ...]

    @property
    def length(self) -> int:
        return int(self.offsets[-1])


def _part(config: SourceConfig, start: SourceState, end: int | None, every: int) -> index.StreamIndex:
    """Index the lane's chunks of one phase: from ``start`` until its own chunk reaches ``end``."""
    arrays, ints, accs = _walk_arrays(start, len(config.datasets))
    kept_ints, kept_acc = [], []
    g, own, samples = start.chunk_index, 0, 0
    kernel = scheduler(config)
    assert kernel is not None  # build_phased_index checks supports_indexing first
    while True:
        first = own
        filled, g, own, samples, ended = kernel.index(g, *arrays, own, samples, 1, ints, accs, _BATCH)
        done = own - first  # chunks completed by this call; row k is the state before chunk first + k
        after = np.append(ints[1:filled, 0], g)[:done]  # the state's next global chunk after each of them
        inside = done if end is None else int(np.searchsorted(after, end, side="right"))
        rows = np.arange(inside)
        keep = rows[(first + rows) % every == 0]
        kept_ints.append(ints[keep].copy())
        kept_acc.append(accs[keep].copy())
        if inside < done or ended:
            return index.StreamIndex(every=every, ints=np.concatenate(kept_ints), acc=np.concatenate(kept_acc),
                                     length=int(ints[inside, 1]), chunks=first + inside, span=(start, end))


def build_phased_index(config: PhasedConfig, every: int = index.SNAPSHOT_EVERY) -> PhasedIndex:
    """Index the lane's stream, phase by phase (``TypeError`` if it is not indexable)."""
    if not supports_indexing(config):
        raise TypeError("this phased source has no random access: it is infinite, in token mode, or uses a "
                        "custom allocator")
    parts, offsets = [], [0]
    for p in range(len(config.phases)):
        start = phase_start(config, p)
        if start is None:
            break
        part = _part(config.phases[p], start.state, phase_end(config, p), every)
        parts.append(part)
        offsets.append(offsets[-1] + part.length)
    if offsets[-1] == 0:
        step_phased(initial_phased_state(config), config)  # raises the first-chunk error if there is one
    return PhasedIndex(np.array(offsets, dtype=np.int64), tuple(parts))


def samples_at(phased: PhasedIndex, config: PhasedConfig, positions: np.ndarray) -> np.ndarray:
    """The samples at ``positions`` (inside the stream) as ``(m, 3)`` int64: one lookup per phase."""
    out = np.empty((len(positions), 3), dtype=np.int64)
    phase = np.searchsorted(phased.offsets, positions, side="right") - 1
    for p in np.unique(phase).tolist():
        where = np.flatnonzero(phase == p)
        out[where] = index.samples_at(phased.parts[p], config.phases[p], positions[where] - phased.offsets[p])
    return out


def sample_at(phased: PhasedIndex, config: PhasedConfig, i: int) -> tuple[int, int, int]:
    p = int(np.searchsorted(phased.offsets, i, side="right")) - 1
    return index.sample_at(phased.parts[p], config.phases[p], i - int(phased.offsets[p]))
