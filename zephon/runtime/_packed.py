"""Packed streams: a lane's samples through its packer, read by a reader a batch of sequences at a time.

:class:`PackedLane` is one lane's packed stream: the lane's samples (a one-lane
:class:`LaneMux`), materialized a block at a time (records, map / filter / tokenize steps),
fed one document at a time to the pipeline's :class:`zephon.ops.Packing`. The lane's ledger
is taken at the oldest document the packer still holds (its *window* starts there): a
restore regenerates the window's documents from that entry, re-reads and re-tokenizes them,
and rebuilds the packer from its JSON state. So a checkpoint holds pointers and token offsets,
never tokens, and every lane continues exactly on any topology.

:class:`PackedReader` reads its lanes round robin a turn (``unit`` sequences of one lane) at a
time, the rule of :class:`LaneMux` with sequences for samples, and reports a
:class:`Snapshot` of the lane after each turn; :class:`Snapshots` is the ledger at any
position of the reader (sequences handed out), built from them.
"""
from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from zephon.limits import show
from zephon.ops import Doc, Packing, Row, held_documents, pack
from zephon.ops.tokenize import KEY_IDS
from zephon.runtime._even import RankCount, units
from zephon.runtime._sealing import Entry
from zephon.runtime._stream import DELIVERED, DROPPED, Items, LaneMux, Tracker
from zephon.work.migration import LaneRead

BLOCK = 64  # samples materialized (read, tokenized) at a time per lane
KEY_WINDOW, KEY_STATE, KEY_PACKER = "window", "state", "packer"
MAX_WINDOW = 1 << 20


def initial_operator(packing: Packing) -> dict[str, Any]:
    """A lane's operator state before its first document."""
    return {KEY_WINDOW: 0, KEY_STATE: packing.to_json(packing.init(), 0, 0), KEY_PACKER: dict(packing.settings)}


def lane_reads(entries: Mapping[int, Sequence[Any]], operators: Mapping[int, Any]) -> dict[int, LaneRead]:
    """Each lane's state and the samples read from its chunk's start on (``zephon.work``'s
    migration and ``received`` take them); a packed lane's (one with an ``operators`` state)
    also those its packer still holds. A packer's window counts as read but for the documents
    its state holds (partly delivered or queued): the rest of it reached the loop whole."""
    reads: dict[int, LaneRead] = {}
    for lane, (state, consumed, *_) in entries.items():
        operator = operators.get(lane)
        if operator is None:
            reads[lane] = (state, consumed)
            continue
        window = operator.get(KEY_WINDOW) if isinstance(operator, dict) else None
        try:
            held = held_documents(operator.get(KEY_STATE) if isinstance(operator, dict) else None)
        except ValueError as error:
            raise ValueError(f"lane {lane}: {error}") from None
        if type(window) is not int or (held and held[-1] >= window):
            raise ValueError(f"lane {lane}: the packer state holds documents {show(held)} of a window of "
                             f"{show(window)}; the checkpoint is corrupted")
        reads[lane] = (state, consumed + window, tuple(consumed + i for i in held))
    return reads


def check_operator(packing: Packing, data: Any, lane: int) -> None:
    """Refuse a lane's operator state that this packing could not have written."""
    if not (isinstance(data, dict) and sorted(data) == [KEY_PACKER, KEY_STATE, KEY_WINDOW]
            and type(data[KEY_WINDOW]) is int and 0 <= data[KEY_WINDOW] <= MAX_WINDOW):
        raise ValueError(f"lane {lane}: the {packing.name} state must be {{'window': int in 0 .. {MAX_WINDOW}, "
                         f"'state': ..., 'packer': ...}}, got {show(data)}")
    _check_settings(packing, data[KEY_PACKER], lane)
    try:
        held = packing.documents_held(data[KEY_STATE])
    except ValueError as error:
        raise ValueError(f"lane {lane}: {error}") from None
    window = data[KEY_WINDOW]
    if (held is None and window) or (held is not None and (held[0] != 0 or held[1] > window)):
        raise ValueError(f"lane {lane}: the {packing.name} state holds documents {show(held)} of a window of "
                         f"{window}, but a window runs from the oldest document its state holds; the checkpoint "
                         "is corrupted")


