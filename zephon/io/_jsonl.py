"""JSONL shards: the line index and record reads through it.

A file is UTF-8 JSON, one object per line (``*.jsonl``; ``*.jsonl.gz`` and ``*.jsonl.zst`` are
decompressed with pyarrow's codecs). **Blank lines** (empty or only spaces, tabs, ``\\r``) are
not records, wherever they are: a trailing newline, an extra empty last line or ``\\r\\n`` line
ends all give the same rows. Every other line is one record, so a file's row count is its
number of non-blank lines.

The **line index** of a file is an int64 array of ``rows + 1`` byte offsets into the
(decompressed) content: where each record starts, then the content's length. Record ``r`` is
``content[index[r]:index[r + 1]]`` (trailing blank lines included; JSON ignores them). It is
built with numpy over blocks of :data:`BLOCK` bytes, never line by line in Python.

**Pieces.** A local uncompressed file is memory-mapped and read in place (one piece). It is
looked at before each read of its lines (:meth:`JsonlReader._take`): a file cut short since
its catalog raises ``ShardChangedError`` there, where reading the mapping would end the
process (SIGBUS). Elsewhere
a piece is a span of whole lines of about :data:`PIECE_BYTES` bytes, read with one ranged
request; a compressed file is one piece, decompressed whole.
"""
from __future__ import annotations

import hashlib
import json
import mmap
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from zephon.io._fs import Entry, Location
from zephon.io._cache import PieceKey, ShardCache
from zephon.io._shards import Format, Handles, Scan, ShardReader, Shards, register

SUFFIXES = {".jsonl": None, ".jsonl.gz": "gzip", ".jsonl.zst": "zstd"}  # suffix -> pyarrow codec
BLOCK = 16 << 20  # bytes scanned per numpy pass
PIECE_BYTES = 4 << 20  # bytes per ranged read of an uncompressed file that is not local
_NOT_BLANK = np.ones(256, dtype=bool)
_NOT_BLANK[[9, 10, 13, 32]] = False  # JSON whitespace
Content = Union[bytes, mmap.mmap]  # (decompressed) bytes of a file or of a span of its lines
Span = tuple[Content, int, int]  # a piece: (content, byte offset of content[0], its first record)


def codec_of(name: str) -> str | None:
    for suffix, codec in SUFFIXES.items():
        if name.endswith(suffix):
            return codec
    raise ValueError(f"{name!r} is not a JSONL file name (expected one of {', '.join(SUFFIXES)})")


def _open(location: Location, name: str, codec: str | None) -> pa.NativeFile:
    stream = location.fs.open_input_stream(location.path(name), compression=None)
    return stream if codec is None else pa.CompressedInputStream(stream, codec)


def line_number(content: Content, start: int) -> int:
    """The 1-based physical line at byte ``start`` of ``content``."""
    return bytes(content[:start]).count(b"\n") + 1


def _starts(region: np.ndarray, final: bool) -> np.ndarray:
    """Offsets of the non-blank lines of ``region`` (whole lines; the last may lack ``\\n`` if final)."""
    newlines = np.flatnonzero(region == 10)
    if final:
        starts = np.concatenate(([0], newlines + 1))
        starts = starts[starts < len(region)]
    else:
        starts = np.concatenate(([0], newlines[:-1] + 1))
    if not len(starts):
        return starts.astype(np.int64)
    keep = np.logical_or.reduceat(_NOT_BLANK[region], starts)
    return starts[keep].astype(np.int64)


def scan(location: Location, entry: Entry) -> Scan:
    """Index the records of one JSONL file and read its first record's keys (errors name the file).

    The scan's ``index`` is the line index (``rows + 1`` offsets)."""
    codec = codec_of(entry.name)
    uri = location.uri_of(entry.name)
    hasher = hashlib.blake2b(digest_size=8)
    parts: list[np.ndarray] = []
    first: tuple[bytes, int] | None = None  # (line bytes, line number)
    base, carry, newlines_before = 0, b"", 0
    try:
        with _open(location, entry.name, codec) as stream:
            while True:
                data = bytes(stream.read(BLOCK))
                hasher.update(data)
                final = not data
                buffer = carry + data
                cut = len(buffer) if final else buffer.rfind(b"\n") + 1
                if cut:
                    region = np.frombuffer(buffer, dtype=np.uint8, count=cut)
                    starts = _starts(region, final)
                    if first is None and len(starts):
                        s = int(starts[0])
                        end = buffer.find(b"\n", s)
                        first = (buffer[s:end if end >= 0 else cut], newlines_before + buffer.count(b"\n", 0, s) + 1)
                    if first is None:
                        newlines_before += buffer.count(b"\n", 0, cut)
                    parts.append(starts + base)
                base += cut
                carry = buffer[cut:]
                if final:
                    break
    except pa.ArrowInvalid as error:
        raise ValueError(f"{uri}: cannot read this JSONL file ({error}); check that it is not corrupted") from error
    index = np.concatenate(parts + [np.array([base], dtype=np.int64)]) if parts else np.array([base], dtype=np.int64)
    columns = None
    if first is not None:
        columns = tuple((c, "json") for c in _decode(first[0], uri, first[1]))
    return Scan(len(index) - 1, hasher.hexdigest(), columns, index)


