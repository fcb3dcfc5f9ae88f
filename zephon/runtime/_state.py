"""The loader checkpoint: per lane, the chunk-start state of its source and the samples consumed.

A state covers some lanes (a worker's, a rank's, or all of them: the global checkpoint that
:func:`merge_states` builds). Its size depends only on how many lanes it covers: the chunk in
flight is regenerated on restore, never stored. Plain JSON, tagged, versioned and sealed::

    {"kind": "zephon.LoaderState", "version": 5,
     "canonical_replicas": 4,
     "datasets": [{"id": 0, "name": "web", "fingerprint": null}, ...],
     "run": "9f2c…",                          # the run: its source's settings, lanes and datasets
     "source": {...},                         # the keys every lane's source state shares
     "lanes": {"count": 2, "lane": <column>, "consumed": <column>, "turn": <column>,
               "state": <column>,             # the rest of each lane's source state
               "sealed": true,                # their digests were left out: restoring seals them again
               "nested": ["inner"]},          # and those of the states these keys hold (a phase's state)
     "operators": {},                         # per-lane states of a pipeline's operators, by name: columns
     "topology": {"world_size": 2, "ranks": [0, 1], "mapping": "contiguous", "num_workers": 2},
     "in_epoch": 5,                           # batches the loop received of the iteration in progress
     "digest": "…"}                           # sha256 of the rest: any edit is refused

A *column* holds one value per lane (``zephon.runtime._columns``), in ascending lane order.
A lane's source state is ``{**source, **state}``; ``consumed`` counts the samples of the chunk
that state starts which the training loop received. ``turn`` (0–3) holds two flags that make a
resume on the same topology exact batch for batch (bit 0: the lane gave its turn, a batch, of
its reader's current round; bit 1: its reader gave its batch of the loader's current cycle; see
``zephon.runtime._stream``). ``topology`` says where the state was taken; it is
informational: any topology restores the state. ``in_epoch`` counts the batches (items when
unbatched) the training loop received of the loader's iteration in progress, its epoch, so
that a resumed loader's ``len()`` is the length of the whole epoch it resumes into. Version 4
(no ``in_epoch``: read as unknown, counted as 0), versions 2 and 3 (no ``nested`` either: only
the lanes' own digests were left out) and version 1 (one ``[lane, consumed, turn, state]`` row
per lane, no digest of its own) are still read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypedDict

from zephon.core.checkpoint import KEY_DIGEST, canonical, digest, sealed
from zephon.limits import MAX_LOADER_STATE_NODES, MAX_REPLICAS, MAX_SAMPLES, check_json, show
from zephon.runtime._columns import (
    assembled, copied, decode, encode, encode_fields, getters, identical, leaves, select, values,
)
from zephon.runtime._gc import paused_gc
from zephon.runtime._lanes import MAPPINGS
from zephon.runtime._sealing import Entry, LaneColumns, SealingLedger

KIND = "zephon.LoaderState"
VERSION = 5  # 5: in_epoch; 4: lanes.nested; 3: a column may hold a list that every lane has ({"same": [...]})
KEY_KIND, KEY_VERSION, KEY_REPLICAS, KEY_DATASETS = "kind", "version", "canonical_replicas", "datasets"
KEY_RUN, KEY_SOURCE, KEY_LANES, KEY_OPERATORS, KEY_TOPOLOGY = "run", "source", "lanes", "operators", "topology"
KEY_IN_EPOCH = "in_epoch"
KEYS_V2 = (KEY_KIND, KEY_VERSION, KEY_REPLICAS, KEY_DATASETS, KEY_RUN, KEY_SOURCE, KEY_LANES, KEY_OPERATORS,
           KEY_TOPOLOGY, KEY_DIGEST)  # versions 2 to 4
KEYS = KEYS_V2 + (KEY_IN_EPOCH,)
KEYS_V1 = (KEY_KIND, KEY_VERSION, KEY_REPLICAS, KEY_DATASETS, KEY_SOURCE, KEY_LANES, KEY_TOPOLOGY)
LANE_KEYS = ("count", "lane", "consumed", "turn", "state", "sealed", "nested")  # version 4; 2 and 3 lack "nested"
_HEX32, _HEX16 = re.compile(r"[0-9a-f]{32}"), re.compile(r"[0-9a-f]{16}")
ATTEMPT = "attempt"  # the topology key of the attempt a state was saved by (absent: a fresh start)
TOPOLOGY_KEYS = ("world_size", "ranks", "mapping", "num_workers", "batch_size", ATTEMPT)


class DatasetRecord(TypedDict):
    """A dataset as a loader state names it."""

    id: int
    name: str
    fingerprint: str | None  # its content fingerprint; None for in-memory and count-only datasets


class LanesDict(TypedDict):
    """``LoaderStateDict["lanes"]``: the lanes' ledger as columns (one value per lane)."""

    count: int
    lane: Any  # column: the lanes, ascending
    consumed: Any  # column: samples of each lane's chunk in flight the loop received
    turn: Any  # column: the turn flags (0-3)
    state: Any  # column: the rest of each lane's source state
    sealed: bool  # the lanes' source states were sealed and their digests left out
    nested: list[str]  # keys of states sealed in their own right inside them, whose digests were left out too