def _check_settings(packing: Packing, saved: Any, lane: int) -> None:
    """Refuse a state packed with other settings, naming each that differs."""
    fix = "restore it into a pipeline with the same tokenize / pack / ensure_mixture steps"
    if type(saved) is str:  # written before the settings were spelled out: only their digest
        if saved != packing.digest:
            raise ValueError(f"lane {lane}: the checkpoint's sequences were packed with other settings (seq_len, "
                             f"strategy, token ids, ensure_mixture or the tokenizer differ); {fix}")
        return
    if not (type(saved) is dict and all(type(v) in (int, str, bool, type(None)) for v in saved.values())):
        raise ValueError(f"lane {lane}: the {packing.name} settings must be a dict of ints, strings, bools and nulls, got {show(saved)}")
    differ = _differences(saved, dict(packing.settings))
    if differ and not _differences(saved, dict(packing.named)):
        warnings.warn("zephon: the checkpoint names its tokenizers without their vocabularies (an older zephon "
                      "wrote it), so only their names were checked on restore", RuntimeWarning, stacklevel=2)
    elif differ:
        raise ValueError(f"lane {lane}: the checkpoint's sequences were packed with other settings ({'; '.join(differ)}); "
                         f"{fix}")


def _differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    return [f"{key}: {_setting(saved, key)} in the checkpoint, {_setting(now, key)} now"
            for key in sorted(saved.keys() | now.keys()) if _typed(saved, key) != _typed(now, key)]


def _setting(settings: Mapping[str, Any], key: str) -> str:
    return show(settings[key]) if key in settings else "absent"


def _typed(settings: Mapping[str, Any], key: str) -> tuple[Any, ...]:
    return (type(settings[key]), settings[key]) if key in settings else ()  # True is not 1


class PackedLane:
    """Lane ``lane`` (of ``replicas``) of ``pipeline`` through ``packing``, resumed from its
    ledger ``entry`` and operator state ``operator``; ``readahead`` (optional) is fed its chunks."""

    def __init__(self, pipeline: Items, packing: Packing, lane: int, replicas: int, entry: Entry,
                 operator: Mapping[str, Any], readahead: Any = None):
        self.lane, self._pipeline, self._packing = lane, pipeline, packing
        state, consumed, _ = entry
        start = {lane: (state, consumed, 0)}
        self._mux = LaneMux(pipeline.source, [lane], replicas, start, pipeline.vocabulary, readahead)
        self._tracker = Tracker(start, pipeline.source, replicas)
        self._window: deque[Doc | None] = deque()  # documents from the base on (None: dropped by a filter)
        self._ahead: deque[Doc | None] = deque()  # materialized, not fed yet
        self._base = self._fed = 0  # lane positions: the window's start, the next document to feed
        self.ended = False
        self.filtered = self.dropped_tokens = 0
        for _ in range(operator[KEY_WINDOW]):
            if not self._feed_one():
                raise ValueError(f"lane {lane}: the checkpoint's {packing.name} state holds {operator[KEY_WINDOW]} "
                                 "documents, but the lane ends before; the checkpoint is corrupted")
        try:
            self._state = packing.from_json(operator[KEY_STATE], list(self._window))
        except ValueError as error:
            raise ValueError(f"lane {lane}: {error}") from None

    def _next(self) -> tuple[bool, Doc | None]:
        """The next sample's document (None where a filter dropped it); ``(False, None)`` at the end."""
        if not self._ahead:
            pointers, components, _ = self._mux.take(BLOCK)
            self._tracker.extend(*self._mux.drain())
            if not len(pointers):
                return False, None
            items = self._pipeline.materialize_marked(pointers, components)
            config, at = self._packing.pack, self._fed
            self._ahead.extend(None if item is DROPPED else pack.document(config, at + k, tuple(pointer), component,
                                                                          _ids(item))
                               for k, (item, pointer, component) in
                               enumerate(zip(items, pointers.tolist(), components.tolist())))
        return True, self._ahead.popleft()

    def _feed_one(self) -> bool:
        """Move one sample into the window (restoring: the packer state comes from JSON)."""
        more, doc = self._next()
        if more:
            self._window.append(doc)
            self._fed += 1
        return more

    def take(self, n: int) -> list[Row]:
        """Up to ``n`` finished sequences (fewer only at the lane's end)."""
        packing, state = self._packing, self._state
        while packing.ready(state) < n and not self.ended:
            more, doc = self._next()
            if not more:
                state, dropped = packing.finish(state)
                self.dropped_tokens += dropped
                self.ended = True
                break
            self._window.append(doc)
            self._fed += 1
            if doc is None:
                self.filtered += 1
            else:
                state = packing.step(state, doc)
        rows, self._state = packing.take(state, n)
        self._slide()
        return rows

    def _slide(self) -> None:
        """Start the window at the oldest document the packer holds."""
        oldest = self._packing.oldest(self._state)
        base = self._fed if oldest is None else oldest
        while self._base < base:
            self._window.popleft()
            self._base += 1
        self._tracker.fold(base)

    def ledger(self) -> tuple[Entry, dict[str, Any]]:
        """The lane's entry at its window's start (turn flags 0) and its operator state."""
        window = self._fed - self._base
        entry = self._tracker.entries_at(self._base)[self.lane]
        return entry, {KEY_WINDOW: window, KEY_STATE: self._packing.to_json(self._state, self._base, window),
                       KEY_PACKER: dict(self._packing.settings)}