def _decode(line: bytes, path: str, number: int | str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}, line {number}: invalid JSON ({error}); fix or remove this line") from error
    if not isinstance(record, dict):
        raise ValueError(f"{path}, line {number}: expected a JSON object per line, got {type(record).__name__}")
    return record


def _mapped(info: pafs.FileInfo) -> Content:
    """A local file's content, memory-mapped (the file itself is closed at once)."""
    if not info.size:
        return b""
    with open(info.path, "rb") as file:
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


@dataclass(frozen=True, slots=True)
class _Meta:
    info: pafs.FileInfo
    files: Handles  # an uncompressed file that is not local: handles for ranged reads
    index: np.ndarray  # the line index
    ends: np.ndarray  # records before the end of each piece
    mapped: Content | None  # the content of a local uncompressed file, else None


class JsonlReader(ShardReader[_Meta]):
    """Reads records of a JSONL dataset through its line index and the fetch cache.

    A piece's value is ``(content, byte offset of content[0], first record)``."""

    columnar = False
    piece_name = "span of lines"

    def _open(self, k: int, info: pafs.FileInfo) -> _Meta:
        index = self.shards.index_of(k)
        rows = len(index) - 1
        codec = codec_of(self.shards.files[k])
        local = self.shards.location.is_local and codec is None
        if local or codec is not None or not rows:
            ends = np.array([rows], dtype=np.int64)
        else:
            bucket = index[:-1] // PIECE_BYTES
            ends = np.append(np.flatnonzero(np.diff(bucket)) + 1, rows).astype(np.int64)
        return _Meta(info, Handles(self.shards.location, info), index, ends, _mapped(info) if local else None)

    def _ends(self, k: int, meta: _Meta) -> np.ndarray:
        return meta.ends

    def _span(self, meta: _Meta, piece: int) -> tuple[int, int, int]:
        """``(first record, first byte, end byte)`` of a piece."""
        first = int(meta.ends[piece - 1]) if piece else 0
        return first, int(meta.index[first]), int(meta.index[int(meta.ends[piece])])

    def _estimate(self, k: int, meta: _Meta, piece: int, columns: tuple[str, ...] | None) -> int:
        if meta.mapped is not None:
            return 0
        if codec_of(self.shards.files[k]) is not None:
            return int(meta.index[-1])
        _, start, end = self._span(meta, piece)
        return end - start

    def key(self, piece: int, columns: tuple[str, ...] | None) -> PieceKey:
        return piece, None  # a span of lines serves every projection

    def _load(self, k: int, meta: _Meta, piece: int, columns: tuple[str, ...] | None) -> tuple[Span, int]:
        if meta.mapped is not None:
            return (meta.mapped, 0, 0), 0  # mapped pages are the kernel's to keep or drop
        name = self.shards.files[k]
        codec = codec_of(name)
        if codec is not None:
            try:
                with _open(self.shards.location, name, codec) as stream:
                    data = stream.read()
            except pa.ArrowInvalid as error:
                raise ValueError(f"{self.uri(k)}: cannot decompress this JSONL file ({error})") from error
            if len(data) != int(meta.index[-1]):
                raise ValueError(f"{self.uri(k)}: the file changed since its catalog was built "
                                 f"({int(meta.index[-1]):,} -> {len(data):,} decompressed bytes)")
            return (data, 0, 0), len(data)
        first, start, end = self._span(meta, piece)
        with meta.files.use() as file:
            data = file.read_at(end - start, start)
        return (data, start, first), len(data)

    def _take(self, k: int, value: Span, local: np.ndarray, columns: tuple[str, ...] | None) -> list[Any]:
        content, base, first = value
        index = self.meta(k).index
        at = local + first
        starts, ends = (index[at] - base).tolist(), (index[at + 1] - base).tolist()
        if type(content) is mmap.mmap:  # reading a mapped file cut short would end the process (SIGBUS)
            self.unchanged(k, retried=False)  # so it is looked at first, and its lines copied out at once
        lines = [content[s:e] for s, e in zip(starts, ends)]
        out = []
        for s, line in zip(starts, lines):
            try:
                record = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                record = self._bad(k, line, content, base, s)
            if type(record) is not dict:
                self._bad(k, line, content, base, s)
            if columns is not None:
                try:
                    record = {c: record[c] for c in columns}
                except KeyError as missing:
                    raise ValueError(f"{self.uri(k)}, line {self._line(k, content, base, s)}: no column "
                                     f"{missing.args[0]!r} (the record has {sorted(record)})") from None
            out.append(record)
        return out

    def _bad(self, k: int, line: bytes, content: Content, base: int, start: int) -> Any:
        """Raise what is wrong with ``line``: :class:`ShardChangedError` when the file changed since
        its catalog was built (its lines then lie elsewhere), else ``ValueError`` naming the line."""
        self.unchanged(k)
        return _decode(line, self.uri(k), self._line(k, content, base, start))

    def _line(self, k: int, content: Content, base: int, start: int) -> int | str:
        """The physical line at ``start`` (known exactly when the content starts at the file's start)."""
        if base == 0:
            return line_number(content, start)
        return f"at byte {base + start}"


class JsonlFormat(Format):
    name, suffixes, label = "jsonl", tuple(SUFFIXES), "*.jsonl"

    def scan(self, location: Location, entry: Entry) -> Scan:
        return scan(location, entry)

    def reader(self, shards: Shards, cache: ShardCache) -> JsonlReader:
        return JsonlReader(shards, cache)


JSONL = register(JsonlFormat())
