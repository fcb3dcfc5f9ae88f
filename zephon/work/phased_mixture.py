"""PhasedMixtureWorkSource: a curriculum of mixtures that change at configured points of the run.

Each :class:`Phase` holds a mixture and the bound that ends it; datasets keep their cursors
across phases (a pass continues where it stood) and a phase may pause a dataset by leaving it
out. The static source's guarantees hold phase by phase: see ``zephon.core.phases``.
"""
from __future__ import annotations

import dataclasses
import logging
import numbers
import operator
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final, Mapping, Sequence, TypedDict, cast

from zephon.core import checkpoint, coverage, lane_checks, phases
from zephon.core.config import SourceConfig
from zephon.core.chunk import WorkChunk
from zephon.core.phases import PhasedConfig, PhasedState
from zephon.core.schedule import check_drawn, samples_read
from zephon.core.tokens import token_shares, with_ratios
from zephon.io import Dataset
from zephon.limits import (
    MAX_CHUNK_INDEX, MAX_PHASE_WALK, MAX_STATE_NODES, MAX_STREAM_SAMPLES, STATE_NODES_PER_DATASET, check_json, show,
)
from zephon.work._mixture import MixtureShell, check_history
from zephon.work._resolve import check_liveness, resolve
from zephon.work.spec import MixtureSpec

log = logging.getLogger("zephon")

KIND: Final = "zephon.PhasedMixtureWorkSource"
VERSION: Final = 1
KEY_PHASES: Final = "phases"  # Final: PhasedMixtureStateDict is indexed with them
KEY_PHASE: Final = "phase"
KEY_INNER: Final = "inner"
KEY_ORIGIN: Final = "origin"
_BOUNDS = (("until_chunk", phases.CHUNK), ("until_sample", phases.SAMPLE), ("until_token", phases.TOKEN))
_FARTHEST = {"until_chunk": MAX_PHASE_WALK, "until_sample": MAX_STREAM_SAMPLES, "until_token": MAX_CHUNK_INDEX}


@dataclass(frozen=True)
class Phase:
    """One phase of a curriculum: a mixture, and where it ends.

    Every phase but the last sets exactly one bound; the last sets none (it is open-ended,
    and the usual policies end the stream).

    Parameters
    ----------
    mixture : MixtureSpec or Mapping[str, float]
        Weights of the datasets read in this phase. A dataset left out (or given weight 0)
        is paused: it keeps its cursor and is not read until a later phase gives it weight.
    until_chunk : int or None, default None
        The phase ends before this global chunk index.
    until_sample : int or None, default None
        The phase ends at the first chunk boundary where the whole stream (every lane) has
        produced at least this many samples since the start of the run.
    until_token : int or None, default None
        Token mode only: the phase ends at the first chunk boundary where the stream holds at
        least this many estimated tokens (the token cost model of ``TokenEstimation``).
    """

    mixture: Any
    until_chunk: int | None = None
    until_sample: int | None = None
    until_token: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.mixture, (MixtureSpec, Mapping)):
            raise TypeError(f"Phase mixture must be a MixtureSpec or a mapping name -> weight, got {self.mixture!r}")
        for parameter, _ in _BOUNDS:
            value = getattr(self, parameter)
            if value is not None and (type(value) is bool or not isinstance(value, numbers.Integral) or value < 1):
                raise ValueError(f"Phase {parameter} must be an int >= 1 or None, got {show(value)}; pass e.g. 1000")
            if value is not None and int(value) > _FARTHEST[parameter]:
                raise ValueError(f"Phase {parameter}={show(value)} lies beyond {_FARTHEST[parameter]}, farther than "
                                 "zephon walks to find where a phase ends (zephon.limits); lower it, or leave the "
                                 "bound off the last phase")
        if len([p for p, _ in _BOUNDS if getattr(self, p) is not None]) > 1:
            raise ValueError(f"a Phase ends at one bound, got {self.bound()!r}; set only one of until_chunk, "
                             f"until_sample, until_token")

    def bound(self) -> tuple[str, int] | None:
        """``(kind, value)`` of the bound set, or None for an open-ended phase."""
        for parameter, kind in _BOUNDS:
            if getattr(self, parameter) is not None:
                return kind, int(getattr(self, parameter))
        return None

    def weights(self, names: Sequence[str]) -> dict[str, float]:
        """The phase's positive weights by name, in mixture order (raises on unknown names)."""
        given = self.mixture.weights if isinstance(self.mixture, MixtureSpec) else dict(self.mixture)
        unknown = [n for n in given if n not in names]
        if unknown:
            raise ValueError(f"Phase mixture names unknown datasets {unknown}; known: {list(names)}")
        positive = {n: w for n, w in given.items() if not (isinstance(w, numbers.Real) and not isinstance(w, bool)
                                                               and w == 0)}
        if not positive:
            raise ValueError(f"a Phase mixture needs a positive weight, got {given!r}; give a dataset weight > 0")
        return dict(MixtureSpec(positive).weights)