class LoaderStateDict(TypedDict):
    """The JSON a loader's ``state_dict()`` returns (see the module docstring for each field)."""

    kind: str  # KIND
    version: int  # VERSION
    canonical_replicas: int
    datasets: list[DatasetRecord]
    run: str | None  # the run's fingerprint (32 hex digits), None where unknown
    source: dict[str, Any]  # the keys every lane's source state shares
    lanes: LanesDict
    operators: dict[str, Any]  # operator name -> column of per-lane states
    topology: dict[str, Any]  # where it was taken (informational)
    in_epoch: int  # batches (items) the loop received of the iteration in progress, >= 0
    digest: str  # sha256 of the rest (32 hex digits)


@dataclass(frozen=True, slots=True)
class LoaderState:
    """A parsed and validated loader state: ``canonical_replicas``, the ledger ``entries`` of
    the lanes it covers, the ``datasets`` it was taken over, the ``run`` it belongs to, the
    ``operators``' per-lane states, the ``topology`` it was taken on and ``in_epoch``, the
    batches the loop received of the iteration in progress (None: a state of version 4 or
    earlier, which does not say)."""

    canonical_replicas: int
    entries: Ledger  # lane -> (source state, consumed, turn flags): Entry
    datasets: list[DatasetRecord]  # ascending ids
    topology: dict[str, Any] = field(default_factory=dict)
    run: str | None = None
    operators: dict[str, dict[int, Any]] = field(default_factory=dict)  # operator -> lane -> its state
    in_epoch: int | None = None  # batches (items), >= 0; None: not recorded (version <= 4)


def run_fingerprint(source: Any, canonical_replicas: int, datasets: list[DatasetRecord]) -> str:
    """What identifies a run: its source's settings (the config fingerprint of a zephon
    source, else its type), its lane count and its datasets; 32 hex digits."""
    fingerprint = getattr(getattr(source, "config", None), "fingerprint", None)
    settings = fingerprint() if callable(fingerprint) else {"type": type(source).__qualname__}
    return digest({"source": settings, KEY_REPLICAS: canonical_replicas, KEY_DATASETS: list(datasets)})


def dataset_fingerprints(datasets_by_id: Mapping[int, Any]) -> list[DatasetRecord]:
    """Name and content fingerprint (None where the dataset has none) of every dataset, by id."""
    out = []
    for dataset_id in sorted(datasets_by_id):
        dataset = datasets_by_id[dataset_id]
        fingerprint = getattr(dataset, "fingerprint", None)
        out.append(DatasetRecord(id=int(dataset_id), name=dataset.name,
                                 fingerprint=fingerprint() if callable(fingerprint) else None))
    return out


