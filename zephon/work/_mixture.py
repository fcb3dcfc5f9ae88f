"""The shell every built-in mixture source shares: a ``(config, state)`` pair and pure core calls.

A subclass names its core: ``_core_step`` (the pure step), ``_core_initial`` (the state at the
start), ``_core_remaining`` (samples left from a state), ``_core_index`` / ``_core_sample`` /
``_core_samples`` (random access), ``_core_indexable``, ``_core_bind`` (the config bound to a
lane), ``_core_to_json`` (a state's checkpoint), ``_core_token`` / ``_core_of_token`` (a state
as plain numbers and back) and ``_core_with_ratios`` (token ratios set and checked).
Everything else (lanes, priming, ``len``, lookups and their argument checks) lives here once.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Protocol, TypeVar, cast, get_type_hints

import numpy as np

from zephon.core import checkpoint
from zephon.core.checkpoint import KEY_MIGRATIONS, MigrationRecord
from zephon.core.coverage import DatasetCoverage, end_report
from zephon.core.chunk import SampleId, WorkChunk
from zephon.io import Dataset
from zephon.limits import show
from zephon.work._priming import cached_ratio
from zephon.work.source import WorkSource

log = logging.getLogger("zephon")
MAX_HISTORY = 8  # migrations a state remembers (the most recent)
_HISTORY_KEYS: dict[str, type] = get_type_hints(MigrationRecord)  # each key's exact type
Shell = TypeVar("Shell", bound="MixtureShell")
State = TypeVar("State", bound=Mapping[str, Any])  # a source's checkpoint (StaticMixtureStateDict, PhasedMixtureStateDict)


class Indexed(Protocol):
    """What the shell reads of a core's random-access index."""

    @property
    def length(self) -> int: ...


def check_history(value: Any) -> tuple[MigrationRecord, ...]:
    """Validate a state's migration history: at most ``MAX_HISTORY`` small records."""
    if not isinstance(value, list) or len(value) > MAX_HISTORY:
        raise ValueError(f"checkpoint migrations must be a list of at most {MAX_HISTORY} records, got {value!r}")
    for entry in value:
        if not (isinstance(entry, dict) and set(entry) == set(_HISTORY_KEYS)
                and all(type(entry[k]) is t for k, t in _HISTORY_KEYS.items())):
            raise ValueError(f"checkpoint migration record must be {sorted(_HISTORY_KEYS)} with int/str/bool "
                             f"values, got {entry!r}; the checkpoint is corrupted")
    return tuple(cast(MigrationRecord, dict(e)) for e in value)  # checked right above


def with_history(state: State, history: tuple[MigrationRecord, ...]) -> State:
    """A sealed checkpoint with the run's migration history, if it has one (the digest covers it)."""
    if not history:
        return state
    marked = {**state, KEY_MIGRATIONS: [dict(h) for h in history]}
    return checkpoint.sealed(cast(State, marked))  # the checkpoint types all hold an optional "migrations"


