"""The loader checkpoint: per lane, the chunk-start state of its source and the samples consumed.

A state covers some lanes (a worker's, a rank's, or all of them: the global checkpoint that
:func:`merge_states` builds). Its size depends only on how many lanes it covers: the chunk in
flight is regenerated on restore, never stored. Plain JSON, tagged and versioned::

    {"kind": "zephon.LoaderState", "version": 1,
     "canonical_replicas": 4,
     "datasets": [{"id": 0, "name": "web", "fingerprint": null}, ...],
     "source": {...},                       # the keys every lane's source state shares
     "lanes": [[lane, consumed, turn, {...}], ...],  # ascending lanes; {...}: the rest of its state
     "topology": {"world_size": 2, "ranks": [0, 1], "mapping": "contiguous", "num_workers": 2}}

A lane's source state is ``{**source, **rest}``; ``consumed`` counts the samples of the chunk
that state starts which the training loop received. ``turn`` (0–3) holds two flags that make a
resume on the same topology exact batch for batch (bit 0: the lane gave its turn, a batch, of
its reader's current round; bit 1: its reader gave its batch of the loader's current cycle; see
``zephon.runtime._stream``). ``topology`` says where the state was taken; it is
informational: any topology restores the state.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, TypedDict

from zephon.limits import MAX_LOADER_STATE_NODES, MAX_REPLICAS, check_json, show
from zephon.runtime._stream import Entry

KIND = "zephon.LoaderState"
VERSION = 1
KEY_KIND, KEY_VERSION, KEY_REPLICAS, KEY_DATASETS = "kind", "version", "canonical_replicas", "datasets"
KEY_SOURCE, KEY_LANES, KEY_TOPOLOGY = "source", "lanes", "topology"
KEYS = (KEY_KIND, KEY_VERSION, KEY_REPLICAS, KEY_DATASETS, KEY_SOURCE, KEY_LANES, KEY_TOPOLOGY)


class DatasetRecord(TypedDict):
    """A dataset as a loader state names it."""

    id: int
    name: str
    fingerprint: str | None  # its content fingerprint; None for in-memory and count-only datasets


class LoaderStateDict(TypedDict):
    """The JSON a loader's ``state_dict()`` returns (see the module docstring for each field)."""

    kind: str  # KIND
    version: int  # VERSION
    canonical_replicas: int
    datasets: list[DatasetRecord]
    source: dict[str, Any]  # the keys every lane's source state shares
    lanes: list[list[Any]]  # [lane, consumed, turn, the rest of its source state], ascending lanes
    topology: dict[str, Any]  # where it was taken (informational)


@dataclass(frozen=True, slots=True)
class LoaderState:
    """A parsed and validated loader state: ``canonical_replicas``, the ledger ``entries`` of
    the lanes it covers, the ``datasets`` it was taken over and the ``topology`` it was taken on."""

    canonical_replicas: int
    entries: dict[int, tuple[dict[str, Any], int, int]]  # lane -> (source state, consumed, turn flags): an Entry
    datasets: list[DatasetRecord]  # ascending ids
    topology: dict[str, Any] = field(default_factory=dict)


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
    if not states:
        return {}
    first = states[0]
    return {k: v for k, v in first.items() if all(k in s and s[k] == v for s in states[1:])}