def _common(states: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The keys (but a digest) whose values every state shares."""
    if not states:
        return {}
    first = states[0]
    return {k: v for k, v in first.items()
            if k != KEY_DIGEST and all(k in s and identical(s[k], v) for s in states[1:])}


def _all_sealed(states: list[Mapping[str, Any]], shared: Mapping[str, str]) -> bool:
    """Whether every state carries the zephon seal of the rest (``digest``): then the file can
    leave the digests out and restoring seals the states again."""
    return bool(states) and all(type(s.get(KEY_DIGEST)) is str and s[KEY_DIGEST] == digest(s, shared) for s in states)


def make_state(canonical_replicas: int, entries: Mapping[int, Entry], datasets: list[DatasetRecord],
               topology: Mapping[str, Any], *, run: str | None = None,
               operators: Mapping[str, Mapping[int, Any]] | None = None, sealed_by_source: bool = False,
               nested: tuple[str, ...] = (), in_epoch: int = 0) -> LoaderStateDict:
    """The JSON state of ``entries`` (lane -> (source state, consumed, turn flags)), of ``run``
    (:func:`run_fingerprint`), with ``operators`` (name -> lane -> JSON state) for its lanes and
    ``in_epoch``, the batches the loop received of the loader's iteration in progress.
    ``sealed_by_source``: every state is known to carry its source's seal (a loader's own
    entries: made by its source, or restored from a state whose digest was checked), so the
    seals need not be checked before they are left out, nor those of the states sealed in
    their own right that the ``nested`` keys of each state hold; then a
    :class:`SealingLedger`'s states are made field by field where it can
    (``SealingLedger.fields``)."""
    fields = entries.fields(nested) if sealed_by_source and isinstance(entries, SealingLedger) else None
    if fields is not None:
        common, columns = fields
        encoded = columns._replace(state=encode_fields(columns.state))
        return _assembled(canonical_replicas, datasets, run, common, encoded, nested, operators or {}, topology,
                          in_epoch)
    lanes = sorted(entries)
    rows = [entries[lane] for lane in lanes]
    states = [row[0] for row in rows]
    for lane, state in zip(lanes, states):
        if not isinstance(state, dict):
            raise TypeError(f"lane {lane}: the source's state_dict() must be a dict, got {type(state).__name__}")
    common = _common(states)
    if not states or not (sealed_by_source or _all_sealed(states, {k: canonical(v) for k, v in common.items()})):
        rests = [{k: v for k, v in state.items() if k not in common} for state in states]
        return _assembled(canonical_replicas, datasets, run, common, _columns(lanes, rows, rests), None,
                          operators or {}, topology, in_epoch)
    seals = nested if sealed_by_source else ()
    rests = [_unsealed({k: v for k, v in state.items() if k not in common}, seals) for state in states]
    return _assembled(canonical_replicas, datasets, run, _unsealed(common, seals), _columns(lanes, rows, rests),
                      seals, operators or {}, topology, in_epoch)


def _unsealed(state: dict[str, Any], nested: tuple[str, ...]) -> dict[str, Any]:
    """``state`` without its digest, nor those of the dicts its ``nested`` keys hold."""
    out = {k: v for k, v in state.items() if k != KEY_DIGEST}
    for key in nested:
        if type(out.get(key)) is dict:
            out[key] = {k: v for k, v in out[key].items() if k != KEY_DIGEST}
    return out


def _columns(lanes: list[int], rows: Sequence[tuple[Any, int, int]], rests: list[Any]) -> LaneColumns:
    """The columns of ``lanes``' ``rows`` (their entries), with ``rests`` for their states."""
    return LaneColumns(lanes, [row[1] for row in rows], [row[2] for row in rows], encode(rests))


def _assembled(canonical_replicas: int, datasets: list[DatasetRecord], run: str | None, common: dict[str, Any],
               columns: LaneColumns, seals: tuple[str, ...] | None, operators: Mapping[str, Mapping[int, Any]],
               topology: Mapping[str, Any], in_epoch: int) -> LoaderStateDict:
    """The sealed state of lanes' ``columns`` (the rests of their source states past ``common``)
    and their ``operators``' states, ``in_epoch`` batches into the loader's iteration. ``seals``: None where the lanes keep their seals, else the
    keys of the nested states whose seals were left out with the lanes' own."""
    lanes = columns.lanes
    _check_in_epoch(in_epoch, TypeError)
    for name, by_lane in operators.items():
        if sorted(by_lane) != lanes:
            raise ValueError(f"operator {name!r} has states for lanes {sorted(by_lane)}, the state covers {lanes}")
    body = {
        KEY_KIND: KIND,
        KEY_VERSION: VERSION,
        KEY_REPLICAS: canonical_replicas,
        KEY_DATASETS: [DatasetRecord(id=d["id"], name=d["name"], fingerprint=d["fingerprint"]) for d in datasets],
        KEY_RUN: run,
        KEY_SOURCE: dict(common),
        KEY_LANES: LanesDict(count=len(lanes), lane=encode(lanes), consumed=encode(columns.consumed),
                             turn=encode(columns.turn), state=columns.state, sealed=seals is not None,
                             nested=list(seals or ())),
        KEY_OPERATORS: {name: encode([by_lane[k] for k in lanes]) for name, by_lane in sorted(operators.items())},
        KEY_TOPOLOGY: dict(topology),
        KEY_IN_EPOCH: in_epoch,
    }
    return sealed(body)  # type: ignore[return-value]  # sealed adds the digest: the keys are KEYS