class MixtureShell(WorkSource):
    """Shared behaviour of the mixture sources; see :class:`StaticMixtureWorkSource`."""

    _core_step: Callable[[Any, Any], tuple[WorkChunk | None, Any]]
    _core_initial: Callable[[Any], Any]
    _core_remaining: Callable[[Any, Any], int]
    _core_index: Callable[[Any], Indexed]
    _core_sample: Callable[[Any, Any, int], SampleId]
    _core_samples: Callable[[Any, Any, np.ndarray], np.ndarray]
    _core_indexable: Callable[[Any], bool]
    _core_bind: Callable[[Any, int, int], Any]
    _core_coverage: Callable[[Any, Any], dict[str, DatasetCoverage]]
    _core_end: Callable[[Any, Any], tuple[Any, int | None]]
    _core_to_json: Callable[[Any, Any], Any]
    _core_token: Callable[[Any], tuple[Any, ...]]
    _core_of_token: Callable[[tuple[Any, ...]], Any]
    _core_token_chunk: Callable[[tuple[Any, ...]], int]

    _history: tuple[MigrationRecord, ...] = ()  # the migrations this run went through (zephon.work.migrate)
    _end: tuple[Any, tuple[Any, int | None]] = (None, (None, None))  # (the lane's state at its end, _core_end's)

    def _with_history(self, state: State) -> State:
        return with_history(state, self._history)

    def _setup(self, config: Any, datasets: Any, estimation: Any) -> None:
        self._config, self._datasets, self._estimation = config, tuple(datasets), estimation
        self._state = self._core_initial(config)
        self._index: Indexed | None = None  # built on first random access

    def state_token(self) -> tuple[Any, ...]:
        """The core state as a tuple of plain numbers (a few per dataset)."""
        return self._core_token(self._state)

    def state_from_token(self, token: tuple[Any, ...]) -> Any:
        """The checkpoint of the state ``token`` holds, under this source's settings (see ``state_dict``)."""
        if type(token) is not tuple:
            raise TypeError(f"state_from_token takes what state_token() returns (a tuple), got {type(token).__name__}")
        return self._checkpoint(self._core_of_token(token))

    def token_chunk_index(self, token: tuple[Any, ...]) -> int:
        """The global chunk index of the state ``token`` (a ``state_token()``) holds, read
        without sealing it: a reader of many lanes finds the furthest of their states this way."""
        return self._core_token_chunk(token)

    def _checkpoint(self, state: Any) -> Any:
        """The sealed checkpoint of core ``state``, with the run's migration history."""
        return self._with_history(self._core_to_json(state, self._config))

    @property
    def config(self) -> Any:
        """The resolved configuration (frozen; includes the lane binding of a clone)."""
        return self._config

    @property
    def state(self) -> Any:
        """Where the source stands (frozen; a few numbers per dataset)."""
        return self._state

    def next_chunk(self) -> WorkChunk | None:
        """The lane's next chunk, or None at the end of its stream.

        The first None logs, on the ``zephon`` logger (INFO), what the end left unread of each
        dataset and the rule that stopped it; ``coverage()`` has the same figures.
        """
        self._check_producing()
        chunk, self._state = self._core_step(self._state, self._config)
        if chunk is None and self._end[0] is not self._state:
            self._end = (self._state, self._core_end(self._state, self._config))
            log.info("zephon: %r ended its stream (%s): %s", self, self._cause(self._end[1][1]), end_report(
                self._config.datasets, self._config.stop_after_passes, self.coverage()))
        return chunk

    def ended_by(self) -> str | None:
        """The dataset whose rule ends the stream (a ``"stop"`` dataset that cannot supply its
        quota, a repeat limit), or None when it ends because every dataset is done. Walked on
        numbers from the current state: nothing is drawn, read or logged."""
        dataset = self._core_end(self._state, self._config)[1]
        return None if dataset is None else str(self._config.datasets[dataset].name)

    def _cause(self, dataset: int | None) -> str:
        return "every dataset done" if dataset is None else f"ended by {self._config.datasets[dataset].name!r}"

    def component_ids(self) -> dict[str, int]:
        return {d.name: i for i, d in enumerate(self._config.datasets)}

    @property
    def datasets_by_id(self) -> dict[int, Dataset]:
        return dict(enumerate(self._datasets))

    def clone_for_lane(self: Shell, lane_id: int, canonical_replicas: int) -> Shell:
        """A clone bound to one lane; it shares the datasets and shard tables with the template."""
        self._check_can_clone(lane_id, canonical_replicas)
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._config = self._core_bind(self._config, lane_id, canonical_replicas)
        clone._index = None
        clone._lane, clone._replicas = lane_id, canonical_replicas
        return clone

    @property
    def requires_token_priming(self) -> bool:
        """True for a token-aware source until every dataset has its tokens-per-byte ratio."""
        return not self._config.primed

    def prime(self, *, progress: bool | None = None, **_: Any) -> None:
        """Measure the missing tokens-per-byte ratios (on the driver, before workers fork).

        Idempotent; a no-op in sample mode, once primed, or after a token-mode restore.
        """
        if self._config.primed:
            return
        self._config = self._core_with_ratios({
            d.name: cached_ratio(self._datasets[i], i, self._estimation, self._config.seed, progress)
            for i, d in enumerate(self._config.datasets) if d.token_ratio is None
        })
        self._index = None

    def _core_with_ratios(self, ratios: dict[str, tuple[float, str]]) -> Any:
        raise NotImplementedError

    def chunk_size_hint(self) -> int:
        size: int = self._config.chunk_size
        return size

    def supports_indexing(self) -> bool:
        """True for finite streams of the built-in allocators: ``len`` and ``sample_id_at`` work."""
        return self._core_indexable(self._config)

    def __len__(self) -> int:
        """Samples in the stream from its start: the lane's for a clone, all for the template.

        Sample mode reads it off the random-access index; token mode plans every chunk.
        """
        if self._config.token_mode:
            return self._core_remaining(self._core_initial(self._config), self._config)
        return self._stream_index().length

    @property
    def total_samples(self) -> int:
        """``len(self)``: the samples of the stream from its start (the seeds' name for it)."""
        return len(self)

    def sample_id_at(self, i: int) -> SampleId:
        """The ``i``-th sample of the stream in default read order (``IndexError`` outside it)."""
        stream = self._stream_index()
        if type(i) is not int or not 0 <= i < stream.length:  # the fast path costs two checks
            i = self._check_index(i)
        return self._core_sample(stream, self._config, i)

    def sample_ids_at(self, indices: Any) -> np.ndarray:
        """The samples at ``indices`` as an ``(n, 3)`` int64 array (one call for many lookups)."""
        positions = np.asarray(indices)
        if positions.ndim != 1 or (positions.size and positions.dtype.kind not in "iu"):
            raise TypeError(f"indices must be a 1-D sequence of ints, got {show(indices)}")
        length = len(self)
        if positions.size and (positions.min() < 0 or positions.max() >= length):
            bad = positions[(positions < 0) | (positions >= length)][0]
            raise IndexError(f"sample index {bad} is out of range [0, {length})")
        return self._core_samples(self._stream_index(), self._config, positions.astype(np.int64, copy=False))

    def remaining_samples(self) -> int:
        """Samples still to come from the current state (after a restore too)."""
        return self._core_remaining(self._state, self._config)

    def _stream_index(self) -> Indexed:
        if self._index is None:
            self._index = self._core_index(self._config)
        return self._index

    def _check_index(self, i: Any) -> int:
        if type(i) is bool or not isinstance(i, (int, np.integer)):
            raise TypeError(f"sample index must be an int, got {show(i)}")
        length = self._stream_index().length
        if not 0 <= i < length:
            raise IndexError(f"sample index {show(i)} is out of range [0, {length})")
        return int(i)

    def coverage(self) -> dict[str, DatasetCoverage]:
        """Per dataset name, what was read: ``passes_completed`` (passes read to their end),
        ``position`` and ``unread_in_pass`` (samples read and not read of the pass in progress),
        ``pass_length`` and ``never_read``, the samples of its passes so far that were skipped
        (0 under ``pass_tail="carry"``, the dropped tails under ``"drop"``).

        A lane's figures count every lane's chunks before its position; once ``next_chunk()``
        has returned None, those of the whole stream: what its end left unread.
        """
        state = self._end[1][0] if self._end[0] is self._state else self._state
        return self._core_coverage(state, self._config)

    def continues_after_exhaustion(self) -> frozenset[str]:
        """Names of the datasets that may drain while the others go on (``exhausted_policy='redistribute'``)."""
        return frozenset(d.name for d in self._config.datasets if d.policy == "redistribute")

    def __repr__(self) -> str:
        lane = "template" if self._lane is None else f"lane {self._lane} of {self._replicas}"
        return f"{type(self).__name__}({list(self._config.names)}, {lane}, chunk {self._state.chunk_index})"