def make_state(canonical_replicas: int, entries: Mapping[int, Entry], datasets: list[DatasetRecord],
               topology: Mapping[str, Any]) -> LoaderStateDict:
    """The JSON state of ``entries`` (lane -> (source state, consumed, turn flags))."""
    lanes = sorted(entries)
    states = [entries[lane][0] for lane in lanes]
    for lane, state in zip(lanes, states):
        if not isinstance(state, dict):
            raise TypeError(f"lane {lane}: the source's state_dict() must be a dict, got {type(state).__name__}")
    common = _common(states)
    return LoaderStateDict(  # the keys are KEYS
        kind=KIND,
        version=VERSION,
        canonical_replicas=canonical_replicas,
        datasets=[DatasetRecord(id=d["id"], name=d["name"], fingerprint=d["fingerprint"]) for d in datasets],
        source=common,
        lanes=[[lane, entries[lane][1], entries[lane][2], {k: v for k, v in state.items() if k not in common}]
               for lane, state in zip(lanes, states)],
        topology=dict(topology),
    )


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
    if type(state.get(KEY_VERSION)) is not int or state[KEY_VERSION] != VERSION:
        raise ValueError(f"loader state version {show(state.get(KEY_VERSION))} is not supported (this zephon reads "
                         f"version {VERSION}); restore it with the zephon version that wrote it")
    missing, unknown = [k for k in KEYS if k not in state], sorted(set(state) - set(KEYS))
    if missing or unknown:
        raise _bad(f"missing {missing}, unknown keys {show(unknown)}")
    replicas = state[KEY_REPLICAS]
    if type(replicas) is not int or not 1 <= replicas <= MAX_REPLICAS:
        raise _bad(f"canonical_replicas={show(replicas)} must be an int in [1, {MAX_REPLICAS}]")
    datasets = state[KEY_DATASETS]
    if not isinstance(datasets, list) or not all(
            isinstance(d, dict) and set(d) == {"id", "name", "fingerprint"} for d in datasets):
        raise _bad(f"datasets must be a list of {{'id', 'name', 'fingerprint'}}, got {show(datasets)}")
    common, lanes = state[KEY_SOURCE], state[KEY_LANES]
    if not isinstance(common, dict) or not isinstance(lanes, list):
        raise _bad("'source' must be a dict and 'lanes' a list")
    entries: dict[int, tuple[dict[str, Any], int, int]] = {}
    for row in lanes:
        if not (isinstance(row, list) and len(row) == 4 and all(type(v) is int for v in row[:3])
                and isinstance(row[3], dict)):
            raise _bad(f"every lane must be [lane, consumed, turn, state], got {show(row)}")
        lane, consumed, turn, rest = row
        if not 0 <= lane < replicas:
            raise _bad(f"lane {lane} is outside [0, canonical_replicas={replicas})")
        if consumed < 0:
            raise _bad(f"lane {lane} has consumed={consumed} < 0")
        if not 0 <= turn <= 3:
            raise _bad(f"lane {lane} has turn={turn}, outside 0..3")
        if lane in entries:
            raise _bad(f"lane {lane} appears twice")
        entries[lane] = ({**common, **rest}, consumed, turn)
    topology = state[KEY_TOPOLOGY]
    if not isinstance(topology, dict):
        raise _bad("'topology' must be a dict")
    return LoaderState(replicas, entries, datasets, topology)


def merge_states(states: Iterable[Any]) -> LoaderStateDict:
    """One state covering the lanes of all ``states`` (e.g. every rank's): pure.

    The states must agree on ``canonical_replicas`` and the datasets; a lane may appear in
    several only with identical entries. The result is global when the lanes cover
    ``range(canonical_replicas)`` (see :func:`missing_lanes`).
    """
    parsed = [parse_state(s) for s in states]
    if not parsed:
        raise ValueError("merge_states needs at least one state; pass every rank's state_dict()")
    first = parsed[0]
    entries: dict[int, Entry] = {}
    ranks: set[int] = set()
    for k, p in enumerate(parsed):
        if p.canonical_replicas != first.canonical_replicas:
            raise ValueError(f"merge_states: state {k} has canonical_replicas={p.canonical_replicas}, state 0 has "
                             f"{first.canonical_replicas}; merge states of one run only")
        if p.datasets != first.datasets:
            raise ValueError(f"merge_states: state {k} was taken over other datasets ({p.datasets} vs "
                             f"{first.datasets}); merge states of one run only")
        for lane, entry in p.entries.items():
            if lane in entries and entries[lane] != entry:
                raise ValueError(f"merge_states: lane {lane} appears in two states with different positions; "
                                 "each lane must come from the one rank that owns it")
            entries[lane] = entry
        ranks.update(r for r in p.topology.get("ranks", ()) if type(r) is int)
    topology = dict(first.topology)
    if ranks:
        topology["ranks"] = sorted(ranks)
    return make_state(first.canonical_replicas, entries, first.datasets, topology)


def missing_lanes(state: LoaderState, lanes: Iterable[int]) -> list[int]:
    return [lane for lane in lanes if lane not in state.entries]


def dataset_differences(saved: list[DatasetRecord], current: list[DatasetRecord]) -> list[str]:
    """What differs between the datasets a state was taken over and the current ones."""
    if [(d["id"], d["name"]) for d in saved] != [(d["id"], d["name"]) for d in current]:
        return [f"datasets: the checkpoint has {[d['name'] for d in saved]}, this pipeline has "
                f"{[d['name'] for d in current]}"]
    return [f"dataset {c['name']!r}: content fingerprint {s['fingerprint']!r} in the checkpoint, "
            f"{c['fingerprint']!r} now" for s, c in zip(saved, current) if s["fingerprint"] != c["fingerprint"]]