def _bad(what: str) -> ValueError:
    return ValueError(f"loader state: {what}; it is corrupted or was not made by a zephon loader's state_dict()")


def parse_state(state: Any) -> LoaderState:
    """Validate a loader state's form (not its fit to a pipeline) and parse it."""
    if not isinstance(state, dict):
        raise ValueError(f"loader state must be a dict (from state_dict() or load_checkpoint()), got "
                         f"{type(state).__name__}")
    check_json(state, "loader state", MAX_LOADER_STATE_NODES)
    if state.get(KEY_KIND) != KIND:
        raise ValueError(f"loader state kind is {show(state.get(KEY_KIND))}, expected {KIND!r}; pass the state_dict() "
                         "of a zephon DataLoader / torch dataset, or a checkpoint of one")
    version = state.get(KEY_VERSION)
    if type(version) is not int or not 1 <= version <= VERSION:
        raise ValueError(f"loader state version {show(version)} is not supported (this zephon reads versions 1 to "
                         f"{VERSION}); restore it with the zephon version that wrote it")
    keys = KEYS if version >= 5 else KEYS_V2 if version >= 2 else KEYS_V1
    missing, unknown = [k for k in keys if k not in state], sorted(set(state) - set(keys))
    if missing or unknown:
        raise _bad(f"a version {version} state has keys {list(keys)}: missing {missing}, unknown keys {show(unknown)}")
    if version >= 2 and state[KEY_DIGEST] != digest(state):
        raise _bad("its digest does not match its content (edited or damaged)")
    replicas = state[KEY_REPLICAS]
    if type(replicas) is not int or not 1 <= replicas <= MAX_REPLICAS:
        raise _bad(f"canonical_replicas={show(replicas)} must be an int in [1, {MAX_REPLICAS}]")
    datasets = state[KEY_DATASETS]
    if not isinstance(datasets, list) or not all(
            isinstance(d, dict) and set(d) == {"id", "name", "fingerprint"} for d in datasets):
        raise _bad(f"datasets must be a list of {{'id', 'name', 'fingerprint'}}, got {show(datasets)}")
    _check_datasets(datasets)
    common, topology = state[KEY_SOURCE], state[KEY_TOPOLOGY]
    if not isinstance(common, dict):
        raise _bad(f"'source' must be a dict, got {show(common)}")
    common = copied(common)  # lanes are made from it later: a later edit of the input changes none
    _check_topology(topology)
    if version == 1:
        columns_v1 = _lane_columns_v1(state[KEY_LANES])
        return LoaderState(replicas, _entries(columns_v1, common, replicas, None), datasets, topology)
    run = state[KEY_RUN]
    if run is not None and not (type(run) is str and _HEX32.fullmatch(run)):
        raise _bad(f"run={show(run)} must be 32 hex digits or null")
    columns, seals = _lane_columns(state[KEY_LANES], replicas, version)
    in_epoch = state[KEY_IN_EPOCH] if version >= 5 else None
    if version >= 5:
        _check_in_epoch(in_epoch, _bad)
    return LoaderState(replicas, _entries(columns, common, replicas, seals), datasets, topology, run,
                       _operators(state[KEY_OPERATORS], columns.lanes), in_epoch)


def _check_in_epoch(in_epoch: Any, error: Callable[[str], Exception]) -> None:
    """Refuse an ``in_epoch`` that is not an int in ``[0, MAX_SAMPLES]`` (raising ``error(what)``)."""
    if type(in_epoch) is not int or not 0 <= in_epoch <= MAX_SAMPLES:
        raise error(f"in_epoch={show(in_epoch)} must be an int in [0, {MAX_SAMPLES}] (batches received of the "
                    "iteration in progress)")


