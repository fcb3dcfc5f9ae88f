"""Token files: shards of pre-tokenized documents, read as zero-copy views of their tokens.

A shard is one file of tokens (a flat little-endian array of one integer dtype) and a row is
one document: a span of those tokens. Formats differ only in where the spans come from (a
Megatron ``.idx``, a datatrove ``.ds.index``, EOS positions or given lengths), which a
:class:`TokenReader` subclass says in :meth:`TokenReader._bounds`. A piece is
:data:`PIECE_DOCUMENTS` consecutive documents, read with one ranged request (a memory map
locally) and kept in the fetch cache; a record is ``{"input_ids": tokens, "num_tokens": n}``,
``tokens`` a read-only view of the piece's buffer in the file's dtype.

Each piece's bounds are checked as it is read (ascending, inside the file), so a damaged index
raises naming the file instead of returning wrong tokens.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from zephon.io._fs import Location, listing, locate
from zephon.io._shards import Handles, ShardReader, UnevenRecordsError

KEY_IDS, KEY_COUNT = "input_ids", "num_tokens"  # the names zephon.ops.tokenize gives its items
PIECE_DOCUMENTS = 1024  # documents per piece
GLOB = re.compile(r"[*?\[]")
TOKEN_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "int64")


def token_dtype(value: Any, where: str) -> np.dtype:
    """``value`` as a little-endian integer token dtype, or a ``ValueError`` saying which are known."""
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in TOKEN_DTYPES:
        raise ValueError(f"{where}: dtype={value!r} is not a token dtype; pass one of {', '.join(TOKEN_DTYPES)}")
    return little(dtype)


def little(dtype: Any) -> np.dtype:
    """``dtype`` in little-endian byte order (how token files store it)."""
    out: np.dtype = np.dtype(dtype).newbyteorder("<")
    return out


def columns_of(dtype: np.dtype) -> tuple[tuple[str, str], ...]:
    """The catalog's columns of a token dataset whose files hold ``dtype``."""
    return (KEY_IDS, str(pa.list_(pa.from_numpy_dtype(dtype.newbyteorder("=")))),), (KEY_COUNT, "int64")


def digest(*parts: bytes) -> str:
    """The catalog's content hash of a token file: blake2b-64 of what describes it."""
    hasher = hashlib.blake2b(digest_size=8)
    for part in parts:
        hasher.update(part)
    return hasher.hexdigest()


class Bytes:
    """Positioned reads of one file: a memory map locally (reads are zero-copy views), ranged
    reads through shared or pooled handles elsewhere."""

    def __init__(self, location: Location, info: pafs.FileInfo):
        self._map: np.ndarray | None = None
        self._handles: Handles | None = None
        if not location.is_local:
            self._handles = Handles(location, info)
        elif info.size:
            self._map = np.memmap(info.path, dtype=np.uint8, mode="r")
        else:  # nothing to map
            self._map = np.zeros(0, dtype=np.uint8)

    def read(self, offset: int, size: int) -> Any:
        """``size`` bytes from ``offset`` (fewer where the file ends), as a buffer."""
        if self._map is not None:
            return self._map[offset:offset + size]
        assert self._handles is not None
        with self._handles.use() as file:
            return file.read_at(size, offset)

    def array(self, offset: int, count: int, dtype: Any) -> np.ndarray:
        """``count`` values of ``dtype`` from byte ``offset`` (a ``ValueError`` if the file ends first)."""
        dtype = np.dtype(dtype)
        data = self.read(offset, count * dtype.itemsize)
        if len(data) != count * dtype.itemsize:
            raise ValueError(f"the file ends at byte {offset + len(data):,}, before the {count:,} values at byte "
                             f"{offset:,} it should hold")
        return np.frombuffer(data, dtype=dtype)


@dataclass(frozen=True, slots=True)
class TokenMeta:
    """An open token shard: its tokens, their dtype, where each piece ends (in documents) and
    the format's own handle on its index."""

    info: pafs.FileInfo
    tokens: Bytes
    dtype: np.dtype
    ends: np.ndarray
    index: Any


