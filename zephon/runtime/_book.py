"""The lane book: which lanes a rank reads, and where each stands (shared by every torch front end)."""
from __future__ import annotations

import logging
from collections import ChainMap
from typing import Any, Callable, Mapping, Sequence

from zephon.core.checkpoint import canonical, digest
from zephon.core.lane_checks import all_restore
from zephon.runtime._gc import paused_gc
from zephon.runtime._lanes import check_mapping, rank_lanes, worker_lanes
from zephon.runtime._state import (
    ATTEMPT,
    Ledger,
    LoaderState,
    LoaderStateDict,
    dataset_differences,
    dataset_fingerprints,
    make_state,
    missing_lanes,
    parse_state,
    run_fingerprint,
)
from zephon.runtime._packed import check_operator, initial_operator
from zephon.runtime._sealing import SEALING_SOURCES, Entry
from zephon.runtime._stream import initial_entries
from zephon.runtime.pipeline import Pipeline
from zephon.work import PhasedMixtureWorkSource, StaticMixtureWorkSource, check_replicas, phased_mixture

log = logging.getLogger("zephon")
GROWTH = 8  # default lanes per reader of the first topology: room to grow 8x without an idle reader
IN_FLIGHT_BYTES = 32  # a pointer in flight: dataset, shard and offset, and its component id (int64 each)
IN_FLIGHT_WARNING = 1 << 30  # a reader's chunks in flight of this many bytes or more are said (say_in_flight)
_logged: set[str] = set()


_COLUMN_CHECKS: dict[type, Callable[[Any, dict[str, Any], Any, list[int], int], bool]] = {
    StaticMixtureWorkSource: all_restore, PhasedMixtureWorkSource: phased_mixture.all_restore}


def _all_restore(template: Any, ledger: Ledger, replicas: int, lanes: list[int]) -> bool:
    """Whether ``lanes`` of a state of sealed lane columns are shown, column by column, to restore
    into ``template`` (``zephon.core.lane_checks``); False: check each lane. Only for the
    sources of ``_COLUMN_CHECKS``, and a state that left out the seals their states nest."""
    check = _COLUMN_CHECKS.get(type(template))
    if check is None or ledger.seals != SEALING_SOURCES[type(template)]:
        return False
    fields = ledger.fields(lanes)
    return fields is not None and check(template.config, ledger.common, fields, lanes, replicas)


def log_once(message: str) -> None:
    """Log ``message`` (a warning) once per process."""
    if message not in _logged:
        _logged.add(message)
        log.warning(message)


def say_in_flight(source: Any, lanes: int, rank: int) -> None:
    """Warn (once) where a reader of ``lanes`` lanes holds ``IN_FLIGHT_WARNING`` bytes or more
    of chunks in flight (at least, ``IN_FLIGHT_BYTES`` a pointer): each lane holds a chunk of
    ``chunk_size`` pointers, so one process that reads thousands of lanes (a large run resumed
    on a few GPUs) holds gigabytes."""
    chunk = source.chunk_size_hint()
    if chunk is not None and lanes * chunk * IN_FLIGHT_BYTES >= IN_FLIGHT_WARNING:
        log_once(f"zephon: a reader of rank {rank} reads {lanes} lanes, each with a chunk of {chunk} pointers in "
                 f"flight: about {lanes * chunk * IN_FLIGHT_BYTES / (1 << 30):.1f} GiB; more readers (DataLoader "
                 "workers or ranks) or a smaller chunk_size hold less")


def default_replicas(readers: int) -> int:
    """The lanes of a run that did not choose ``canonical_replicas``: ``GROWTH`` per first reader.

    Any later topology of up to ``GROWTH`` times as many readers (ranks x workers) gives every
    reader a lane; lane counts of readers differ by at most one whenever the lanes divide
    unevenly. Each lane holds one chunk in flight in its reader, so a reader holds about
    ``GROWTH`` chunks (``GROWTH x chunk_size x 32`` bytes of pointers).
    """
    return GROWTH * max(1, readers)


