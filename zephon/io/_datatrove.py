"""datatrove token files: a ``.ds`` of tokens and its ``.ds.index``, one pair per shard.

The ``.ds.index`` holds one little-endian uint64 per document: where it ends, in tokens from
the file's start. The token size is not written anywhere; it is the ``.ds`` size over the last
end (2 bytes for vocabularies under 65,536, else 4), and a file whose sizes give neither is
refused. The catalog scan reads the index's size and last entry (O(1) per file) and keeps the
token size as the file's index; each piece's ends are checked to ascend as they are read.
"""
from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs

from zephon.io._cache import ShardCache
from zephon.io._fs import Entry, Location
from zephon.io._shards import Format, Scan, Shards, register
from zephon.io._tokens import Bytes, TokenMeta, TokenReader, columns_of, digest, little

DS, INDEX = ".ds", ".index"
SIZES = {2: "uint16", 4: "uint32"}
EMPTY_SIZE = 2  # the token size of a file with no tokens (nothing tells it)


def _index(location: Location, name: str) -> tuple[Bytes, int]:
    info = location.info(name + INDEX)
    if info.type != pafs.FileType.File:
        raise ValueError(f"its index {location.uri_of(name + INDEX)} is missing; a datatrove file is a .ds and a "
                         ".ds.index beside it")
    if info.size % 8:
        raise ValueError(f"{location.uri_of(name + INDEX)} holds {info.size:,} bytes, not whole uint64 document ends; "
                         "it is truncated")
    return Bytes(location, info), int(info.size) // 8


def token_size(documents: int, total: int, size: int) -> int:
    """Bytes per token of a ``.ds`` of ``size`` bytes whose ``documents`` end at token ``total`` (``ValueError`` if none fits)."""
    if not documents or not total:
        if size:
            raise ValueError(f"the .ds holds {size:,} bytes but its index ends at token 0; the files do not belong "
                             "together")
        return EMPTY_SIZE
    fits = [s for s in SIZES if total * s == size]
    if not fits:
        raise ValueError(f"the index ends at token {total:,} but the .ds holds {size:,} bytes, which is not {total:,} "
                         "tokens of 2 or 4 bytes; the files do not belong together (or one is truncated)")
    return fits[0]


def scan(location: Location, entry: Entry) -> Scan:
    """One ``.ds``'s documents, token size and digest from its index (size and last entry only)."""
    index, documents = _index(location, entry.name)
    last = bytes(index.read(8 * (documents - 1), 8)) if documents else b""
    total = int(np.frombuffer(last, dtype="<u8")[0]) if last else 0
    size = token_size(documents, total, entry.size)
    dtype = np.dtype(SIZES[size])
    columns = columns_of(dtype) if total else None  # no tokens: nothing tells their size
    return Scan(documents, digest(last, np.array([documents, entry.size], dtype=np.int64).tobytes()), columns,
                np.array([size], dtype=np.int64))


class DatatroveReader(TokenReader):
    """Documents of datatrove ``.ds`` / ``.ds.index`` pairs."""

    def dtype(self, k: int) -> np.dtype:
        return little(SIZES[int(self.shards.index_of(k)[0])])

    def _open_index(self, k: int) -> Bytes:
        index, documents = _index(self.shards.location, self.shards.files[k])
        if documents != int(self.shards.rows[k]):
            raise ValueError(f"{self.uri(k)}{INDEX} changed since its catalog was built ({int(self.shards.rows[k]):,} -> "
                             f"{documents:,} documents); build the Dataset again")
        return index

    def _bounds(self, k: int, meta: TokenMeta, first: int, last: int) -> np.ndarray:
        before = 1 if first else 0
        ends = meta.index.array(8 * (first - before), last - first + before, "<u8")
        if len(ends) and int(ends.max()) >= 2**63:
            raise ValueError(f"document ends {first:,}..{last - 1:,} are past 2**63 tokens; the index is corrupted")
        ends = ends.astype(np.int64)
        return ends if before else np.append(np.int64(0), ends)


class DatatroveFormat(Format):
    name, suffixes, label = "datatrove", (DS,), "*.ds + *.ds.index"
    detect = False

    def scan(self, location: Location, entry: Entry) -> Scan:
        return scan(location, entry)

    def reader(self, shards: Shards, cache: ShardCache) -> DatatroveReader:
        return DatatroveReader(shards, cache)


DATATROVE = register(DatatroveFormat())