def _phases(value: Any, token_mode: bool) -> list[Phase]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"phases must be a non-empty list of Phase, got {value!r}")
    for k, phase in enumerate(value):
        if not isinstance(phase, Phase):
            raise TypeError(f"phases[{k}] must be a zephon.work.Phase, got {phase!r}")
        last = k == len(value) - 1
        if last and phase.bound() is not None:
            raise ValueError(f"the last phase is open-ended, but phases[{k}] sets {phase.bound()}; drop its bound")
        if not last and phase.bound() is None:
            raise ValueError(f"phases[{k}] needs until_chunk, until_sample or until_token (only the last phase is "
                             "open-ended)")
        if phase.until_token is not None and not token_mode:
            raise ValueError(f"phases[{k}] sets until_token, which needs token_estimation; use until_sample")
    for kind in (phases.CHUNK, phases.SAMPLE, phases.TOKEN):
        values = [p.bound()[1] for p in value[:-1] if p.bound()[0] == kind]
        if values != sorted(set(values)):
            raise ValueError(f"phase bounds of one kind must increase, got {kind} bounds {values}")
    return list(value)


def phase_config(base: SourceConfig, weights: dict[str, float]) -> SourceConfig:
    """``base`` with a phase's weights (0 for paused datasets), summed in the phase's order."""
    names = list(base.names)
    plans = [dataclasses.replace(d, weight=weights.get(d.name, 0.0)) for d in base.datasets]
    order = tuple(names.index(n) for n in weights) + tuple(c for c, n in enumerate(names) if n not in weights)
    return dataclasses.replace(base, datasets=tuple(plans), weight_order=order)


def _check_phase(config: SourceConfig, k: int) -> None:
    """Per-phase liveness (the static source's rule over the phase's active datasets)."""
    active = [d for d in config.datasets if d.weight > 0.0]
    shares = token_shares(active) if config.token_mode else None
    try:
        check_liveness(active, config.chunk_size, config.allocator, shares)
    except ValueError as error:
        raise ValueError(f"phase {k}: {error}") from None


