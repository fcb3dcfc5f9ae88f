"""Flat token files: a raw array of one integer dtype per shard, documents cut by EOS or by given lengths.

Nothing in such a file says where documents end, so the dataset is told: ``eos_id`` (a
document ends after each EOS token; tokens after the last one are a last document) or
``doc_lengths`` (tokens per document, in file order). The document ends are found once, when
the dataset is built (with ``eos_id`` that reads every token, a block at a time), and held in
memory as the catalog's index (8 bytes per document); nothing is cached on disk, since the
ends depend on those settings.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from zephon.io._cache import ShardCache
from zephon.io._fs import Entry, Location, entries_of
from zephon.io._shards import Shards
from zephon.io._tokens import Bytes, TokenMeta, TokenReader, columns_of, digest
from zephon.io.catalog import Catalog, fingerprint_of
from zephon.io.retry import RetryPolicy

FORMAT = "tokens"
SCAN_TOKENS = 1 << 24  # tokens compared with the EOS id at a time


def _eos_ends(tokens: Bytes, count: int, dtype: np.dtype, eos_id: int) -> np.ndarray:
    found = []
    for start in range(0, count, SCAN_TOKENS):
        block = tokens.array(start * dtype.itemsize, min(SCAN_TOKENS, count - start), dtype)
        found.append(np.flatnonzero(block == eos_id) + (start + 1))
    ends = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
    if count and (not len(ends) or ends[-1] != count):
        ends = np.append(ends, count)
    return ends.astype(np.int64)


def _length_ends(where: str, lengths: Any, count: int) -> np.ndarray:
    array = np.asarray(lengths)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(f"{where}: doc_lengths must be a 1-D sequence of ints per file, got {array.dtype} of shape "
                        f"{array.shape}")
    array = array.astype(np.int64)
    if array.size and array.min() < 0:
        raise ValueError(f"{where}: doc_lengths has a negative length ({int(array.min())})")
    if int(array.sum()) != count:
        raise ValueError(f"{where}: doc_lengths add up to {int(array.sum()):,} tokens but the file holds {count:,}; "
                         "pass the lengths of every document of this file, in order")
    return np.cumsum(array)


def _per_file(lengths: Any, files: list[str], where: str) -> list[Any]:
    """``doc_lengths`` as one sequence per file: a flat sequence is the one file's."""
    if len(files) == 1 and not (len(lengths) and np.ndim(lengths[0])):
        return [lengths]
    if len(lengths) != len(files):
        raise ValueError(f"{where}: doc_lengths holds {len(lengths)} entries for {len(files)} files; pass one sequence "
                         "of lengths per file, in sorted file-name order")
    return list(lengths)


def _ends_of(location: Location, entry: Entry, dtype: np.dtype, eos_id: int | None, lengths: Any,
             name: str) -> np.ndarray:
    where = f"Dataset {name!r}: {location.uri_of(entry.name)}"
    if entry.size % dtype.itemsize:
        raise ValueError(f"{where}: {entry.size:,} bytes is not a whole number of {dtype.name} tokens; check dtype=")
    count = entry.size // dtype.itemsize
    if eos_id is None:
        return _length_ends(where, lengths, count)
    tokens = Bytes(location, location.info(entry.name))
    return _eos_ends(tokens, count, dtype, eos_id)


def build(name: str, location: Location, files: list[str], dtype: np.dtype, eos_id: int | None,
          doc_lengths: Sequence[Any] | None) -> Catalog:
    """The in-memory catalog of flat token ``files`` in ``location`` (see the module docstring)."""
    entries = entries_of(location, files, name)
    where = f"Dataset {name!r}: {location.uri}"
    lengths = [None] * len(files) if doc_lengths is None else _per_file(doc_lengths, files, where)
    ends = [_ends_of(location, e, dtype, eos_id, n, name) for e, n in zip(entries, lengths)]
    sizes = np.array([e.size for e in entries], dtype=np.int64)
    rows = np.array([len(e) for e in ends], dtype=np.int64)
    digests = tuple(digest(e.tobytes(), dtype.str.encode()) for e in ends)
    schemas = (columns_of(dtype),)
    schema_of = np.zeros(len(files), dtype=np.int64)
    return Catalog(location.uri, FORMAT, tuple(files), sizes, np.array([e.mtime_ns for e in entries], dtype=np.int64),
                   rows, digests, schema_of, schemas, np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64),
                   rows.copy(), fingerprint_of(FORMAT, files, sizes, rows, digests, schema_of, schemas), time.time_ns(),
                   source=location)


class FlatReader(TokenReader):
    """Documents of flat token files, cut where the catalog's index says."""

    def __init__(self, shards: Shards, cache: ShardCache, dtype: np.dtype):
        self._dtype = dtype
        super().__init__(shards, cache)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "dtype": self._dtype.str}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._dtype = np.dtype(state["dtype"])
        super().__setstate__(state)

    def dtype(self, k: int) -> np.dtype:
        return self._dtype

    def _bounds(self, k: int, meta: TokenMeta, first: int, last: int) -> np.ndarray:
        ends = self.shards.index_of(k)
        start = np.int64(ends[first - 1]) if first else np.int64(0)
        return np.append(start, ends[first:last])


def reader(catalog: Catalog, name: str, policy: RetryPolicy, cache: ShardCache, dtype: np.dtype) -> FlatReader:
    """The reader of a catalog :func:`build` made."""
    return FlatReader(catalog.shards(name, policy), cache, dtype)