def _check_datasets(datasets: list[dict[str, Any]]) -> None:
    ids = [d["id"] for d in datasets]
    for d in datasets:
        if not (type(d["id"]) is int and d["id"] >= 0 and type(d["name"]) is str
                and (d["fingerprint"] is None or type(d["fingerprint"]) is str)):
            raise _bad(f"every dataset must be {{'id': int >= 0, 'name': str, 'fingerprint': str or null}}, got {show(d)}")
    if len(set(ids)) != len(ids):
        raise _bad(f"dataset ids {show(ids)} repeat")


def _check_topology(topology: Any) -> None:
    """Refuse a ``topology`` that no loader writes (it is informational, but names the attempt
    and the ranks that checkpoint directories group files by)."""
    if not isinstance(topology, dict) or not set(topology) <= set(TOPOLOGY_KEYS):
        raise _bad(f"'topology' must be a dict of some of {list(TOPOLOGY_KEYS)}, got {show(topology)}")
    world = topology.get("world_size", MAX_REPLICAS)
    ranks = topology.get("ranks", [])
    workers, batch = topology.get("num_workers"), topology.get("batch_size", 1)
    attempt = topology.get(ATTEMPT, "0" * 16)
    if not (type(world) is int and 1 <= world <= MAX_REPLICAS and isinstance(ranks, list)
            and all(type(r) is int and 0 <= r < world for r in ranks) and ranks == sorted(set(ranks))
            and topology.get("mapping", MAPPINGS[0]) in MAPPINGS
            and (workers is None or type(workers) is int and 0 <= workers <= MAX_REPLICAS)
            and type(batch) is int and 1 <= batch <= MAX_SAMPLES
            and type(attempt) is str and _HEX16.fullmatch(attempt)):
        raise _bad(f"topology {show(topology)} must have world_size in [1, {MAX_REPLICAS}], ascending ranks below "
                   f"it, mapping in {list(MAPPINGS)}, num_workers null or >= 0, batch_size >= 1 and attempt 16 hex "
                   "digits")


@dataclass(frozen=True)
class _Columns:
    """A state's lanes as columns: ``lanes`` (ascending from version 2), what the loop received of
    each lane's chunk (``consumed``), its ``turn`` flags and the getters of the rest of each
    lane's source state (``states``, as ``zephon.runtime._columns.getters`` makes them: a dict of
    the fields' getters, or one getter), which make a lane's values when asked for."""

    lanes: list[Any]
    consumed: list[Any]
    turn: list[Any]
    states: Any


def _lane_columns(lanes: Any, replicas: int, version: int) -> tuple[_Columns, tuple[str, ...] | None]:
    """The lane columns of versions 2 to 4, checked in form, and their seals: None where the
    lanes keep them, else the nested keys whose seals were left out too (see ``_assembled``)."""
    keys = LANE_KEYS if version >= 4 else LANE_KEYS[:-1]
    if not isinstance(lanes, dict) or sorted(lanes) != sorted(keys):
        raise _bad(f"'lanes' must be a dict of {list(keys)}, got {show(lanes)}")
    count, is_sealed, nested = lanes["count"], lanes["sealed"], lanes.get("nested", [])
    if type(count) is not int or not 0 <= count <= replicas or type(is_sealed) is not bool:
        raise _bad(f"lanes: count={show(count)} must be an int in [0, {replicas}] and sealed a bool")
    if not (type(nested) is list and all(type(key) is str for key in nested) and len(set(nested)) == len(nested)
            and (is_sealed or not nested)):
        raise _bad(f"lanes: nested={show(nested)} must be a list of distinct keys, empty unless sealed is true")
    _check_expansion(count, [lanes[key] for key in ("lane", "consumed", "turn", "state")])
    try:
        ids, consumed, turn = (decode(lanes[key], count, f"lanes.{key}") for key in ("lane", "consumed", "turn"))
        columns = _Columns(ids, consumed, turn, getters(lanes["state"], count, "lanes.state"))
    except ValueError as error:
        raise _bad(str(error)) from None
    _check_dicts(lanes["state"], ids)
    if not all(type(lane) is int for lane in columns.lanes):
        raise _bad(f"lanes must be ints, got {show(columns.lanes)}")
    if columns.lanes != sorted(columns.lanes):
        raise _bad("lanes must be in ascending order")
    return columns, tuple(nested) if is_sealed else None


