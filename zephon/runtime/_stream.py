"""One reader's sample stream over its lanes, and the ledger that checkpoints it exactly.

A reader (a DataLoader worker, or the main process with ``num_workers=0``) owns some lanes.
It reads them **round robin, one turn at a time**: a turn is the next ``unit`` samples of one
lane (a batch, for a loader that batches; one sample otherwise), consecutive in the lane's
read order and running on into the lane's next chunk when its chunk ends. Round ``j`` gives
every active lane one turn, in lane order; a lane whose source ends gives a shorter last
turn (or none) and leaves the rotation. So a batch is a window of one lane's stream and
carries the mixture as that stream does. Positions in this stream are absolute sample counts
of the reader.

:class:`LaneMux` produces the stream (whole rounds at a time, as arrays, where it can) and
records two kinds of facts, by position:

* a :class:`Segment` — from ``start`` on, turns of ``unit`` samples visit ``lanes`` in order,
  beginning with ``lanes[first]`` (it changes only when a lane ends, so there are few);
* an :class:`Event` — at ``position`` a lane started a new chunk whose chunk-start state is
  ``state`` (or, for a lane that ended, the state that returns ``None``), as the source's
  cheap ``state_token()``.

:class:`Tracker` turns those facts into the **ledger** at any position ``p``: per lane, the
lane source's state at the start of the chunk in flight and how many samples of that chunk
were consumed. Only the states a caller asks for are sealed into ``state_dict()`` form
(:class:`Sealer`), so a reader does not seal one per chunk. The ledger is all a checkpoint
holds; restoring loads the state, regenerates the chunk and skips the consumed samples. Facts
are positioned, so a producer may run ahead of its consumer (prefetch) without changing the
ledger at ``p``.

Turn flags make a resume on the *same* topology exact batch for batch, not only lane for
lane: ``DELIVERED`` marks the lanes that already gave their turn of the current round. A
restored reader puts those lanes first in its rotation and starts the round after them. On
another topology the flags still give a deterministic order; per-lane streams are exact
either way.
"""
from __future__ import annotations

import weakref
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from zephon._ext.rounds import interleave, same_place
from zephon.core.chunk_checks import writable_order
from zephon.runtime._gc import paused_gc
from zephon.runtime._sealing import Entry, Sealer, SealingLedger
from zephon.work import WorkChunk, WorkSource


class Items(Protocol):
    """What a reader needs of a pipeline (``zephon.runtime.Pipeline`` is one)."""

    @property
    def source(self) -> WorkSource: ...  # the template source

    @property
    def datasets_by_id(self) -> Mapping[int, Any]: ...

    @property
    def vocabulary(self) -> dict[str, int]: ...  # component name -> id

    @property
    def pointer_only(self) -> bool: ...  # an item is just its pointer and component

    def materialize(self, pointers: np.ndarray, components: np.ndarray) -> list[Any]: ...

    def materialize_marked(self, pointers: np.ndarray, components: np.ndarray) -> list[Any]: ...  # DROPPED where filtered

    def readahead(self) -> Any: ...  # a zephon.io readahead of the pipeline's records, or None


FOLD_AFTER = 1024  # facts (chunk starts, rotation changes) a Tracker holds before a fold forgets them
DELIVERED = 1  # turn flag: the lane already gave its turn of its reader's current round
SERVED = 2  # turn flag: the lane's reader already gave its batch of the loader's current cycle
DROPPED = object()  # the place of an item a pipeline's filter step rejected (it still counts as consumed)