class TokenReader(ShardReader[TokenMeta]):
    """Reads documents of token files, :data:`PIECE_DOCUMENTS` at a time (see the module docstring)."""

    columnar = False
    tabular = False  # a record's tokens are a numpy array, which a batch stacks and a table would make a list
    piece_name = "span of documents"

    def _open(self, k: int, info: pafs.FileInfo) -> TokenMeta:
        rows = int(self.shards.rows[k])
        ends = np.minimum(np.arange(1, -(-rows // PIECE_DOCUMENTS) + 1, dtype=np.int64) * PIECE_DOCUMENTS, rows)
        return TokenMeta(info, Bytes(self.shards.location, info), self.dtype(k), ends, self._open_index(k))

    def dtype(self, k: int) -> np.dtype:
        """The dtype of shard ``k``'s tokens."""
        raise NotImplementedError

    def _open_index(self, k: int) -> Any:
        """What :meth:`_bounds` reads document spans from (checked against the catalog)."""
        return None

    def _bounds(self, k: int, meta: TokenMeta, first: int, last: int) -> np.ndarray:
        """Token offsets where documents ``first .. last - 1`` start, then where the last ends
        (``last - first + 1`` int64, ascending), checked; ``ValueError`` if the index is wrong."""
        raise NotImplementedError

    def tokens_per_byte(self) -> float:
        """Tokens per byte of the files (every shard that holds tokens has the same dtype: the
        catalog checks their columns)."""
        holding = np.flatnonzero(self.shards.sizes)
        return 1.0 / self.dtype(int(holding[0]) if len(holding) else 0).itemsize

    def _ends(self, k: int, meta: TokenMeta) -> np.ndarray:
        return meta.ends

    def _estimate(self, k: int, meta: TokenMeta, piece: int, columns: tuple[str, ...] | None) -> int:
        rows = int(self.shards.rows[k])
        return int(self.shards.sizes[k]) * PIECE_DOCUMENTS // max(rows, 1)

    def _load(self, k: int, meta: TokenMeta, piece: int, columns: tuple[str, ...] | None
              ) -> tuple[tuple[np.ndarray, np.ndarray], int]:
        first = piece * PIECE_DOCUMENTS
        bounds = self._bounds(k, meta, first, int(meta.ends[piece]))
        total = int(self.shards.sizes[k]) // meta.dtype.itemsize
        if len(bounds) > 1 and (bounds[0] < 0 or bounds[-1] > total or (np.diff(bounds) < 0).any()):
            raise ValueError(f"documents {first:,}..{int(meta.ends[piece]) - 1:,} have token bounds that are not "
                             f"ascending inside the file's {total:,} tokens ({_span(bounds)})")
        start = int(bounds[0])
        tokens = meta.tokens.array(start * meta.dtype.itemsize, int(bounds[-1]) - start, meta.dtype)
        return (tokens, bounds - start), tokens.nbytes

    def _take(self, k: int, value: tuple[np.ndarray, np.ndarray], local: np.ndarray,
              columns: tuple[str, ...] | None) -> list[dict[str, Any]]:
        tokens, bounds = value
        starts, ends = bounds[local].tolist(), bounds[local + 1].tolist()
        records = [{KEY_IDS: tokens[s:e], KEY_COUNT: e - s} for s, e in zip(starts, ends)]
        if columns is None:
            return records
        unknown = [c for c in columns if c not in (KEY_IDS, KEY_COUNT)]
        if unknown:
            raise ValueError(f"{self.uri(k)}: no column {unknown[0]!r} in a token file (columns: {KEY_IDS}, {KEY_COUNT})")
        return [{c: record[c] for c in columns} for record in records]

    def read_table(self, k: int, offsets: np.ndarray, columns: Sequence[str] | None, exact: bool = False
                   ) -> pa.Table:
        """The documents at ``offsets`` as ``input_ids`` (a list column of the file's dtype) and
        ``num_tokens``; ``exact``: :class:`UnevenRecordsError` (a record's tokens are a numpy
        array, which a batch stacks, where a table makes them a list)."""
        if exact:
            raise UnevenRecordsError(f"{self.uri(k)}: a token document's input_ids is a numpy array, not a list")
        records = self.read(k, offsets, columns)
        names = [KEY_IDS, KEY_COUNT] if columns is None else list(columns)
        out: dict[str, pa.Array] = {}
        if KEY_IDS in names:
            ids = [r[KEY_IDS] for r in records]
            lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
            bounds = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32 if lengths.sum() < 2**31 else np.int64)
            values = np.concatenate(ids) if ids else np.zeros(0, dtype=self.dtype(k))
            kind = pa.ListArray if bounds.dtype == np.int32 else pa.LargeListArray
            out[KEY_IDS] = kind.from_arrays(pa.array(bounds), pa.array(values.astype(values.dtype.newbyteorder("="))))
        if KEY_COUNT in names:
            out[KEY_COUNT] = pa.array([r[KEY_COUNT] for r in records], type=pa.int64())
        return pa.table({name: out[name] for name in names})


def _span(bounds: np.ndarray) -> str:
    return f"{int(bounds[0]):,} .. {int(bounds[-1]):,}" if len(bounds) else "none"



def _split(spec: str) -> tuple[str, str]:
    parent, _, base = spec.rstrip("/").rpartition("/")
    return (parent or "/") if "/" in spec else ".", base


def token_paths(name: str, spec: Any, filesystem: Any, pick: Callable[[list[str]], list[str]],
                pattern: Callable[[str], str] = lambda base: base) -> tuple[Location, list[str]]:
    """The directory and the file names ``spec`` stands for: a directory (``pick`` of its files),
    or a file name or glob in one directory (``pattern`` turns its last component into the
    pattern of the files). Errors name the dataset and ``spec``."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"Dataset {name!r}: the path must be a non-empty str or os.PathLike, got {spec!r}")
    if not GLOB.search(spec):
        location = locate(spec, filesystem, name=name)
        if location.fs.get_file_info(location.root).type == pafs.FileType.Directory:
            files = pick([e.name for e in listing(location, name)])
            if not files:
                raise ValueError(f"Dataset {name!r}: {location.uri} holds no token files")
            return location, files
    parent, base = _split(spec)
    if GLOB.search(parent):
        raise ValueError(f"Dataset {name!r}: {spec} has a wildcard before its last '/'; wildcards may only match "
                         "file names in one directory")
    location = locate(parent, filesystem, name=name)
    wanted = pattern(base)
    files = [n for n in (e.name for e in listing(location, name)) if fnmatch.fnmatchcase(n, wanted)]
    if not files:
        raise FileNotFoundError(f"Dataset {name!r}: no file matches {location.uri_of(wanted)}")
    return location, files