def _check_expansion(count: int, columns: list[Any]) -> None:
    """Refuse columns that would decode to more values than a loader state may hold (a short
    text can describe many lanes' values)."""
    if count * sum(leaves(column) for column in columns) > MAX_LOADER_STATE_NODES:
        raise _bad(f"{count} lanes of {sum(leaves(c) for c in columns)} values each are more than a loader state "
                   f"holds ({MAX_LOADER_STATE_NODES} values)")


def _check_dicts(states: Any, lanes: list[Any]) -> None:
    """Refuse a column of ``lanes``' states (well formed) that holds anything but dicts."""
    if type(states) is dict and set(states) == {"fields"}:
        return
    bad = [k for k, s in enumerate(states) if not isinstance(s, dict)] if type(states) is list else [0]
    if bad:
        got = states[bad[0]] if type(states) is list else states
        raise _bad(f"every lane must be [lane, consumed, turn, state] with a dict for its state; lane "
                   f"{show(lanes[bad[0]])} has {show(got)}")


def _lane_columns_v1(lanes: Any) -> _Columns:
    """Version 1's ``[lane, consumed, turn, state]`` rows as columns."""
    if not isinstance(lanes, list):
        raise _bad("'lanes' must be a list")
    for row in lanes:
        if not (isinstance(row, list) and len(row) == 4):
            raise _bad(f"every lane must be [lane, consumed, turn, state], got {show(row)}")
    _check_dicts([row[3] for row in lanes], [row[0] for row in lanes])
    return _Columns([r[0] for r in lanes], [r[1] for r in lanes], [r[2] for r in lanes], [r[3] for r in lanes].__getitem__)


class Ledger(Mapping[int, tuple[dict[str, Any], int, int]]):
    """A parsed state's entries by lane, each lane's source state made (decoded from its
    columns and sealed again) when first asked for: a rank restores a few lanes of a global state."""

    def __init__(self, columns: _Columns, common: dict[str, Any], seals: tuple[str, ...] | None):
        self._columns, self._common, self._seals = columns, common, seals
        self._state = assembled(columns.states)  # lane k's rest of its source state
        self._index = dict(zip(columns.lanes, range(len(columns.lanes))))
        shared = None if seals is None else {k: canonical(v) for k, v in common.items()}
        self._shared = shared
        self._unnested = None if shared is None else {k: v for k, v in shared.items() if k not in (seals or ())}
        self._made: dict[int, tuple[dict[str, Any], int, int]] = {}

    def __getitem__(self, lane: int) -> tuple[dict[str, Any], int, int]:
        entry = self._made.get(lane)
        if entry is None:
            k, columns = self._index[lane], self._columns
            state = {**self._common, **self._state(k)}
            if self._unnested is not None:  # the nested states are sealed anew: their text is not the stored one
                state = sealed(_nested_sealed(state, self._seals or ()), self._unnested)
            entry = self._made[lane] = (state, columns.consumed[k], columns.turn[k])
        return entry

    @property
    def seals(self) -> tuple[str, ...] | None:
        """None where the lanes kept their seals; else the keys of the states nested in each
        lane's whose seals were left out as well (restoring seals them first)."""
        return self._seals

    @property
    def common(self) -> dict[str, Any]:
        """The part every lane's source state shares."""
        return self._common

    @property
    def shared(self) -> dict[str, str] | None:
        """The canonical JSON of the part every lane's source state shares, when the lanes'
        seals were left out (None otherwise)."""
        return self._shared

    def consumed(self, lane: int) -> int:
        """Samples of lane ``lane``'s chunk in flight the loop received."""
        consumed: int = self._columns.consumed[self._index[lane]]
        return consumed

    def plain(self, lanes: Sequence[int]) -> dict[int, tuple[dict[str, Any], int, int]]:
        """The entries of ``lanes`` with the source states as stored, without the seal that
        ``ledger[lane]`` adds (a saved state leaves it out again), made field by field."""
        if self._shared is None:
            return {lane: self[lane] for lane in lanes}
        columns, ks = self._columns, [self._index[lane] for lane in lanes]
        rests = values(columns.states, ks)
        return {lane: ({**self._common, **rest}, columns.consumed[k], columns.turn[k])
                for lane, k, rest in zip(lanes, ks, rests)}

    def fields(self, lanes: Sequence[int]) -> Any:
        """The sealed lanes' stored source states past the shared part, field by field
        (:func:`zephon.runtime._columns.select`); None for a state whose lanes keep their seals."""
        if self._shared is None:
            return None
        return select(self._columns.states, [self._index[lane] for lane in lanes])

    def stored(self, lane: int) -> tuple[dict[str, Any], int, int]:
        """Lane ``lane`` as stored: the rest of its source state past the shared part (no seal),
        consumed and turn flags."""
        k, columns = self._index[lane], self._columns
        return self._state(k), columns.consumed[k], columns.turn[k]

    def __contains__(self, lane: object) -> bool:
        return lane in self._index

    def __iter__(self) -> Iterator[int]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _nested_sealed(state: dict[str, Any], nested: tuple[str, ...]) -> dict[str, Any]:
    """``state`` with the dicts its ``nested`` keys hold sealed (any other value is left for
    the source's check to refuse)."""
    for key in nested:
        if type(state.get(key)) is dict:
            state[key] = sealed(state[key])
    return state