@dataclass(frozen=True, slots=True)
class Segment:
    """From ``start`` on, turns of ``unit`` samples visit ``lanes`` in order, beginning with
    ``lanes[first]`` (empty: the stream has ended). ``start`` is a turn boundary."""

    start: int  # absolute position of the segment's first turn, >= 0
    lanes: tuple[int, ...]
    unit: int = 1  # samples per turn
    first: int = 0  # the index in ``lanes`` of the first turn's lane

    def _origin(self) -> int:
        """Where the round of the first turn would have begun (lanes before ``first`` had theirs)."""
        return self.start - self.first * self.unit

    def lane_at(self, position: int) -> int:
        """The lane whose turn holds ``position`` (``position >= start``)."""
        return self.lanes[(position - self._origin()) // self.unit % len(self.lanes)]

    def count(self, index: int, lo: int, hi: int) -> int:
        """Samples of ``lanes[index]`` at positions ``[lo, hi)``, ``start <= lo <= hi``."""
        origin, unit, period = self._origin(), self.unit, self.unit * len(self.lanes)
        rounds_hi, into_hi = divmod(hi - origin, period)
        rounds_lo, into_lo = divmod(lo - origin, period)
        turn = index * unit  # where the lane's turn begins in a round
        return ((rounds_hi - rounds_lo) * unit + min(max(into_hi - turn, 0), unit)
                - min(max(into_lo - turn, 0), unit))

    def lanes_within(self, lo: int, hi: int) -> tuple[int, ...]:
        """The lanes whose turns hold positions in ``[lo, hi)``, ``start <= lo < hi``."""
        origin, n = self._origin(), len(self.lanes)
        first, last = (lo - origin) // self.unit, (hi - 1 - origin) // self.unit
        if last - first + 1 >= n:
            return self.lanes
        a, b = first % n, last % n
        return self.lanes[a:b + 1] if a <= b else self.lanes[a:] + self.lanes[:b + 1]

    def delivered(self, position: int) -> tuple[int, ...]:
        """The lanes that gave their whole turn of the round in progress at ``position``."""
        return self.lanes[:(position - self._origin()) // self.unit % len(self.lanes)] if self.lanes else ()


@dataclass(frozen=True, slots=True)
class Event:
    """A lane's chunk boundary: samples of the lane at ``position`` or later belong to the chunk
    that starts at ``state`` (for a lane that ended: ``state`` returns ``None`` and no sample
    of the lane comes at or after ``position``)."""

    position: int
    lane: int
    state: Any  # the source's state_token() (or a state_dict(): either seals to the same state)

    def __reduce__(self) -> tuple[type[Event], tuple[int, int, Any]]:
        return Event, (self.position, self.lane, self.state)  # a reader sends one per chunk: the default costs 3x


class _Lane:
    __slots__ = ("lane", "source", "pointers", "components", "chunks", "ahead", "fed")

    def __init__(self, lane: int, source: WorkSource):
        self.lane, self.source = lane, source
        self.pointers = np.zeros((0, 3), dtype=np.int64)
        self.components = np.zeros(0, dtype=np.int64)
        self.chunks = 0  # chunks pulled (the readahead's priority)
        # readahead: (state, chunk, source after it), the next chunk pulled early
        self.ahead: tuple[Mapping[str, Any], WorkChunk | None, WorkSource] | None = None
        self.fed = False  # the chunk in flight was fed to the readahead as the next chunk


STREAM_TURN_BYTES = 192  # a lane's turns go into the caller's arrays past the caches from this size on: 8 lanes' rounds
# into int32-id slots, plain against past the caches, turns of 1 / 4 samples: 45 / 53 against 31 / 45 M/s; 8 / 256: 53 / 56
# against 58 / 67 (shorter turns leave the CPU's write-combining buffers half full)
Piece = tuple[np.ndarray, np.ndarray]  # consecutive samples: pointers (k, 3) and component ids (k,)


def write(into: Piece, at: int, pieces: Sequence[Piece]) -> int:
    """Copy consecutive pieces into ``into``'s ``(pointers, component ids)`` arrays from sample
    ``at`` on, cast to their dtypes (a piece that lies in its place there already stays as it
    is: :meth:`LaneMux.take_into`); returns where they end."""
    into_pointers, into_components = into
    for pointers, components in pieces:
        end = at + len(pointers)
        if end > at and not (same_place(pointers, into_pointers[at:end])
                             and same_place(components, into_components[at:end])):
            into_pointers[at:end], into_components[at:end] = pointers, components
        at = end
    return at


def interleave_reference(pointers: np.ndarray, components: np.ndarray, lane_pointers: np.ndarray,
                         lane_components: np.ndarray, lane: int, lanes: int, unit: int, stream: bool = False) -> None:
    """Write turn ``r`` of lane ``lane`` of ``lanes`` (``unit`` samples of ``lane_pointers`` and
    ``lane_components``) at sample ``(r * lanes + lane) * unit`` of ``pointers`` and
    ``components``, of any layout and integer dtypes: the definition of
    ``zephon._ext.rounds.interleave`` (whose ``stream`` writes past the caches; here it changes nothing)."""
    rounds = len(lane_pointers) // unit
    pointers[:rounds * lanes * unit].reshape(rounds, lanes, unit, 3)[:, lane] = lane_pointers.reshape(rounds, unit, 3)
    components[:rounds * lanes * unit].reshape(rounds, lanes, unit)[:, lane] = lane_components.reshape(rounds, unit)


def _kernel_writes(pointers: np.ndarray, components: np.ndarray) -> bool:
    """Whether ``zephon._ext.rounds.interleave`` takes these arrays: int64 pointers, int32 or int64
    ids, both C-contiguous and writable (``take_into`` takes any layout; the readers' are these)."""
    return (writable_order(pointers) and components.dtype in (np.int32, np.int64)
            and components.flags.c_contiguous and components.flags.writeable)


def same_place_reference(array: np.ndarray, place: np.ndarray) -> bool:
    """Whether ``array`` is the very memory of ``place``: the same start, layout and dtype (the
    definition of ``zephon._ext.rounds.same_place``)."""
    return array.ctypes.data == place.ctypes.data and array.strides == place.strides and array.dtype == place.dtype


def joined(pieces: Sequence[Piece]) -> Piece:
    """Consecutive pieces as one contiguous ``(pointers, component ids)`` pair."""
    if len(pieces) == 1:
        pointers, components = pieces[0]
    elif not pieces:
        pointers, components = np.zeros((0, 3), dtype=np.int64), np.zeros(0, dtype=np.int64)
    else:
        pointers, components = np.concatenate([p for p, _ in pieces]), np.concatenate([c for _, c in pieces])
    return np.ascontiguousarray(pointers), np.ascontiguousarray(components)


def component_table(vocabulary: Mapping[str, int]) -> dict[str, int]:
    """Check a source's ``component_ids()``: unique non-negative int ids."""
    table = dict(vocabulary)
    ids = list(table.values())
    if not all(type(i) is int and i >= 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"component_ids() must map names to unique ints >= 0, got {table!r}")
    return table


class LaneMux:
    """Round-robin stream of ``lanes`` (of ``canonical_replicas``), a turn of ``unit`` samples per
    lane, resumed from ledger ``entries``.

    ``template`` is the unbound source; each lane is cloned from it and restored to its
    entry ``(state, consumed, turn)``: the chunk is regenerated and ``consumed`` samples
    skipped; lanes flagged ``DELIVERED`` lead the rotation, which resumes right after them.
    Component names are mapped to ids with ``vocabulary`` (the source's ``component_ids()``).
    ``readahead`` (a :class:`zephon.io._readahead.Readahead`, optional) is fed the pointers of
    each lane's chunk in flight (from where the lane resumes) and of its next chunk, which is
    pulled one chunk early from a clone of the lane's source (the stream is unchanged).

    The entries' states are a ledger's: made by sources of ``template``'s settings, or checked
    to restore into them (``LaneBook.entries`` gives only such). They are restored with
    ``restore_checked``, which does not check their settings and seals again.
    """

    def __init__(self, template: WorkSource, lanes: Sequence[int], canonical_replicas: int,
                 entries: Mapping[int, Entry], vocabulary: Mapping[str, int], readahead: Any = None,
                 unit: int = 1):
        self._vocabulary = vocabulary
        self._names_ids: tuple[tuple[str, ...] | None, np.ndarray | None] = (None, None)  # see _ids_of
        self._template, self._replicas, self.readahead = template, canonical_replicas, readahead
        self._unit = unit
        self._offsets: dict[int, int] = {}  # lane -> samples of its current chunk already generated
        self.position = 0  # samples handed out by take()
        self._frontier = 0  # samples generated
        self._carry: deque[Piece] = deque()
        self._place: tuple[Piece, int] | None = None  # take_into's arrays and the stream position of their first
        self._pending = 0  # samples in the carry
        self._turns: deque[tuple[int, int]] = deque()  # the carry's turns (unit > 1) in runs: (length, count)
        self._segments: list[Segment] = []
        self._events: list[Event] = []
        first: list[_Lane] = []
        rest: list[_Lane] = []
        with paused_gc():  # each lane's restored source and chunk: thousands set off full collections
            for lane in lanes:
                self._resume(lane, entries[lane], first, rest)
        # lanes that gave their turn of the current round go first, and the rotation starts after them
        self._active = first + rest
        self._ids = tuple(slot.lane for slot in self._active)  # the active lanes, in their rotation
        self._turn = len(first) % max(1, len(self._active))  # the index of the lane whose turn is next
        self._segments.append(Segment(0, self._ids, unit, self._turn))

    def _resume(self, lane: int, entry: Entry, first: list[_Lane], rest: list[_Lane]) -> None:
        """Restore ``lane`` to its ledger ``entry``: its chunk in flight made and its consumed
        samples skipped; it joins ``first`` (it gave its turn of the round) or ``rest``, unless
        it has ended."""
        state, consumed, flags = entry
        source = self._template.clone_for_lane(lane, self._replicas)
        source.restore_checked(state)
        slot = _Lane(lane, source)
        if self._load_chunk(slot) is None:
            if consumed:
                raise ValueError(f"lane {lane}: the checkpoint says {consumed} samples of its chunk were "
                                 "consumed, but the lane has ended there; the checkpoint is corrupted")
            return
        if consumed > len(slot.pointers):
            raise ValueError(f"lane {lane}: the checkpoint says {consumed} samples of its chunk were consumed, "
                             f"but the chunk holds {len(slot.pointers)}; the checkpoint is corrupted")
        self._offsets[lane] = consumed
        self._read_ahead(slot, consumed)
        (first if flags & DELIVERED else rest).append(slot)

    @property
    def unit(self) -> int:
        """Samples per turn."""
        return self._unit

    @property
    def exhausted(self) -> bool:
        """Every lane has ended and every sample was handed out."""
        return not self._active and not self._pending

    def _pull(self, slot: _Lane) -> tuple[Any, WorkChunk | None]:
        """The lane's next chunk and the state before it (taken from ``ahead`` if pulled early)."""
        slot.fed = slot.ahead is not None
        if slot.ahead is not None:
            state, chunk, slot.source = slot.ahead
            slot.ahead = None
            return state, chunk
        return _token(slot.source), slot.source.next_chunk()

    def _read_ahead(self, slot: _Lane, start: int) -> None:
        """Feed the readahead the chunk in flight from ``start`` (unless fed as a next chunk) and the next one."""
        if self.readahead is None:
            return
        if not slot.fed:
            self.readahead.feed(slot.pointers[start:], slot.chunks - 1, self._taken(slot, slot.chunks - 1, start))
        source = self._template.clone_for_lane(slot.lane, self._replicas)
        state = slot.source.state_dict()
        source.restore_checked(state)
        chunk = source.next_chunk()
        slot.ahead = (state, chunk, source)
        if chunk is not None and len(chunk):
            self.readahead.feed(chunk.read_order()[0], slot.chunks, self._taken(slot, slot.chunks, 0))

    def _taken(self, slot: _Lane, chunk: int, start: int) -> Callable[[], int]:
        """How many pointers of the lane's chunk number ``chunk`` (fed from ``start``) the stream handed out."""
        mux = weakref.ref(self)  # the readahead's threads must not keep the stream (and so themselves) alive

        def taken() -> int:
            current = slot.chunks - 1
            if current < chunk:
                return 0
            offset = getattr(mux(), "_offsets", {}).get(slot.lane)
            return offset - start if current == chunk and offset is not None else 1 << 62
        return taken

    def _load_chunk(self, slot: _Lane, at: int = -1) -> Any:
        """Pull the lane's next non-empty chunk, whose first sample is the stream's sample ``at``
        (-1: not known); its chunk-start state (token), or None at the end."""
        while True:
            state, chunk = self._pull(slot)
            slot.chunks += 1
            if chunk is None:
                return None
            if len(chunk):
                break
        ids = self._ids_of(slot.lane, chunk.component_names)
        if not self._read_in_place(slot, chunk, ids, at):
            pointers, local = chunk.read_order()
            slot.pointers, slot.components = pointers, local if ids is None else ids[local]
        return state

    def _read_in_place(self, slot: _Lane, chunk: WorkChunk, ids: np.ndarray | None, at: int) -> bool:
        """Write the chunk's read order where its samples go, when they all go, one after the
        other, to the arrays :meth:`take_into` fills (a lane read alone, whose chunks no
        readahead reads too): they are not copied there again."""
        if at < 0 or self._place is None or self.readahead is not None or len(self._active) != 1:
            return False
        (pointers, components), first = self._place
        start, end = at - first, at - first + len(chunk)
        if start < 0 or end > len(pointers) or not writable_order(pointers[start:end]):
            return False
        pointers, components = pointers[start:end], components[start:end]
        direct = ids is None and writable_order(components)
        local = components if direct else np.empty(len(chunk), dtype=np.int64)
        chunk.read_order_into(pointers, local)
        if not direct:
            components[...] = local if ids is None else ids[local]
        slot.pointers, slot.components = pointers, components
        return True

    def _ids_of(self, lane: int, names: tuple[str, ...]) -> np.ndarray | None:
        """The vocabulary's ids of a chunk's component names (None: the chunk's own ids are
        already those); the last names' are remembered (most chunks of a mixture repeat them)."""
        if names == self._names_ids[0]:
            return self._names_ids[1]
        try:
            ids = np.array([self._vocabulary[name] for name in names], dtype=np.int64)
        except KeyError as error:
            raise ValueError(f"lane {lane} emitted component {error.args[0]!r}, which component_ids() "
                             f"does not declare ({sorted(self._vocabulary)})") from None
        same = len(ids) and ids[0] == 0 and (np.diff(ids) == 1).all()
        self._names_ids = (names, None if same else ids)
        return self._names_ids[1]

    def _turn_of(self, slot: _Lane, want: int) -> int:
        """Generate up to ``want`` samples of the lane's turn, pulling its next chunks as needed
        (a NEW event at each); an END event if it runs out. Returns the samples generated."""
        got = 0
        while got < want:
            at = self._offsets[slot.lane]
            if at == len(slot.pointers):
                state = self._load_chunk(slot, self._frontier + got)
                if state is None:
                    self._events.append(Event(self._frontier + got, slot.lane, _token(slot.source)))
                    del self._offsets[slot.lane]
                    break
                self._events.append(Event(self._frontier + got, slot.lane, state))
                self._offsets[slot.lane] = at = 0
                self._read_ahead(slot, 0)
            k = min(want - got, len(slot.pointers) - at)
            self._carry.append((slot.pointers[at:at + k], slot.components[at:at + k]))
            self._offsets[slot.lane] = at + k
            got += k
        return got

    def _one_turn(self) -> int:
        """The next lane's whole turn (shorter if the lane ends in it, which leaves the rotation)."""
        slot = self._active[self._turn]
        got = self._turn_of(slot, self._unit)
        self._frontier += got
        self._pending += got
        if got and self._unit > 1:
            self._add_turns(got, 1)
        if slot.lane in self._offsets:
            self._turn = (self._turn + 1) % len(self._active)
            return got
        self._active.pop(self._turn)
        self._ids = self._ids[:self._turn] + self._ids[self._turn + 1:]  # a copy in C: lanes end one by one
        if self._turn == len(self._active):
            self._turn = 0
        self._segments.append(Segment(self._frontier, self._ids, self._unit, self._turn))
        return got

    def _rounds(self, need: int, into: Piece | None = None) -> int:
        """Whole rounds in which every lane's turn lies inside its chunk, as arrays; the samples
        made. Several lanes' rounds are interleaved into ``into`` (arrays of ``need`` samples,
        as many rounds as fit) when it is given, else into arrays of their own."""
        m, unit = len(self._active), self._unit
        rounds = need // (m * unit) if into is not None and m > 1 else -(-need // (m * unit))
        for slot in self._active:  # stops at a lane without a whole turn left: O(lanes) only where rounds are made
            rounds = min(rounds, (len(slot.pointers) - self._offsets[slot.lane]) // unit)
            if rounds <= 0:
                return 0
        span = rounds * unit
        if m == 1:
            slot = self._active[0]
            at = self._offsets[slot.lane]
            pointers, components = slot.pointers[at:at + span], slot.components[at:at + span]
        else:
            stream = into is not None and unit * 24 >= STREAM_TURN_BYTES  # arrays the caller reads later
            if into is None:
                into = np.empty((rounds * m * unit, 3), dtype=np.int64), np.empty(rounds * m * unit, dtype=np.int64)
            pointers, components = into[0][:span * m], into[1][:span * m]
            write_turns = interleave if _kernel_writes(pointers, components) else interleave_reference
            for i, slot in enumerate(self._active):
                at = self._offsets[slot.lane]
                write_turns(pointers, components, slot.pointers[at:at + span], slot.components[at:at + span], i, m,
                            unit, stream)
        for slot in self._active:
            self._offsets[slot.lane] += span
        self._carry.append((pointers, components))
        if unit > 1:
            self._add_turns(unit, rounds * m)
        self._frontier += span * m
        self._pending += span * m
        return span * m

    def _generate(self, need: int, into: Piece | None = None) -> None:
        """Append turns to the carry until it grew by ``need`` samples or the lanes ended; with
        ``into`` (arrays of ``need`` samples, for a carry that was empty), rounds are made in
        their place there."""
        made = 0
        while made < need and self._active:
            if self._turn == 0:
                made += self._rounds(need - made, None if into is None else (into[0][made:], into[1][made:]))
                if made >= need:
                    return
            made += self._one_turn()

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The next whole turns, at most ``n`` samples of them (one turn at least; fewer only at the
        end): ``(pointers (k, 3), component ids (k,), turn lengths)``. ``n`` should be a multiple
        of ``unit``."""
        pieces, turns = self._take_pieces(n)
        return (*joined(pieces), turns)

    def take_into(self, into: Piece, at: int, n: int) -> tuple[int, np.ndarray]:
        """:meth:`take`, written into ``into``'s ``(pointers, component ids)`` arrays from sample
        ``at`` on: the samples written and their turn lengths. Several lanes' rounds are
        interleaved there in place (through arrays of their own and copied again, they cost a
        DataLoader worker of 8 lanes 9 % more CPU)."""
        pieces, turns = self._take_pieces(n, None if self._pending else (into[0][at:at + n], into[1][at:at + n]))
        return write(into, at, pieces) - at, turns

    def _take_pieces(self, n: int, into: Piece | None = None) -> tuple[list[Piece], np.ndarray]:
        """:meth:`take` with the samples as consecutive ``(pointers, component ids)`` pieces; with
        ``into`` (:meth:`take_into`'s window), several lanes' rounds and a lone lane's chunks
        lie there already."""
        if self._pending < n:
            self._place = None if into is None else (into, self._frontier)
            try:
                self._generate(n - self._pending, into)
            finally:
                self._place = None
        if self._unit == 1:
            k = min(n, self._pending)
            turns = np.ones(k, dtype=np.int64)
        else:
            k, turns = self._whole_turns(n)
        pieces = self._cut(k)
        if into is not None and self._carry:
            self._detach(into)
        self.position += k
        if not k and self.exhausted and self.readahead is not None:  # the end (else closed when collected)
            self.readahead.close()
        return pieces, turns

    def _detach(self, into: Piece) -> None:
        """Copy the carry's pieces that view ``into`` (a chunk read there whose last turns did
        not fit what was taken): the caller may reuse its arrays once :meth:`take_into` returns."""
        self._carry = deque((p.copy(), c.copy()) if np.may_share_memory(p, into[0]) or
                            np.may_share_memory(c, into[1]) else (p, c) for p, c in self._carry)

    def _add_turns(self, length: int, count: int) -> None:
        """Record ``count`` more turns of ``length`` samples in the carry."""
        if self._turns and self._turns[-1][0] == length:
            count += self._turns.pop()[1]
        self._turns.append((length, count))

    def _whole_turns(self, n: int) -> tuple[int, np.ndarray]:
        """Remove the carry's first whole turns that fit in ``n`` samples (one at least): their
        samples and lengths."""
        lengths: list[int] = []
        counts: list[int] = []
        k = 0
        while self._turns:
            length, count = self._turns[0]
            fit = min(count, (n - k) // length) or (0 if lengths else 1)
            if not fit:
                break
            lengths.append(length)
            counts.append(fit)
            k += length * fit
            if fit < count:
                self._turns[0] = (length, count - fit)
                break
            self._turns.popleft()
        return k, np.repeat(np.array(lengths, dtype=np.int64), counts)

    def _cut(self, k: int) -> list[Piece]:
        """The first ``k`` samples of the carry, removed from it."""
        self._pending -= k
        out: list[Piece] = []
        while k:
            pointers, components = self._carry[0]
            if len(pointers) <= k:
                out.append(self._carry.popleft())
                k -= len(pointers)
            else:
                out.append((pointers[:k], components[:k]))
                self._carry[0] = (pointers[k:], components[k:])
                k = 0
        return out

    def drain(self) -> tuple[list[Segment], list[Event]]:
        """The segments and events recorded since the last drain (they cover every sample taken)."""
        segments, events = self._segments, self._events
        self._segments, self._events = [], []
        return segments, events


def _token(source: WorkSource) -> Any:
    """``source.state_token()``. A ledger takes a mapping for the ``state_dict()`` itself, so
    only the default ``state_token`` may return one."""
    token = source.state_token()
    if isinstance(token, Mapping) and type(source).state_token is not WorkSource.state_token:
        raise TypeError(f"{type(source).__name__}.state_token() returned a mapping: a token other than "
                        "state_dict() itself must not be one (zephon takes a mapping for the sealed state)")
    return token


class Tracker:
    """The ledger of a reader's lanes at any position, from its starting entries and the facts.

    ``extend`` adds the facts a :class:`LaneMux` drained (in order); ``entries_at(p)`` is the
    ledger once the first ``p`` samples are consumed, with the ``DELIVERED`` turn flag and its
    states sealed (``sealer``, over clones of ``template``'s lanes of ``canonical_replicas``);
    ``fold(p)`` forgets what lies before ``p`` once the ledger holds ``fold_after`` facts (then
    positions below ``p`` can no longer be asked for; ``p`` never goes back): a fold walks every
    lane that moved since the last one, which for a reader of a thousand lanes is every lane.
    """

    def __init__(self, entries: Mapping[int, Entry], template: WorkSource, canonical_replicas: int, *,
                 fold_after: int = FOLD_AFTER):
        self.sealer = Sealer(template, canonical_replicas, entries)
        self._fold_after = fold_after
        self._base = {lane: (state, consumed) for lane, (state, consumed, _) in entries.items()}
        self._flags = {lane: flags & DELIVERED for lane, (_, _, flags) in entries.items()}  # until a segment says
        self._base_position = 0
        self._segments: list[tuple[Segment, dict[int, int] | None]] = []  # each with its _index, once made
        self._starts: list[int] = []  # the segments' start positions, ascending
        self._events: list[Event] = []

    def extend(self, segments: Sequence[Segment], events: Sequence[Event]) -> None:
        self._segments.extend((s, None) for s in segments)
        self._starts.extend(s.start for s in segments)
        self._events.extend(events)

    def _count(self, lane: int, a: int, b: int) -> int:
        """Samples of ``lane`` at positions ``[a, b)``, from the segment that holds ``a`` on (each
        lane of a reader of a thousand, counted over every segment since the last fold, took a
        third of a second a save)."""
        total, starts = 0, self._starts
        k = max(0, bisect_right(starts, a) - 1)
        while k < len(starts) and starts[k] < b:
            end = starts[k + 1] if k + 1 < len(starts) else b
            lo, hi = max(a, starts[k]), min(b, end)
            i = self._index(k).get(lane) if lo < hi else None
            if i is not None:
                total += self._segments[k][0].count(i, lo, hi)
            k += 1
        return total

    def _index(self, k: int) -> dict[int, int]:
        """Lane -> its place in segment ``k``'s rotation, made when first asked for: a reader of
        thousands of lanes that end one by one starts a segment at each, and made with each, their
        tables had taken it a minute (16,384 lanes)."""
        segment, index = self._segments[k]
        if index is None:
            index = dict(zip(segment.lanes, range(len(segment.lanes))))
            self._segments[k] = (segment, index)
        return index

    def _delivered(self, position: int) -> set[int]:
        """Lanes that gave their turn of the round in progress at ``position``."""
        current = None
        for segment, _ in self._segments:
            if segment.start <= position:
                current = segment
        if current is None:
            return {lane for lane, flag in self._flags.items() if flag}
        return set(current.delivered(position))

    def entries_at(self, position: int) -> dict[int, Entry]:
        return {lane: (self.sealer(lane, state), consumed, flags)
                for lane, (state, consumed, flags) in self.tokens_at(position).items()}

    def tokens_at(self, position: int) -> dict[int, tuple[Any, int, int]]:
        """:meth:`entries_at` with the states as recorded (tokens, unsealed: ``sealer`` seals them)."""
        if position < self._base_position:
            raise ValueError(f"position {position} was folded away (ledger starts at {self._base_position})")
        moved = self._moved(position)
        delivered = self._delivered(position)
        return {lane: (*moved.get(lane, base), DELIVERED if lane in delivered else 0)
                for lane, base in self._base.items()}

    def _moved(self, position: int) -> dict[int, tuple[Any, int]]:
        """The state and consumed count at ``position`` of the lanes that had a turn or a chunk
        start since the base position (the others stand as in the base)."""
        latest: dict[int, Event] = {}
        for event in self._events:
            if event.position < position:
                latest[event.lane] = event
        out = {}
        for lane in self._turned(position).union(latest):
            last = latest.get(lane)
            if last is not None:
                out[lane] = (last.state, self._count(lane, last.position, position))
            else:
                state, consumed = self._base[lane]
                out[lane] = (state, consumed + self._count(lane, self._base_position, position))
        return out

    def _turned(self, position: int) -> set[int]:
        """The lanes with samples at positions from the base position to ``position``: only
        those whose turns lie there, so that a fold costs what the turns since the last one do,
        not what every lane of a reader of thousands does."""
        out: set[int] = set()
        for k, (segment, _) in enumerate(self._segments):
            end = self._segments[k + 1][0].start if k + 1 < len(self._segments) else position
            lo, hi = max(self._base_position, segment.start), min(position, end)
            if lo < hi and segment.lanes:
                out.update(segment.lanes_within(lo, hi))
        return out

    def fold(self, position: int) -> None:
        if position < self._base_position:
            raise ValueError(f"fold({position}): the ledger was folded at {self._base_position} already")
        if position == self._base_position or len(self._events) + len(self._segments) < self._fold_after:
            return
        self._base.update(self._moved(position))
        self._base_position = position
        self._events = [e for e in self._events if e.position >= position]
        keep = 0
        while keep + 1 < len(self._segments) and self._segments[keep + 1][0].start <= position:
            keep += 1
        del self._segments[:keep], self._starts[:keep]


class ItemStream(Iterator[Any]):
    """Items of ``pipeline`` from one reader's ``lanes`` (of ``canonical_replicas``), one at a time,
    with the exact ledger of what was handed out, starting from ledger ``entries``. ``block``
    pointers are taken at a time (default 4096 on count-only pipelines, else 256).

    ``entries()`` is the ledger after the items returned so far (whatever was read ahead).
    """

    def __init__(self, pipeline: Items, lanes: Sequence[int], canonical_replicas: int,
                 entries: Mapping[int, Entry], block: int | None = None):
        self._pipeline = pipeline
        self._mux = LaneMux(pipeline.source, lanes, canonical_replicas, entries, pipeline.vocabulary,
                            pipeline.readahead())
        self._tracker = Tracker({lane: entries[lane] for lane in lanes}, pipeline.source, canonical_replicas)
        self._block = block or (4096 if pipeline.pointer_only else 256)
        self._items: list[Any] = []
        self._next = 0
        self._position = 0
        self.filtered = 0  # items a filter step dropped so far

    def __next__(self) -> Any:
        while True:
            if self._next == len(self._items):
                self._tracker.fold(self._position)
                pointers, components, _ = self._mux.take(self._block)
                self._tracker.extend(*self._mux.drain())
                if not len(pointers):
                    self._items, self._next = [], 0
                    raise StopIteration
                self._items, self._next = self._pipeline.materialize_marked(pointers, components), 0
            item = self._items[self._next]
            self._next += 1
            self._position += 1  # a filtered item counts as consumed
            if item is not DROPPED:
                return item
            self.filtered += 1

    def entries(self) -> dict[int, Entry]:
        return self._tracker.entries_at(self._position)

    def ledger(self) -> SealingLedger:
        """:meth:`entries`, each lane's state sealed when read (a save makes them field by field)."""
        ledger = SealingLedger()
        ledger.add(self._tracker.tokens_at(self._position), self._tracker.sealer)
        return ledger


def initial_entries(template: WorkSource, lanes: Sequence[int], canonical_replicas: int) -> dict[int, Entry]:
    """The ledger at the start of the stream: every lane at its initial state, nothing consumed
    (made with the collector paused, as :class:`LaneMux` restores its lanes)."""
    with paused_gc():
        return {lane: (template.clone_for_lane(lane, canonical_replicas).state_dict(), 0, 0) for lane in lanes}
