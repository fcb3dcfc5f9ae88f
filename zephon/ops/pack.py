"""pack: a lane's tokenized documents as fixed-length sequences, an operator with a small state.

``"concat"`` concatenates documents and cuts every ``seq_len`` tokens (a document may span
sequences); ``"best_fit"`` never splits a document shorter than ``seq_len`` (longer ones are
cut into ``seq_len`` pieces), places each into the fullest of at most ``pool`` open sequences
it fits, and closes the fullest one when none fits and the pool is full. A finished sequence
waits in ``ready`` until the reader takes it.

The state names *where*, never *what*: each sequence is a tuple of :class:`Piece` (a span of
one :class:`Doc`), and :func:`state_to_json` writes a piece as ``[document, start, end]``, the
document counted from the oldest one the state still holds (:func:`oldest`). Restoring
(:func:`state_from_json`) takes those documents again, re-read and re-tokenized by the caller.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from zephon.limits import MAX_TOKEN_ID, show

CONCAT, BEST_FIT = "concat", "best_fit"
PAD, DROP = "pad", "drop"
POOL = 8  # best_fit's open sequences
MAX_POOL = 1024


@dataclass(frozen=True, slots=True, eq=False)
class Doc:
    """A document as the packer sees it: the ``index``-th sample of its lane, its pointer and
    component id, and its tokens (with the packer's BOS / EOS; never part of a state's JSON)."""

    index: int
    pointer: tuple[int, int, int]
    component: int
    tokens: np.ndarray


@dataclass(frozen=True, slots=True)
class Piece:
    """Tokens ``[start, end)`` of ``doc``."""

    doc: Doc
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


Row = tuple[Piece, ...]  # one sequence's pieces, in order


@dataclass(frozen=True)
class PackConfig:
    """The settings of ``Pipeline.pack`` (see there), checked."""

    seq_len: int
    strategy: str = CONCAT
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    final: str = DROP
    pool: int = POOL


@dataclass(frozen=True)
class PackState:
    """Open sequences (concat: at most one) with the tokens each holds (``fill``), finished
    ones not yet taken, and ``rest``: the part of a long document still to be cut into whole
    sequences (at least ``seq_len`` tokens; cut as they are taken, so a long document never
    makes many sequences at once)."""

    open: tuple[Row, ...] = ()
    ready: tuple[Row, ...] = ()
    fill: tuple[int, ...] = ()
    rest: Piece | None = None


def _token_id(name: str, value: Any) -> int | None:
    if value is not None and (type(value) is not int or not 0 <= value <= MAX_TOKEN_ID):
        raise ValueError(f"pack({name}={value!r}) must be None or an int in [0, 2**63 - 1] (a token id)")
    return value


def config(seq_len: int, strategy: str = CONCAT, pad_id: int | None = None, bos_id: int | None = None,
           eos_id: int | None = None, final: str | None = None, pool: int = POOL) -> PackConfig:
    """Check the settings of ``Pipeline.pack``; ``final=None`` pads when there is a ``pad_id``, else drops."""
    if type(seq_len) is not int or seq_len < 1:
        raise ValueError(f"pack(seq_len={seq_len!r}) must be an int >= 1 (tokens per sequence)")
    if strategy not in (CONCAT, BEST_FIT):
        raise ValueError(f"pack(strategy={strategy!r}) must be {CONCAT!r} or {BEST_FIT!r}")
    ids = [_token_id(name, value) for name, value in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id))]
    if final is None:
        final = PAD if pad_id is not None else DROP
    if final not in (PAD, DROP):
        raise ValueError(f"pack(final={final!r}) must be {PAD!r} (pad the sequences open at the lane's end) or "
                         f"{DROP!r} (drop them, counted)")
    if pad_id is None and (strategy == BEST_FIT or final == PAD):
        raise ValueError(f"pack(strategy={strategy!r}, final={final!r}) pads sequences: pass pad_id=<a token id>")
    if type(pool) is not int or not 1 <= pool <= MAX_POOL:
        raise ValueError(f"pack(pool={pool!r}) must be an int in 1 .. {MAX_POOL} (best_fit's open sequences)")
    return PackConfig(seq_len, strategy, ids[0], ids[1], ids[2], final, pool)


def document(config: PackConfig, index: int, pointer: tuple[int, int, int], component: int, ids: np.ndarray) -> Doc:
    """The packer's document of a tokenized sample: ``ids`` with the packer's BOS and EOS."""
    if config.bos_id is None and config.eos_id is None and type(ids) is np.ndarray and ids.dtype == np.int64:
        return Doc(index, pointer, component, ids.reshape(-1))
    parts = [np.asarray(ids, dtype=np.int64).reshape(-1)]
    if config.bos_id is not None:
        parts.insert(0, np.array([config.bos_id], dtype=np.int64))
    if config.eos_id is not None:
        parts.append(np.array([config.eos_id], dtype=np.int64))
    tokens = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return Doc(index, pointer, component, tokens)


def init(config: PackConfig) -> PackState:
    return PackState()


def used(row: Row) -> int:
    return sum(piece.end - piece.start for piece in row)


def step(config: PackConfig, state: PackState, doc: Doc) -> PackState:
    """The state once ``doc`` is placed (after what is left of a long document before it)."""
    state = _cut(config, state, None)
    piece = Piece(doc, 0, len(doc.tokens))
    if config.strategy == CONCAT:
        return place(config, state, piece)
    if piece.end >= config.seq_len:
        return _cut(config, replace(state, rest=piece), 0)
    return _best_fit(config, state, piece) if piece.end else state


def place(config: PackConfig, state: PackState, piece: Piece) -> PackState:
    """Concat: ``piece`` appended to the open sequence; what does not fit starts the next
    sequence, or becomes the ``rest`` when it fills one or more."""
    length = config.seq_len
    row = state.open[0] if state.open else ()
    free, at, end = length - (state.fill[0] if state.open else 0), piece.start, piece.end
    if at == end:
        return state
    if end - at < free:  # the usual case: it fits
        return PackState((row + (piece,),), state.ready, (length - free + end - at,))
    ready = state.ready + (row + (Piece(piece.doc, at, at + free),),)
    at += free
    if end - at >= length:
        return PackState((), ready, (), Piece(piece.doc, at, end))
    return PackState(((Piece(piece.doc, at, end),),), ready, (end - at,)) if at < end else PackState((), ready)


def _cut(config: PackConfig, state: PackState, rows: int | None) -> PackState:
    """``rows`` more whole sequences cut from the ``rest`` (None: all of it); once less than
    ``seq_len`` is left, it is placed (concat: it opens the next sequence; best fit)."""
    rest, length = state.rest, config.seq_len
    if rest is None:
        return state
    whole = (rest.end - rest.start) // length if rows is None else min(rows, (rest.end - rest.start) // length)
    at = rest.start + whole * length
    ready = state.ready + tuple((Piece(rest.doc, a, a + length),) for a in range(rest.start, at, length))
    if rest.end - at >= length:
        return replace(state, ready=ready, rest=Piece(rest.doc, at, rest.end))
    state = replace(state, ready=ready, rest=None)
    if at == rest.end:
        return state
    left = Piece(rest.doc, at, rest.end)
    return place(config, state, left) if config.strategy == CONCAT else _best_fit(config, state, left)


def available(config: PackConfig, state: PackState) -> int:
    """Finished sequences that :func:`take` can give without another document."""
    rest = state.rest
    return len(state.ready) + (0 if rest is None else (rest.end - rest.start) // config.seq_len)


def free(config: PackConfig, state: PackState) -> int:
    """Concat: tokens the open sequence still takes."""
    return config.seq_len - (state.fill[0] if state.open else 0)


def age_limit(config: PackConfig) -> int:
    """Best fit closes an open sequence whose first document is this many documents old."""
    return 16 * config.pool


def _best_fit(config: PackConfig, state: PackState, piece: Piece) -> PackState:
    """Best fit of a piece shorter than ``seq_len`` into the open sequences; a sequence that
    stayed open for :func:`age_limit` documents is closed (it bounds what a checkpoint holds)."""
    rows, fill = list(state.open), list(state.fill)
    size = piece.end - piece.start
    fits = [k for k, f in enumerate(fill) if config.seq_len - f >= size]
    ready = state.ready
    if fits:
        k = max(fits, key=lambda k: (fill[k], -k))
        rows[k], fill[k] = rows[k] + (piece,), fill[k] + size
    else:
        if len(rows) == config.pool:
            k = max(range(len(rows)), key=lambda k: (fill[k], -k))
            ready += (rows.pop(k),)
            del fill[k]
        rows.append((piece,))
        fill.append(size)
    oldest = piece.doc.index - age_limit(config)
    done = [k for k in range(len(rows)) if fill[k] == config.seq_len or rows[k][0].doc.index < oldest]
    ready += tuple(rows[k] for k in done)
    keep = [k for k in range(len(rows)) if k not in done]
    return PackState(tuple(rows[k] for k in keep), ready, tuple(fill[k] for k in keep), state.rest)


def take(config: PackConfig, state: PackState, n: int) -> tuple[list[Row], PackState]:
    """Up to ``n`` finished sequences, oldest first (cutting the ``rest`` as needed)."""
    if len(state.ready) < n and state.rest is not None:
        state = _cut(config, state, n - len(state.ready))
    if not state.ready:
        return [], state
    return list(state.ready[:n]), replace(state, ready=state.ready[n:])


def finish(config: PackConfig, state: PackState) -> tuple[PackState, int]:
    """The lane ended: its open sequences are finished (``final="pad"``) or dropped; the
    state and the tokens dropped."""
    state = _cut(config, state, None)
    if config.final == PAD:
        return PackState((), state.ready + state.open), 0
    return PackState((), state.ready), sum(state.fill)


def oldest(state: PackState) -> int | None:
    """The lane index of the oldest document the state holds (None: none)."""
    held = [piece.doc.index for row in state.open + state.ready for piece in row]
    return min(held + ([] if state.rest is None else [state.rest.doc.index]), default=None)


def arrays(config: PackConfig, rows: Sequence[Row]) -> dict[str, np.ndarray]:
    """``rows`` as ``(n, seq_len)`` int64 ``input_ids`` (padded with ``pad_id``), ``segment_ids``
    (1, 2, … per piece, 0 on padding) and ``position_ids`` (from 0 in each piece)."""
    n, length = len(rows), config.seq_len
    ids = np.full((n, length), config.pad_id if config.pad_id is not None else 0, dtype=np.int64)
    segments = np.zeros((n, length), dtype=np.int64)
    positions = np.zeros((n, length), dtype=np.int64)
    for r, row in enumerate(rows):
        at = 0
        for s, piece in enumerate(row, 1):
            k = piece.end - piece.start
            ids[r, at:at + k] = piece.doc.tokens[piece.start:piece.end]
            segments[r, at:at + k] = s
            positions[r, at:at + k] = np.arange(k)
            at += k
    return {"input_ids": ids, "segment_ids": segments, "position_ids": positions}


def token_counts(rows: Sequence[Row], kinds: int) -> np.ndarray:
    """The real tokens of each row per component id, ``(n, kinds)`` int64."""
    tokens = np.zeros((len(rows), kinds), dtype=np.int64)
    for r, row in enumerate(rows):
        for piece in row:
            tokens[r, piece.doc.component] += piece.end - piece.start
    return tokens


def pieces(rows: Sequence[Row]) -> list[list[tuple[int, int, int, int, int, int]]]:
    """Per row, each piece as ``(dataset, shard, offset, component id, start, end)``."""
    return [[(*piece.doc.pointer, piece.doc.component, piece.start, piece.end) for piece in row] for row in rows]


def _row_json(row: Row, base: int) -> list[list[int]]:
    return [[piece.doc.index - base, piece.start, piece.end] for piece in row]


def state_to_json(state: PackState, base: int) -> dict[str, Any]:
    """The state as JSON, documents counted from lane index ``base`` (at most :func:`oldest`)."""
    rest = state.rest
    return {"open": [_row_json(row, base) for row in state.open],
            "ready": [_row_json(row, base) for row in state.ready],
            "rest": None if rest is None else [rest.doc.index - base, rest.start, rest.end]}


def _spans(data: Any) -> list[list[int]]:
    """Every ``[document, start, end]`` a JSON state names (checks their form)."""
    if not (isinstance(data, dict) and sorted(data) == ["open", "ready", "rest"]
            and all(isinstance(data[k], list) and all(isinstance(row, list) for row in data[k])
                    for k in ("open", "ready")) and (data["rest"] is None or isinstance(data["rest"], list))):
        raise ValueError(f"pack state must be {{'open': [rows], 'ready': [rows], 'rest': piece or null}}, got "
                         f"{show(data)}")
    rest = [] if data["rest"] is None else [data["rest"]]
    spans = [p for k in ("open", "ready") for row in data[k] for p in row] + rest
    if not all(isinstance(p, list) and len(p) == 3 and all(type(v) is int and v >= 0 for v in p) and p[1] < p[2]
               for p in spans):
        raise ValueError(f"pack state: every piece must be [document, start, end] of ints, 0 <= start < end, got "
                         f"{show(spans)}")
    ordered = sorted(spans)
    for a, b in zip(ordered, ordered[1:]):
        if a[0] == b[0] and b[1] < a[2]:
            raise ValueError(f"pack state: pieces {a} and {b} overlap (a token would be read twice)")
    return spans


def _checked(config: PackConfig, data: Any) -> list[list[int]]:
    """The pieces of a JSON state, refused unless this packer could have made it (all that can
    be told without its documents)."""
    spans, length = _spans(data), config.seq_len
    for key, limit in (("open", length - 1), ("ready", length)):
        for row in data[key]:
            tokens = sum(end - start for _, start, end in row)
            if not 0 < tokens <= limit:
                raise ValueError(f"pack state: an {key} sequence of {tokens} tokens, outside 1 .. {limit}")
    rest = data["rest"]
    if rest is not None and (rest[2] - rest[1] < length or data["open"] and config.strategy == CONCAT):
        raise ValueError(f"pack state: a rest of {rest[2] - rest[1]} tokens (at least seq_len={length}, and "
                         "concat holds it only with no open sequence)")
    if len(data["open"]) > (1 if config.strategy == CONCAT else config.pool):
        raise ValueError(f"pack state: {len(data['open'])} open sequences, more than {config.strategy} keeps")
    return spans


def documents_held(config: PackConfig, data: Any) -> tuple[int, int] | None:
    """The first and one past the last document (from the base) a JSON state holds, None when
    it holds none; refuses a state this packer could not have made."""
    held = [p[0] for p in _checked(config, data)]
    return (min(held), max(held) + 1) if held else None


def held(data: Any) -> tuple[int, ...]:
    """The documents (from the base) a JSON state holds, ascending; refuses one not of its form."""
    return tuple(sorted({p[0] for p in _spans(data)}))


def state_from_json(config: PackConfig, data: Any, docs: Sequence[Doc | None]) -> PackState:
    """The state of :func:`state_to_json`, with ``docs[i]`` the document ``i`` it names
    (None: a sample a filter dropped). Refuses what this packer could not have made."""
    _checked(config, data)

    def piece(i: int, start: int, end: int) -> Piece:
        doc = docs[i] if i < len(docs) else None
        if doc is None or not end <= len(doc.tokens):
            raise ValueError(f"pack state: piece [{i}, {start}, {end}] does not fit its document "
                             f"({'none' if doc is None else f'{len(doc.tokens)} tokens'}): the data or the "
                             "tokenizer changed since the checkpoint")
        return Piece(doc, start, end)

    def row(spans: list[list[int]]) -> Row:
        return tuple(piece(*span) for span in spans)

    rows = tuple(row(r) for r in data["open"])
    rest = None if data["rest"] is None else piece(*data["rest"])
    return PackState(rows, tuple(row(r) for r in data["ready"]), tuple(used(r) for r in rows), rest)
