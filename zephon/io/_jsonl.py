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
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from zephon.io._cache import ShardCache

SUFFIXES = {".jsonl": None, ".jsonl.gz": "gzip", ".jsonl.zst": "zstd"}  # suffix -> pyarrow codec
BLOCK = 16 << 20  # bytes scanned per numpy pass
_NOT_BLANK = np.ones(256, dtype=bool)
_NOT_BLANK[[9, 10, 13, 32]] = False  # JSON whitespace


def codec_of(name: str) -> str | None:
    for suffix, codec in SUFFIXES.items():
        if name.endswith(suffix):
            return codec
    raise ValueError(f"{name!r} is not a JSONL file name (expected one of {', '.join(SUFFIXES)})")


@dataclass(frozen=True, slots=True)
class JsonlScan:
    """What the catalog keeps of one JSONL file."""

    index: np.ndarray  # int64, rows + 1 byte offsets (record starts, then the content length)
    digest: str  # blake2b-64 of the decompressed content, hex
    columns: tuple[str, ...] | None  # keys of the first record; None for a file without records


def _open(path: str, codec: str | None) -> Any:
    if codec is None:
        return open(path, "rb")
    return pa.CompressedInputStream(pa.OSFile(path), codec)


def line_number(content: Any, start: int) -> int:
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


def scan(path: str) -> JsonlScan:
    """Index the records of one JSONL file and read its first record's keys (errors name the file)."""
    codec = codec_of(path)
    hasher = hashlib.blake2b(digest_size=8)
    parts: list[np.ndarray] = []
    first: tuple[bytes, int] | None = None  # (line bytes, line number)
    base, carry, newlines_before = 0, b"", 0
    try:
        with _open(path, codec) as stream:
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
    except (OSError, pa.ArrowException) as error:
        raise ValueError(f"{path}: cannot read this JSONL file ({error}); check that it is readable and not corrupted") from error
    index = np.concatenate(parts + [np.array([base], dtype=np.int64)]) if parts else np.array([base], dtype=np.int64)
    columns = None
    if first is not None:
        columns = tuple(_decode(first[0], path, first[1]))
    return JsonlScan(index, hasher.hexdigest(), columns)


def _decode(line: bytes, path: str, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}, line {number}: invalid JSON ({error}); fix or remove this line") from error
    if not isinstance(record, dict):
        raise ValueError(f"{path}, line {number}: expected a JSON object per line, got {type(record).__name__}")
    return record


class _Content:
    """A file's content as a sliceable buffer: a read-only mmap, or the decompressed bytes."""

    __slots__ = ("data", "file")

    def __init__(self, path: str, codec: str | None, size: int):
        self.file = None
        try:
            if codec is None:
                self.file = open(path, "rb")
                actual = os.fstat(self.file.fileno()).st_size
                _check_size(path, actual, size)
                self.data = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            else:
                _check_size(path, os.stat(path).st_size, size)
                with _open(path, codec) as stream:
                    self.data = bytes(stream.read())
        except (OSError, pa.ArrowException) as error:
            raise ValueError(f"{path}: cannot read this JSONL file ({error})") from error


def _check_size(path: str, actual: int, expected: int) -> None:
    if actual != expected:
        raise ValueError(f"{path}: the file changed since its catalog was built ({expected:,} -> {actual:,} bytes); "
                         "build the Dataset again")


class JsonlReader:
    """Reads records of a JSONL dataset through its line index and the fetch cache."""

    def __init__(self, directory: str, files: Sequence[str], sizes: np.ndarray, rows: np.ndarray,
                 index: np.ndarray, cache: ShardCache):
        self._directory, self._files, self._sizes = directory, list(files), sizes
        self._index = index  # all files' indexes, concatenated
        self._bases = np.concatenate(([0], np.cumsum(rows + 1)[:-1])).astype(np.int64)
        self.cache = cache

    def path(self, k: int) -> str:
        return os.path.join(self._directory, self._files[k])

    def _content(self, k: int) -> Any:
        path, codec = self.path(k), codec_of(self._files[k])
        if codec is None:
            return self.cache.handle(k, lambda: _Content(path, None, int(self._sizes[k]))).data
        self.cache.handle(k, lambda: True)
        content = self.cache.get(k, "content")
        if content is None:
            content = _Content(path, codec, int(self._sizes[k])).data
            self.cache.put(k, "content", content, len(content))
        return content

    def read(self, k: int, offsets: np.ndarray, columns: Sequence[str] | None) -> list[dict[str, Any]]:
        content = self._content(k)
        at = self._bases[k] + offsets
        starts, ends = self._index[at].tolist(), self._index[at + 1].tolist()
        out = []
        for s, e in zip(starts, ends):
            try:
                record = json.loads(content[s:e])
            except (ValueError, UnicodeDecodeError):
                record = _decode(content[s:e], self.path(k), line_number(content, s))  # raises with the line
            if type(record) is not dict:
                _decode(content[s:e], self.path(k), line_number(content, s))
            if columns is not None:
                try:
                    record = {c: record[c] for c in columns}
                except KeyError as missing:
                    raise ValueError(f"{self.path(k)}, line {line_number(content, s)}: no column {missing.args[0]!r} "
                                     f"(the record has {sorted(record)})") from None
            out.append(record)
        return out

    def read_table(self, k: int, offsets: np.ndarray, columns: Sequence[str] | None) -> pa.Table:
        records = self.read(k, offsets, columns)
        try:
            return pa.Table.from_pylist(records)
        except (pa.ArrowException, TypeError) as error:
            raise ValueError(f"{self.path(k)}: these records do not form one Arrow table ({error})") from error