def _entries(columns: _Columns, common: dict[str, Any], replicas: int, seals: tuple[str, ...] | None) -> Ledger:
    """The ledger of a state's lane columns, their positions validated (each lane's source state
    is validated by the source it restores into)."""
    lanes = columns.lanes
    for lane, consumed, turn in zip(lanes, columns.consumed, columns.turn):
        if not (type(lane) is int and type(consumed) is int and type(turn) is int):
            raise _bad(f"every lane must be [lane, consumed, turn, state] with ints, got lane {show(lane)}, "
                       f"consumed {show(consumed)}, turn {show(turn)}")
        if not 0 <= lane < replicas:
            raise _bad(f"lane {lane} is outside [0, canonical_replicas={replicas})")
        if consumed < 0:
            raise _bad(f"lane {lane} has consumed={consumed} < 0")
        if not 0 <= turn <= 3:
            raise _bad(f"lane {lane} has turn={turn}, outside 0..3")
    if len(set(lanes)) != len(lanes):
        ordered = sorted(lanes)
        raise _bad(f"lane {next(b for a, b in zip(ordered, ordered[1:]) if a == b)} appears twice")
    return Ledger(columns, common, seals)


def _operators(operators: Any, lanes: list[Any]) -> dict[str, dict[int, Any]]:
    if not isinstance(operators, dict):
        raise _bad(f"'operators' must be a dict of columns, got {show(operators)}")
    _check_expansion(len(lanes), list(operators.values()))
    out = {}
    for name, column in operators.items():
        try:
            out[name] = dict(zip(lanes, decode(column, len(lanes), f"operators.{name}")))
        except ValueError as error:
            raise _bad(str(error)) from None
    return out


def merge_states(states: Iterable[Any]) -> LoaderStateDict:
    """One state covering the lanes of all ``states`` (e.g. every rank's): pure.

    The states must agree on ``canonical_replicas``, the datasets and the run; a lane may
    appear in several only with identical entries. The result is global when the lanes cover
    ``range(canonical_replicas)`` (see :func:`missing_lanes`). Its ``in_epoch`` is the largest
    of theirs (ranks that train in step received as many batches). The collector is paused while
    it runs (``paused_gc``): the parsed states of 2,048 ranks set off full collections that
    took a third of the merge.
    """
    states = list(states)  # the caller's iterable runs before the collector is paused
    with paused_gc():
        return _merge([parse_state(s) for s in states])