def _ids(item: Any) -> np.ndarray:
    ids = item.get(KEY_IDS) if type(item) is dict or isinstance(item, Mapping) else None
    if type(ids) is np.ndarray and ids.dtype == np.int64 and ids.ndim == 1:
        return ids
    if ids is None:
        raise TypeError(f"pack: item {item.get('_sample_id') if isinstance(item, Mapping) else item!r} has no "
                        f"{KEY_IDS!r}; add .tokenize(tokenizer) before .pack, or read a column of token ids")
    return np.asarray(ids, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """After a turn: the reader's ``position`` (sequences handed out), the ``lane`` that moved,
    its ``entry`` (chunk-start state, consumed) and ``operator`` state, and the lanes that gave
    their turn of the round in progress (``delivered``)."""

    position: int
    lane: int
    entry: Entry
    operator: dict[str, Any]
    delivered: tuple[int, ...]

    @property
    def state(self) -> Mapping[str, Any]:  # what the loader's stats watch for new passes
        return self.entry[0]


class PackedReader:
    """A reader's packed stream over ``lanes`` (of ``replicas``) of ``pipeline`` through
    ``packing``, from their ledger ``entries`` and ``operators`` states: turns of ``unit``
    sequences round robin, lanes that gave their turn of the round first (``DELIVERED``), as
    :class:`LaneMux` does; ``readahead`` (optional) is fed the lanes' chunks."""

    def __init__(self, pipeline: Items, packing: Packing, lanes: Sequence[int], replicas: int,
                 entries: Mapping[int, Entry], operators: Mapping[int, Mapping[str, Any]], unit: int,
                 readahead: Any = None):
        first = [lane for lane in lanes if entries[lane][2] & DELIVERED]
        order = first + [lane for lane in lanes if lane not in first]
        self._readahead = readahead
        shared = None if readahead is None else _Shared(readahead)
        self._active = [PackedLane(pipeline, packing, lane, replicas, entries[lane], operators[lane], shared)
                        for lane in order]
        self._turn = len(first) % max(1, len(self._active))
        self.unit, self.position = unit, 0
        self.filtered = self.dropped_tokens = 0  # over all its lanes, since the caller last reset them

    @property
    def exhausted(self) -> bool:
        return not self._active

    def turn(self) -> tuple[int, list[Row], Snapshot] | None:
        """The next turn: its lane, its sequences (a lane's last may be short) and the snapshot
        after it; None when every lane has ended."""
        while self._active:
            lane = self._active[self._turn]
            filtered, dropped = lane.filtered, lane.dropped_tokens
            rows = lane.take(self.unit)
            self.filtered += lane.filtered - filtered
            self.dropped_tokens += lane.dropped_tokens - dropped
            if len(rows) < self.unit and lane.ended:
                self._active.pop(self._turn)
                if self._turn == len(self._active):
                    self._turn = 0
                if not self._active and self._readahead is not None:
                    self._readahead.close()
            else:
                self._turn = (self._turn + 1) % len(self._active)
            if rows:
                self.position += len(rows)
                delivered = tuple(s.lane for s in self._active[:self._turn])
                return lane.lane, rows, Snapshot(self.position, lane.lane, *lane.ledger(), delivered)
        return None


class _Shared:
    """The reader's readahead as each of its lanes sees it: fed by all, closed by none (the
    reader closes it when its last lane ends)."""

    def __init__(self, readahead: Any):
        self._readahead = readahead

    def feed(self, *args: Any) -> None:
        self._readahead.feed(*args)

    def close(self) -> None:
        pass


class Snapshots:
    """The ledger of a reader's lanes at any position, from its starting ``entries``, their
    ``operators`` states and the snapshots (in order): the trainer's counterpart of :class:`Tracker`."""

    def __init__(self, entries: Mapping[int, Entry], operators: Mapping[int, Mapping[str, Any]]):
        self._entries = {lane: (state, consumed, 0) for lane, (state, consumed, _) in entries.items()}
        self._operators = {lane: dict(operators[lane]) for lane in entries}
        self._delivered = {lane for lane, (_, _, flags) in entries.items() if flags & DELIVERED}
        self._snapshots: deque[Snapshot] = deque()

    def extend(self, snapshots: Sequence[Snapshot]) -> None:
        self._snapshots.extend(snapshots)

    def fold(self, position: int) -> None:
        """Apply the snapshots at or before ``position`` (positions below it can no longer be asked for)."""
        while self._snapshots and self._snapshots[0].position <= position:
            s = self._snapshots.popleft()
            self._entries[s.lane], self._operators[s.lane], self._delivered = s.entry, s.operator, set(s.delivered)

    def _at(self, position: int) -> tuple[dict[int, Entry], dict[int, dict[str, Any]], set[int]]:
        entries, operators, delivered = dict(self._entries), dict(self._operators), self._delivered
        for s in self._snapshots:
            if s.position > position:
                break
            entries[s.lane], operators[s.lane], delivered = s.entry, s.operator, set(s.delivered)
        return entries, operators, delivered

    def entries_at(self, position: int) -> dict[int, Entry]:
        entries, _, delivered = self._at(position)
        return {lane: (state, consumed, DELIVERED if lane in delivered else 0)
                for lane, (state, consumed, _) in entries.items()}

    def operators_at(self, position: int) -> dict[int, dict[str, Any]]:
        return self._at(position)[1]


def packed_items(pipeline: Items, packing: Packing, lanes: Sequence[int], replicas: int,
                 entries: Mapping[int, Entry], operators: Mapping[int, Mapping[str, Any]],
                 kinds: Sequence[str | None]) -> Iterator[dict[str, Any]]:
    """The packed sequences of ``lanes`` one at a time, as items (numpy arrays)."""
    reader = PackedReader(pipeline, packing, lanes, replicas, entries, operators, 1, pipeline.readahead())
    while (turn := reader.turn()) is not None:
        yield from sequence_items(packing, turn[1], kinds)


def sequence_items(packing: Packing, rows: Sequence[Row], names: Sequence[str | None]) -> list[dict[str, Any]]:
    """Packed items: ``input_ids``, ``segment_ids``, ``position_ids`` ``(seq_len,)``, ``_documents``
    (per piece: dataset, shard, offset, component, start, end) and ``_tokens`` per component."""
    arrays, tokens = pack.arrays(packing.pack, rows), pack.token_counts(rows, len(names)).tolist()
    out = []
    for r, pieces in enumerate(documents(rows, names)):
        out.append({key: arrays[key][r] for key in ("input_ids", "segment_ids", "position_ids")})
        out[-1]["_documents"] = pieces
        out[-1]["_tokens"] = {name: tokens[r][c] for c, name in enumerate(names) if name is not None}
    return out


def documents(rows: Sequence[Row], names: Sequence[str | None]) -> list[list[tuple[Any, ...]]]:
    """Per row, its pieces as ``(dataset, shard, offset, component name, start, end)``."""
    return [[(d, s, o, names[c], a, b) for d, s, o, c, a, b in row] for row in pack.pieces(rows)]


def count_sequences(pipeline: Items, packing: Packing, lane: int, replicas: int, entry: Entry,
                    operator: Mapping[str, Any]) -> int:
    """The sequences left in a lane from its ledger, by packing the rest of it (reads and
    tokenizes every remaining document)."""
    packed = PackedLane(pipeline, packing, lane, replicas, entry, operator)
    total = 0
    while rows := packed.take(1024):
        total += len(rows)
    return total


def count_packed(pipeline: Items, packing: Packing, replicas: int, entries: Mapping[int, Entry],
                 operators: Mapping[int, Mapping[str, Any]], batch_size: int | None, drop_last: bool) -> RankCount:
    """The remaining batches and sequences of the lanes of ``entries`` (packing each to its end)."""
    left = {lane: count_sequences(pipeline, packing, lane, replicas, entries[lane], operators[lane])
            for lane in sorted(entries)}
    return RankCount(sum(units(n, batch_size, drop_last) for n in left.values()), sum(left.values()))