class PhasedMixtureWorkSource(MixtureShell):
    """Mix ``datasets`` by a sequence of mixtures: ``phases[k]`` governs until its bound.

    Parameters
    ----------
    datasets : Sequence[Dataset]
        The datasets of every phase (dataset ids are positions in this list).
    phases : Sequence[Phase]
        The curriculum; every phase but the last ends at a bound (see :class:`Phase`).
    chunk_size, seed, shuffle_shards, shuffle_within_shard, shuffle_block_size, exhausted_policy, \
    reshuffle_on_repeat, max_repeats, stop_after_passes, lane_assignment, allocation, token_estimation, \
    pass_tail
        As for :class:`StaticMixtureWorkSource`, with the same defaults (``chunk_size=16384``,
        ``seed=0``, ``shuffle_shards=True``, ``shuffle_within_shard=False``,
        ``shuffle_block_size=None``, ``exhausted_policy=None``, ``reshuffle_on_repeat=True``,
        ``max_repeats=None``, ``stop_after_passes="auto"``, ``lane_assignment="permute"``,
        ``allocation="accumulator"``, ``token_estimation=None``, ``pass_tail="carry"``); they apply
        to every phase.
        ``stop_after_passes`` counts every dataset, so the last phase must then give each
        dataset a weight.

    Datasets keep their cursors across phases; allocator state restarts at each boundary.
    Liveness is checked per phase at construction (token mode: once primed).
    """

    _core_step = staticmethod(phases.step_phased)
    _core_initial = staticmethod(phases.initial_phased_state)
    _core_remaining = staticmethod(phases.remaining_samples)
    _core_index = staticmethod(phases.build_phased_index)
    _core_sample = staticmethod(phases.sample_at)
    _core_samples = staticmethod(phases.samples_at)
    _core_indexable = staticmethod(phases.supports_indexing)
    _core_bind = staticmethod(phases.bind)
    _core_end = staticmethod(phases.stream_end_phased)
    _core_token = staticmethod(phases.phased_token)
    _core_of_token = staticmethod(phases.phased_of_token)
    _core_token_chunk = staticmethod(phases.phased_token_chunk_index)

    @staticmethod
    def _core_to_json(state: PhasedState, config: PhasedConfig) -> PhasedMixtureStateDict:
        return state_to_json(state, config)  # defined below the class

    @staticmethod
    def _core_coverage(state: PhasedState, config: PhasedConfig) -> dict[str, coverage.DatasetCoverage]:
        return coverage.coverage(state.inner, config.base)

    def __init__(
        self,
        datasets: Sequence[Dataset],
        phases: Sequence[Phase],
        chunk_size: int = 16384,
        seed: int = 0,
        shuffle_shards: bool = True,
        shuffle_within_shard: bool = False,
        shuffle_block_size: int | str | None = None,
        exhausted_policy: str | Mapping[str, str] | None = None,
        reshuffle_on_repeat: bool | Mapping[str, bool] = True,
        max_repeats: int | Mapping[str, int | None] | None = None,
        stop_after_passes: int | str | None = "auto",
        lane_assignment: str = "permute",
        allocation: Any = "accumulator",
        token_estimation: Any = None,
        pass_tail: str | Mapping[str, str] = "carry",
    ):
        schedule = _phases(phases, token_estimation is not None)
        names = [d.name for d in datasets] if isinstance(datasets, Sequence) else []
        mixtures = [p.weights(names) for p in schedule]
        base = resolve(
            datasets, {n: 1.0 for n in names}, chunk_size=chunk_size, seed=seed, shuffle_shards=shuffle_shards,
            shuffle_within_shard=shuffle_within_shard, shuffle_block_size=shuffle_block_size,
            exhausted_policy=exhausted_policy, reshuffle_on_repeat=reshuffle_on_repeat,
            max_repeats=max_repeats, stop_after_passes=stop_after_passes,
            lane_assignment=lane_assignment, allocation=allocation, token_estimation=token_estimation,
            pass_tail=pass_tail, liveness=False,
        )
        paused = [n for n in names if n not in mixtures[-1]]
        if base.stop_after_passes is not None and paused:
            raise ValueError(f"stop_after_passes={base.stop_after_passes} needs every dataset in the last phase, "
                             f"but it pauses {paused}; give them a weight there or use max_repeats")
        config = PhasedConfig(phases=tuple(phase_config(base, m) for m in mixtures),
                              bounds=tuple(p.bound() for p in schedule))
        if config.primed:
            for k, phase in enumerate(config.phases):
                _check_phase(phase, k)
        self._setup(config, datasets, token_estimation)

    def state_dict(self) -> PhasedMixtureStateDict:
        """The checkpoint: the phase, the static checkpoint inside it and the phases' fingerprint
        (see :class:`~zephon.work.PhasedMixtureStateDict` for its keys)."""
        return cast(PhasedMixtureStateDict, self._checkpoint(self._state))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint (strict: same datasets, settings and phases, same lane).

        A state made by ``zephon.work.migrate`` carries the run's migration history, where the
        migrated stream's phase 0 started, and the sample orders it kept; they are restored.
        """
        check_state(state, len(self._config.phases), len(self._config.datasets))
        self._check_lane_header(state)
        if state[KEY_PHASES] != self._config.fingerprint()[KEY_PHASES]:
            raise ValueError(f"checkpoint was taken with other phases: {show(state[KEY_PHASES])}, this source has "
                             f"{show(self._config.fingerprint()[KEY_PHASES])}; restore it into a source with the "
                             "same phases, or change course with zephon.work.migrate")
        checkpoint.check_header(state[KEY_INNER], self._config.phases[state[KEY_PHASE]])
        self._restore(state, checked=False)

    def restore_checked(self, state: Mapping[str, Any]) -> None:
        """``load_state_dict`` of a checkpoint already checked for this source's settings: its
        form, size, seal, settings and phases are not checked again (its lane and positions are).
        A subclass that restores its own way (overrides ``load_state_dict``) is restored by it."""
        if type(self).load_state_dict is not PhasedMixtureWorkSource.load_state_dict:
            self.load_state_dict(state)
            return
        self._check_lane_header(state)
        self._restore(state, checked=True)

    def _restore(self, state: Mapping[str, Any], checked: bool) -> None:
        p, inner = state[KEY_PHASE], state[KEY_INNER]
        self._check_lane_header(inner)
        history = check_history(state.get(checkpoint.KEY_MIGRATIONS, []))
        config = with_orders(self._config, inner.get(checkpoint.KEY_ORDERS))
        ratios = checkpoint.ratios_from_json(inner, config.phases[p])
        config = self._core_with_ratios(ratios, config) if ratios else config
        origin = state.get(KEY_ORIGIN)
        restored = PhasedState(p, checkpoint.state_from_json(inner, config.phases[p], checked),
                               None if origin is None else checkpoint.parse_state(origin, config.base))
        _check_in_phase(config, restored, migrated=bool(history))
        self._state = restored
        self._config, self._index, self._history = config, None, history

    def _core_with_ratios(self, ratios: dict[str, tuple[float, str]], config: PhasedConfig | None = None
                          ) -> PhasedConfig:
        """The config (this source's by default) with these token ratios in every phase, each
        phase checked for liveness."""
        config = config or self._config
        if all((d.token_ratio, d.ratio_origin) == ratios.get(d.name, (d.token_ratio, d.ratio_origin))
               for d in config.phases[0].datasets):
            return config  # the same ratios: keep the resolved phase starts (a walk in token mode)
        updated = tuple(with_ratios(phase, ratios) for phase in config.phases)
        for k, phase in enumerate(updated):
            _check_phase(phase, k)
        return phases.with_phases(config, updated)

    def next_chunk(self) -> WorkChunk | None:
        """The lane's next chunk, or None at the end of its stream. A phase that hands over
        before its bound (its datasets ran out, or their rules end them: only the last phase
        ends the stream) is said on the ``zephon`` logger (INFO) when the lane passes it."""
        before = self._state.phase
        chunk = super().next_chunk()
        for p in range(before, self._state.phase):
            if phases.ended_early(self._config, p, self._state.origin):
                start = phases.phase_start(self._config, p + 1, self._state.origin)
                assert start is not None  # every phase starts
                kind, value = self._config.bounds[p] or ("", 0)
                log.info("zephon: %r: phase %d could not go on to its bound until_%s=%d (its datasets ran out, or "
                         "their rules end them); phase %d starts at global chunk %d", self, p, kind, value, p + 1,
                         start.chunk_index)
        return chunk

    def phase_of_chunk(self, chunk_index: int) -> int:
        """The phase that governs global chunk ``chunk_index`` (resolves the phase bounds once)."""
        return phases.phase_of_chunk(self._config, chunk_index)

    def phase_starts(self) -> list[int | None]:
        """The global chunk where each phase starts: where the phase before it reaches its bound,
        or where it cannot go on (a phase that starts where the next one does has no chunk); for
        a migrated stream, counted from where it started."""
        origin = self._state.origin
        return [None if s is None else s.chunk_index
                for s in (phases.phase_start(self._config, p, origin) for p in range(len(self._config.phases)))]


def check_state(state: Any, count: int, datasets: int) -> None:
    """Refuse anything but an intact phased checkpoint of this version for ``count`` phases:
    bounded plain JSON, kind, version, exactly the keys ``state_to_json`` writes (and those a
    migration adds), a phase index in range, and the digest."""
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint must be a dict (from state_dict()), got {type(state).__name__}")
    check_json(state, "checkpoint", MAX_STATE_NODES + STATE_NODES_PER_DATASET * datasets * (count + 1))
    if state.get(checkpoint.KEY_KIND) != KIND:
        raise ValueError(f"checkpoint kind is {show(state.get(checkpoint.KEY_KIND))}, expected {KIND!r}; pass a "
                         "state_dict() of this source type")
    if type(state.get(checkpoint.KEY_VERSION)) is not int or state[checkpoint.KEY_VERSION] != VERSION:
        raise ValueError(f"checkpoint version {show(state.get(checkpoint.KEY_VERSION))} is not supported (this "
                         f"zephon reads version {VERSION}); restore it with the zephon version that wrote it")
    required = {checkpoint.KEY_KIND, checkpoint.KEY_VERSION, checkpoint.KEY_LANE, checkpoint.KEY_REPLICAS,
                KEY_PHASES, KEY_PHASE, KEY_INNER, checkpoint.KEY_DIGEST}
    if not required <= set(state) <= required | {KEY_ORIGIN, checkpoint.KEY_MIGRATIONS}:
        raise ValueError(f"checkpoint keys must be {sorted(required)} (and {KEY_ORIGIN!r}, "
                         f"{checkpoint.KEY_MIGRATIONS!r} after a migration), got {show(sorted(state))}; it is "
                         "truncated, edited or was not written by state_dict() of this source")
    if state[checkpoint.KEY_DIGEST] != checkpoint.digest(state):
        raise ValueError("state digest mismatch: the checkpoint was changed after state_dict() wrote it; restore "
                         "an unedited state_dict()")
    p = state[KEY_PHASE]
    if type(p) is not int or not 0 <= p < count:
        raise ValueError(f"checkpoint phase must be an int in [0, {count}), got {show(p)}")


class _PhasedMixtureStateKeys(TypedDict):
    kind: str  # KIND
    version: int  # VERSION
    lane: int | None  # the lane binding (None: the template)
    canonical_replicas: int | None
    phases: list[dict[str, Any]]  # per phase: its normalised weights, mixture order and end (``until``)
    phase: int  # the phase the stream is in
    inner: checkpoint.StaticMixtureStateDict  # the stream inside that phase
    digest: str  # sha256 of the rest as canonical JSON (32 hex digits)


class PhasedMixtureStateDict(_PhasedMixtureStateKeys, total=False):
    """The JSON checkpoint of a :class:`~zephon.work.PhasedMixtureWorkSource` (its ``state_dict()``).

    Always: ``kind``, ``version``, the lane binding (``lane``, ``canonical_replicas``; None for
    the template), the ``phases`` (their weights and ends), the current ``phase``, the
    :class:`~zephon.work.StaticMixtureStateDict` of the stream ``inner`` that phase, and the
    ``digest``. After a migration: ``origin`` (where the migrated stream's phase 0 started, a
    :class:`~zephon.work.SourceStateDict`) and ``migrations`` (the run's migration history).
    """

    origin: checkpoint.SourceStateDict
    migrations: list[checkpoint.MigrationRecord]


def state_to_json(state: PhasedState, config: PhasedConfig) -> PhasedMixtureStateDict:
    """The checkpoint of ``state`` under ``config`` (plain JSON)."""
    out: PhasedMixtureStateDict = {
        checkpoint.KEY_KIND: KIND,
        checkpoint.KEY_VERSION: VERSION,
        checkpoint.KEY_LANE: config.lane,
        checkpoint.KEY_REPLICAS: config.canonical_replicas,
        KEY_PHASES: config.fingerprint()[KEY_PHASES],
        KEY_PHASE: state.phase,
        KEY_INNER: checkpoint.state_to_json(state.inner, config.phases[state.phase]),
        checkpoint.KEY_DIGEST: "",  # sealed() computes it, and puts it last
    }
    if state.origin is not None:
        out[KEY_ORIGIN] = checkpoint.state_to_json(state.origin, config.base)[checkpoint.KEY_STATE]
    return checkpoint.sealed(out)


def with_orders(config: PhasedConfig, orders: Any) -> PhasedConfig:
    """``config`` with the sample orders a migration kept, in every phase."""
    if not orders:
        return config
    return phases.with_phases(config, tuple(checkpoint.with_orders(phase, orders) for phase in config.phases))


def _check_in_phase(config: PhasedConfig, state: PhasedState, migrated: bool) -> None:
    """A restored state's chunk lies in its phase and agrees with its cursors (the digest is over
    the state alone, so a re-sealed state could name any chunk). A migrated stream re-serves
    its requeued samples first, before its phase 0 starts, and drew its cursors under another
    mixture: only its phase's end bounds it."""
    p, g = state.phase, state.inner.chunk_index
    start, end = phases.phase_start(config, p, state.origin), phases.phase_end(config, p, state.origin)
    if start is None or (end is not None and g > end):
        where = "is never reached" if start is None else f"ends at chunk {end}"
        raise ValueError(f"checkpoint is in phase {p} at chunk {g}, but phase {p} {where}; the checkpoint is corrupted")
    if migrated or state.inner.requeue:
        return
    if g < start.chunk_index:
        raise ValueError(f"checkpoint is in phase {p} at chunk {g}, but phase {p} starts at chunk "
                         f"{start.chunk_index}; the checkpoint is corrupted")
    check_drawn(state.inner, config.phases[p], start.state)


_MIXED = object()  # _uniform: the lanes' values differ (or are not shown to be one)


def all_restore(config: PhasedConfig, shared: dict[str, Any], fields: Any, lanes: Sequence[int],
                replicas: int) -> bool:
    """Whether every ``lanes[k]``'s checkpoint, ``shared`` plus lane ``k`` of ``fields`` (sealed,
    its ``inner`` state sealed first), restores into lane ``lanes[k]`` of ``replicas`` of a
    ``PhasedMixtureWorkSource`` over ``config``: the checks of its ``load_state_dict``, column
    by column, for lanes in one phase, never migrated (``zephon.core.lane_checks.all_restore``
    checks their inner states from the phase's start). False: not shown, check lane by lane."""
    if not (_header_fits(config, shared, replicas) and type(fields) is dict
            and fields.keys() == {checkpoint.KEY_LANE, KEY_INNER} and type(fields[checkpoint.KEY_LANE]) is list
            and all(type(lane) is int for lane in fields[checkpoint.KEY_LANE])
            and fields[checkpoint.KEY_LANE] == list(lanes)):
        return False
    inner, p = fields[KEY_INNER], shared[KEY_PHASE]
    if not (type(inner) is dict and inner.keys() == _INNER_KEYS):
        return False
    header = {key: _uniform(inner[key]) for key in lane_checks.SHARED_KEYS}
    start = phases.phase_start(config, p)
    if _MIXED in header.values() or start is None or not _bounded(config, shared, fields):
        return False
    phase = config.phases[p]
    body = {checkpoint.KEY_LANE: inner[checkpoint.KEY_LANE], checkpoint.KEY_STATE: inner[checkpoint.KEY_STATE]}
    since = (start.chunk_index, samples_read(phase, start.state.cursors))
    return (lane_checks.all_restore(phase, header, body, lanes, replicas, since)
            and _within(config, p, max(body[checkpoint.KEY_STATE][checkpoint.KEY_CHUNK])))


def _within(config: PhasedConfig, p: int, last: int) -> bool:
    """Whether chunk ``last`` lies within phase ``p`` (of a stream never migrated), which starts
    at it or before. A chunk bound settles it without finding where the phase ends, a walk of
    the schedule up to it (0.33 s for a bound of 10^7 chunks) that the first chunk read makes
    anyway: the phase ends at its bound, or the stream ends first."""
    bound = config.bounds[p]
    if bound is not None and bound[0] == phases.CHUNK and last <= bound[1]:
        return True
    end = phases.phase_end(config, p)
    return end is None or last <= end


_INNER_KEYS = lane_checks.SHARED_KEYS | {checkpoint.KEY_LANE, checkpoint.KEY_STATE}  # an inner state, its seal left out


def _header_fits(config: PhasedConfig, shared: dict[str, Any], replicas: int) -> bool:
    """The shared keys are exactly the header of a lane of ``replicas``, in a phase of ``config``."""
    p = shared.get(KEY_PHASE)
    return (shared.keys() == {checkpoint.KEY_KIND, checkpoint.KEY_VERSION, checkpoint.KEY_REPLICAS, KEY_PHASES,
                              KEY_PHASE}
            and shared[checkpoint.KEY_KIND] == KIND and type(shared[checkpoint.KEY_VERSION]) is int
            and shared[checkpoint.KEY_VERSION] == VERSION and type(shared[checkpoint.KEY_REPLICAS]) is int
            and shared[checkpoint.KEY_REPLICAS] == replicas and type(p) is int and 0 <= p < len(config.phases)
            and shared[KEY_PHASES] == config.fingerprint()[KEY_PHASES])


def _uniform(column: Any) -> Any:
    """The value every lane has in ``column`` (a list per lane, or a dict of such columns, as
    ``zephon.runtime._columns.select`` gives them), where each lane's is one and the same
    object (a value a loader state keeps once); ``_MIXED`` otherwise."""
    if type(column) is dict:
        out = {key: _uniform(value) for key, value in column.items()}
        return _MIXED if _MIXED in out.values() else out
    first = column[0] if type(column) is list and column else _MIXED
    return first if all(map(operator.is_, column, repeat(first))) else _MIXED


def _bounded(config: PhasedConfig, shared: dict[str, Any], fields: dict[str, Any]) -> bool:
    """The first lane's checkpoint is within the size ``check_state`` allows (every lane's is as
    large: the checked columns hold numbers in one form)."""
    first = lane_checks.first_lane(fields)
    first[KEY_INNER][checkpoint.KEY_DIGEST] = "0" * 32
    try:
        check_json({**shared, **first, checkpoint.KEY_DIGEST: "0" * 32}, "checkpoint",
                   MAX_STATE_NODES + STATE_NODES_PER_DATASET * len(config.datasets) * (len(config.phases) + 1))
    except ValueError:
        return False
    return True