def _merge(parsed: list[LoaderState]) -> LoaderStateDict:
    """:func:`merge_states` of the states parsed."""
    if not parsed:
        raise ValueError("merge_states needs at least one state; pass every rank's state_dict()")
    first = parsed[0]
    operators: dict[str, dict[int, Any]] = {}
    ranks: set[int] = set()
    for k, p in enumerate(parsed):
        if p.canonical_replicas != first.canonical_replicas:
            raise ValueError(f"merge_states: state {k} has canonical_replicas={p.canonical_replicas}, state 0 has "
                             f"{first.canonical_replicas}; merge states of one run only")
        if p.datasets != first.datasets:
            raise ValueError(f"merge_states: state {k} was taken over other datasets ({p.datasets} vs "
                             f"{first.datasets}); merge states of one run only")
        if (None not in (p.run, first.run) and p.run != first.run) or sorted(p.operators) != sorted(first.operators):
            raise ValueError(f"merge_states: state {k} is of another run (run {p.run}, operators {sorted(p.operators)}; "
                             f"state 0: run {first.run}, operators {sorted(first.operators)}); merge states of one "
                             "run only")
        for name, by_lane in p.operators.items():
            operators.setdefault(name, {}).update(by_lane)
        ranks.update(r for r in p.topology.get("ranks", ()) if type(r) is int)
    topology = dict(first.topology)
    if ranks:
        topology["ranks"] = sorted(ranks)
    run = next((p.run for p in parsed if p.run is not None), None)  # version 1 states name no run
    in_epoch = max((p.in_epoch or 0 for p in parsed), default=0)  # ranks in step agree; else the furthest
    sealed_alike = [p.entries for p in parsed if p.entries.shared is not None]
    alike = (first.entries.shared, first.entries.seals)
    if len(sealed_alike) == len(parsed) and all((ledger.shared, ledger.seals) == alike for ledger in sealed_alike):
        rows = _merged({lane: ledger.stored(lane) for lane in ledger} for ledger in sealed_alike)  # no lane unsealed
        lanes = sorted(rows)
        ordered = [rows[lane] for lane in lanes]
        return _assembled(first.canonical_replicas, first.datasets, run, sealed_alike[0].common,
                          _columns(lanes, ordered, [row[0] for row in ordered]), first.entries.seals, operators,
                          topology, in_epoch)
    entries = _merged(dict(p.entries.items()) for p in parsed)
    seals = {p.entries.seals for p in parsed}  # where all left out the same seals, so does the merge
    nested = seals.pop() if len(seals) == 1 else None
    return make_state(first.canonical_replicas, entries, first.datasets, topology, run=run, operators=operators,
                      sealed_by_source=nested is not None, nested=nested or (), in_epoch=in_epoch)


def _merged(parts: Iterable[Mapping[int, Any]]) -> dict[int, Any]:
    """The lanes of ``parts`` in one mapping; a lane in several must be the same in each."""
    out: dict[int, Any] = {}
    for part in parts:
        for lane, entry in part.items():
            if lane in out and not identical(list(out[lane]), list(entry)):
                raise ValueError(f"merge_states: lane {lane} appears in two states with different positions; "
                                 "each lane must come from the one rank that owns it")
            out[lane] = entry
    return out


def split_state(state: Any) -> dict[int, LoaderStateDict]:
    """A state cut into one state per lane (each with its operators' states): the inverse of
    :func:`merge_states`, for stores that keep one entry per lane."""
    parsed = parse_state(state)
    seals = parsed.entries.seals  # the lanes are sealed again as they are taken: each part leaves the same seals out
    return {lane: make_state(parsed.canonical_replicas, {lane: parsed.entries[lane]}, parsed.datasets,
                             parsed.topology, run=parsed.run,
                             operators={name: {lane: by_lane[lane]} for name, by_lane in parsed.operators.items()},
                             sealed_by_source=seals is not None, nested=seals or (), in_epoch=parsed.in_epoch or 0)
            for lane in parsed.entries}


def missing_lanes(state: LoaderState, lanes: Iterable[int]) -> list[int]:
    return [lane for lane in lanes if lane not in state.entries]


def dataset_differences(saved: list[DatasetRecord], current: list[DatasetRecord]) -> list[str]:
    """What differs between the datasets a state was taken over and the current ones."""
    if [(d["id"], d["name"]) for d in saved] != [(d["id"], d["name"]) for d in current]:
        return [f"datasets: the checkpoint has {[d['name'] for d in saved]}, this pipeline has "
                f"{[d['name'] for d in current]}"]
    return [f"dataset {c['name']!r}: content fingerprint {s['fingerprint']!r} in the checkpoint, "
            f"{c['fingerprint']!r} now" for s, c in zip(saved, current) if s["fingerprint"] != c["fingerprint"]]
