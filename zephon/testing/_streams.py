"""Streams as the kit sees them: a source's chunks, where two streams part, and their digest.

Every assertion takes whatever the user has: a template source (its single-lane stream,
lane 0 of 1, is the global chunk order), a lane-bound source (its own lane, from where it
stands, without moving it) or a :class:`~zephon.Pipeline` (its source).
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import struct
from typing import Any, Sequence

import numpy as np

from zephon.work import StaticMixtureWorkSource, WorkChunk, WorkSource

DIGEST_TAG = b"zephon.stream_digest/1\0"


def as_source(thing: Any) -> WorkSource:
    """The work source of a source or a pipeline (anything with a ``source`` that is one)."""
    if isinstance(thing, WorkSource):
        return thing
    inner = getattr(thing, "source", None)
    if isinstance(inner, WorkSource):
        return inner
    raise TypeError(f"expected a WorkSource or a Pipeline, got {type(thing).__name__}; "
                    "a factory must return a fresh source or pipeline")


def single_lane(thing: Any) -> WorkSource:
    """A lane-bound source to advance: the template's lane 0 of 1, or a detached copy of a bound one."""
    source = as_source(thing)
    return source.clone_for_lane(0, 1) if source.lane_id is None else detached(source)


def detached(source: WorkSource) -> WorkSource:
    """A copy of a lane-bound source that can be advanced without moving ``source``.

    A :class:`StaticMixtureWorkSource` holds a frozen config and state, so a shallow copy is
    independent; any other source is deep-copied.
    """
    return copy.copy(source) if isinstance(source, StaticMixtureWorkSource) else copy.deepcopy(source)


def collect(source: WorkSource, max_chunks: int = 1000) -> list[WorkChunk]:
    """The source's chunks until it ends, or ``max_chunks`` of them (the source advances)."""
    chunks: list[WorkChunk] = []
    while len(chunks) < max_chunks:
        chunk = source.next_chunk()
        if chunk is None:
            break
        chunks.append(chunk)
    return chunks


def stream_of(thing: Any, max_chunks: int) -> list[WorkChunk]:
    """The chunks of ``thing``'s stream (see the module docstring), nothing advanced."""
    return collect(single_lane(thing), max_chunks)


def stream_digest(source: Any, max_chunks: int = 1000) -> str:
    """A sha256 hex digest of a stream: its data, its chunks and, for a pipeline, its items.

    It covers every dataset behind the stream (id, name, shard ids and counts, and the
    content fingerprint of path datasets), then each chunk of the window (its seed, and each
    component's name and pointers, so the chunk boundaries too), then, for a pipeline, every
    item of those chunks after the map steps. A change of the data (anywhere, also beyond
    the window), of the chunks in the window, or of the items they make changes the digest;
    a setting that changes nothing in the window does not.

    Parameters
    ----------
    source : WorkSource or Pipeline
        A template (its single-lane stream, lane 0 of 1, i.e. the global chunk order), a
        lane-bound source (its lane from where it stands; it is not advanced) or a pipeline
        (its source's stream, and its items: keep ``max_chunks`` small, items are built in
        Python).
    max_chunks : int, default 1000
        Digest at most this many chunks (the stream may be infinite).

    Returns
    -------
    str
        64 hex digits. The encoding is fixed (little-endian int64 pointers, UTF-8 names,
        length prefixes, items as sorted-key JSON), so the digest is the same on every
        platform, process, hash seed, working directory and number of threads. It is stable
        for as long as the streams are, that is within a checkpoint version
        (``zephon.core.checkpoint.VERSION``): pin it in CI, and expect to re-pin it when an
        upgrade changes the checkpoint version.
    """
    if type(max_chunks) is not int or max_chunks < 0:
        raise ValueError(f"max_chunks={max_chunks!r} must be an int >= 0; pass e.g. 200")
    digest = hashlib.sha256(DIGEST_TAG)
    for dataset_id, dataset in sorted(as_source(source).datasets_by_id.items()):
        fingerprint = getattr(dataset, "fingerprint", lambda: None)()
        digest.update(b"D" + struct.pack("<q", dataset_id) + _text(dataset.name) + _text(str(fingerprint)))
        digest.update(np.ascontiguousarray([dataset.ids(), dataset.counts()], dtype="<i8").tobytes())
    chunks = stream_of(source, max_chunks)
    for chunk in chunks:
        digest.update(b"C" + _text(str(chunk.seed)) + struct.pack("<q", len(chunk.components)))
        for name, pointers in chunk.components.items():
            digest.update(_text(name) + struct.pack("<q", len(pointers)))
            digest.update(np.ascontiguousarray(pointers, dtype="<i8").tobytes())
    digest.update(b"E" + struct.pack("<q", len(chunks)))
    if not isinstance(source, WorkSource):
        for item in itertools.islice(source, sum(len(chunk) for chunk in chunks)):
            digest.update(b"I" + _text(json.dumps(item, sort_keys=True, default=_plain)))
    return digest.hexdigest()


def _plain(value: Any) -> Any:
    """A JSON stand-in for what an item may hold besides JSON types (arrays, scalars, bytes)."""
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return repr(value)


def _text(value: str) -> bytes:
    encoded = value.encode("utf-8")
    return struct.pack("<q", len(encoded)) + encoded


def read_order(chunk: WorkChunk) -> tuple[list[tuple[int, int, int]], list[str]]:
    """A chunk's pointers in default read order, with their component names."""
    pointers, local = chunk.read_order()
    names = chunk.component_names
    return list(map(tuple, pointers.tolist())), [names[i] for i in local.tolist()]


def chunk_divergence(expected: Sequence[WorkChunk], got: Sequence[WorkChunk], *, where: str,
                     first_chunk: int = 0) -> str | None:
    """Where two chunk streams part (chunk, position, both pointers and components), or None.

    ``where`` names the stream (e.g. ``"lane 2 of 4"``); chunk numbers start at ``first_chunk``.
    """
    for k, (a, b) in enumerate(zip(expected, got)):
        if a == b:
            continue
        (pa, ca), (pb, cb) = read_order(a), read_order(b)
        at = next((i for i, pair in enumerate(zip(zip(pa, ca), zip(pb, cb))) if pair[0] != pair[1]),
                  min(len(pa), len(pb)))
        if at < min(len(pa), len(pb)):
            return (f"{where}: the streams part at chunk {first_chunk + k}, position {at}: expected {pa[at]} "
                    f"of {ca[at]!r}, got {pb[at]} of {cb[at]!r}")
        if len(pa) != len(pb):
            return (f"{where}: chunk {first_chunk + k} holds {len(pb)} pointers where {len(pa)} are expected "
                    f"(the first {at} agree)")
        return (f"{where}: chunk {first_chunk + k} has the same pointers but differs in seed, target mixture or "
                f"exhausted names: expected {a!r}, got {b!r}")
    if len(expected) != len(got):
        return (f"{where}: {len(got)} chunks where {len(expected)} are expected (the first "
                f"{min(len(expected), len(got))} agree)")
    return None