def attempt_of(state: Any, parsed: LoaderState) -> str:
    """What every rank resuming from ``state`` shares (16 hex digits), to tell this attempt's
    checkpoint files from those of another attempt at the same steps: the digest of a global
    state, else (each rank loaded its own lanes) one derived from the attempt that saved them."""
    ranks, world = parsed.topology.get("ranks"), parsed.topology.get("world_size")
    one_rank = isinstance(ranks, list) and len(ranks) == 1 and type(world) is int and world > 1
    if len(parsed.entries) == parsed.canonical_replicas and not one_rank:
        return digest(state)[:16]
    return digest({"resumed": canonical([parsed.topology.get(ATTEMPT), parsed.run])})[:16]


class LaneBook:
    """Lanes of one rank (``rank`` of ``world_size``) over ``pipeline``, and their ledger entries;
    validates and adopts checkpoints. ``mapping`` maps lanes to ranks.

    ``canonical_replicas`` is fixed on first use: the value asked for, else the one of a
    loaded checkpoint, else :func:`default_replicas` of the first topology (``world_size``
    ranks of ``readers`` readers each).
    """

    def __init__(self, pipeline: Pipeline, *, canonical_replicas: int | None, mapping: str, rank: int, world_size: int,
                 readers: int = 1):
        if canonical_replicas is not None:
            check_replicas(canonical_replicas)
        self.pipeline = pipeline
        self.mapping = check_mapping(mapping)
        self.rank, self.world_size, self.readers = rank, world_size, readers
        self._requested = canonical_replicas
        self._replicas: int | None = None
        self._fixed = canonical_replicas  # asked for, or a loaded checkpoint's
        self._entries: Mapping[int, Entry] | None = None  # None: every lane at its start
        self._operators: dict[int, Any] = {}  # a packed pipeline's lane -> operator state (absent: at its start)
        self._datasets = dataset_fingerprints(pipeline.datasets_by_id)
        self._attempt: str | None = None  # None: started fresh; else attempt_of the state loaded
        self._checked: set[int] = set()  # lanes of the loaded state checked to restore here (see entries)

    @property
    def canonical_replicas(self) -> int:
        if self._replicas is None:
            self._replicas = self._requested or default_replicas(self.world_size * self.readers)
        return self._replicas

    @property
    def fixed_replicas(self) -> int | None:
        """The lane count if the run fixed it (asked for, or a loaded checkpoint's); None while it is a default."""
        return self._fixed

    def known(self, lanes: Sequence[int]) -> bool:
        """Whether the book holds a position for every one of ``lanes``."""
        return self._entries is None or all(lane in self._entries for lane in lanes)

    def rank_lanes(self) -> list[int]:
        lanes = rank_lanes(self.canonical_replicas, self.rank, self.world_size, self.mapping)
        if not lanes:
            log_once(f"zephon: rank {self.rank} of {self.world_size} owns no lane (canonical_replicas="
                     f"{self.canonical_replicas}); it stays idle")
        return lanes

    def worker_lanes(self, worker: int, num_workers: int) -> list[int]:
        return worker_lanes(self.rank_lanes(), worker, num_workers, self.mapping)

    def entries(self, lanes: Sequence[int] | None = None) -> dict[int, Entry]:
        """Ledger entries of ``lanes`` (default: the rank's). Each lane's state is one its source
        made or one checked to restore here: a loaded state's lanes that :meth:`load` did not
        check (other ranks', counted for equal steps) are checked now (``ValueError``)."""
        lanes = self.rank_lanes() if lanes is None else lanes
        if self._entries is None:
            return initial_entries(self.pipeline.source, lanes, self.canonical_replicas)
        missing = [lane for lane in lanes if lane not in self._entries]
        if missing:
            raise RuntimeError(f"zephon: no position for lanes {missing}; load a state that covers them")
        moved, loaded = self._layers()
        unchecked = [lane for lane in lanes if lane not in moved and lane not in self._checked]
        with paused_gc():  # thousands of lanes' states, made from a loaded state's columns and sealed
            if loaded is not None and unchecked:
                self._check_lanes(loaded, self.canonical_replicas, unchecked, self._operators)
                self._checked.update(unchecked)
            return {lane: self._entries[lane] for lane in lanes}

    def saved_entries(self, lanes: Sequence[int] | None = None) -> dict[int, Entry]:
        """:meth:`entries` as a saved state takes them: where the source seals its states (and a
        saved state leaves the seals out), lanes still at a loaded position keep their states as
        loaded, unsealed (sealing costs tens of microseconds a lane)."""
        lanes = self.rank_lanes() if lanes is None else lanes
        moved, loaded = self._layers()
        if loaded is None or type(self.pipeline.source) not in SEALING_SOURCES or \
                not all(lane in moved or lane in loaded for lane in lanes):
            return self.entries(lanes)  # (which raises for lanes without a position)
        still = loaded.plain([lane for lane in lanes if lane not in moved])
        return {lane: moved[lane] if lane in moved else still[lane] for lane in lanes}

    def _layers(self) -> tuple[Mapping[int, Entry], Ledger | None]:
        """The lanes moved since a state was loaded, and the loaded ledger (None: none loaded)."""
        entries = self._entries
        if isinstance(entries, ChainMap):
            moved, base = entries.maps
            return moved, base if isinstance(base, Ledger) else None
        return {}, entries if isinstance(entries, Ledger) else None

    def operators(self, lanes: Sequence[int] | None = None) -> dict[int, Any]:
        """A packed pipeline's operator states of ``lanes`` (default: the rank's); {} unpacked."""
        packing = self.pipeline.packing
        if packing is None:
            return {}
        lanes = self.rank_lanes() if lanes is None else lanes
        return {lane: self._operators.get(lane) or initial_operator(packing) for lane in lanes}

    def update(self, entries: Mapping[int, Entry], operators: Mapping[int, Any] | None = None) -> None:
        """Record the positions (and operator states) of some lanes (e.g. after an iteration)."""
        self._operators.update(operators or {})
        base = self._entries if self._entries is not None else self.entries()
        moved = dict(entries)
        if isinstance(base, ChainMap):  # one layer of moved lanes over what was loaded
            moved, base = {**base.maps[0], **moved}, base.maps[1]
        self._entries = ChainMap(moved, base)  # type: ignore[arg-type]  # ChainMap writes to its first map only

    def state(self, entries: Mapping[int, Entry], num_workers: int | None,
              operators: Mapping[int, Any] | None = None, batch_size: int | None = None,
              in_epoch: int = 0) -> LoaderStateDict:
        """The JSON state of ``entries`` and, packed, the lanes' ``operators`` (default: the
        book's), ``in_epoch`` batches into the loader's iteration."""
        topology: dict[str, Any] = {"world_size": self.world_size, "ranks": [self.rank], "mapping": self.mapping,
                                    "num_workers": num_workers}
        if batch_size is not None:
            topology["batch_size"] = batch_size
        if self._attempt is not None:
            topology[ATTEMPT] = self._attempt
        packing = self.pipeline.packing
        named = None
        if packing is not None:
            states = {**self.operators(sorted(entries)), **(operators or {})}
            named = {packing.name: states}
        nested = SEALING_SOURCES.get(type(self.pipeline.source))
        return make_state(self.canonical_replicas, entries, self._datasets, topology, run=self.run, operators=named,
                          sealed_by_source=nested is not None, nested=nested or (), in_epoch=in_epoch)

    @property
    def run(self) -> str:
        """The run's fingerprint (``run_fingerprint``): its source, lane count and datasets."""
        return run_fingerprint(self.pipeline.source, self.canonical_replicas, self._datasets)

    def check(self, state: Any, worker: tuple[int, int] = (0, 1)) -> LoaderState:
        """Validate ``state`` against this pipeline and rank; raise ``ValueError`` before changing anything.

        Checks the format and version, ``canonical_replicas``, the datasets' fingerprints,
        that the state covers the lanes read here (the rank's lanes under the state's
        ``canonical_replicas``; only those of ``worker = (id, count)`` inside a DataLoader
        worker), and that each of those lanes' source state restores (which checks the
        source's config fingerprint). The collector is paused meanwhile (see ``paused_gc``):
        a state of thousands of lanes is parsed into objects that set off full collections.
        """
        with paused_gc():
            return self._checked_state(state, worker)

    def _checked_state(self, state: Any, worker: tuple[int, int]) -> LoaderState:
        """The checks of :meth:`check`."""
        parsed = parse_state(state)
        replicas = parsed.canonical_replicas
        if self._requested is not None and replicas != self._requested:
            raise ValueError(f"the checkpoint was taken with canonical_replicas={replicas}, but this loader was "
                             f"built with canonical_replicas={self._requested}; canonical_replicas is fixed for a "
                             f"run: pass canonical_replicas={replicas} (or leave it unset)")
        packing = self.pipeline.packing
        expected = [] if packing is None else [packing.name]
        if sorted(parsed.operators) != expected:
            raise ValueError(f"the checkpoint holds the states of operators {sorted(parsed.operators)}, this pipeline "
                             f"has {expected}; restore it into a pipeline with the same pack / ensure_mixture steps")
        differences = dataset_differences(parsed.datasets, self._datasets)
        if differences:
            raise ValueError("the checkpoint was taken over other data: " + "; ".join(differences)
                             + ". Restore it into a pipeline over the same datasets")
        lanes = self._read_lanes(replicas, worker)
        missing = missing_lanes(parsed, lanes)
        if missing:
            have = sorted(parsed.entries)
            raise ValueError(f"the checkpoint lacks lanes {missing} that rank {self.rank} of {self.world_size} "
                             f"reads (it holds lanes {have if len(have) <= 16 else f'{have[:16]}...'}); load "
                             "the global checkpoint (all_gather_state / merge_states of every rank's state)")
        self._check_lanes(parsed.entries, replicas, lanes, parsed.operators[packing.name] if packing is not None else {})
        template = self.pipeline.source
        run = run_fingerprint(template, replicas, self._datasets)
        if parsed.run is not None and parsed.run != run:
            raise ValueError(f"the checkpoint is of another run (run {parsed.run}, this pipeline's run under its "
                             f"canonical_replicas={replicas} is {run}: another source type or settings); restore it "
                             "into the pipeline that wrote it")
        return parsed

    def _read_lanes(self, replicas: int, worker: tuple[int, int]) -> list[int]:
        """The lanes read here under ``replicas`` lanes: the rank's, or ``worker = (id, count)``'s of them."""
        return worker_lanes(rank_lanes(replicas, self.rank, self.world_size, self.mapping), *worker, self.mapping)

    def _check_lanes(self, ledger: Ledger, replicas: int, lanes: list[int], operators: Mapping[int, Any]) -> None:
        """Each of ``lanes``' source state in ``ledger`` restores into this pipeline's source, its
        consumed count fits a chunk and, packed, its operator state (in ``operators``) is sound."""
        template, packing = self.pipeline.source, self.pipeline.packing
        if not _all_restore(template, ledger, replicas, lanes):
            for lane in lanes:
                try:
                    template.clone_for_lane(lane, replicas).load_state_dict(ledger[lane][0])
                except (ValueError, TypeError, KeyError) as error:
                    raise ValueError(f"lane {lane} of the checkpoint does not restore into this pipeline's source: "
                                     f"{error}") from error
        hint = template.chunk_size_hint()
        for lane in lanes:
            consumed = ledger.consumed(lane)
            if hint is not None and consumed > hint:
                raise ValueError(f"lane {lane} of the checkpoint has consumed={consumed} samples of a chunk of "
                                 f"at most {hint}; the checkpoint is corrupted")
            if packing is not None:
                check_operator(packing, operators[lane], lane)

    def load(self, state: Any, worker: tuple[int, int] = (0, 1)) -> LoaderState:
        parsed = self.check(state, worker)
        self._replicas = self._fixed = parsed.canonical_replicas
        self._entries = parsed.entries
        self._checked = set(self._read_lanes(parsed.canonical_replicas, worker))
        self._attempt = attempt_of(state, parsed)
        packing = self.pipeline.packing
        self._operators = dict(parsed.operators[packing.name]) if packing is not None else {}
        return parsed
