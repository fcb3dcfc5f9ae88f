"""Megatron indexed datasets: a ``.bin`` of tokens and its ``.idx``, one pair per shard.

The ``.idx`` (``MMIDIDX`` version 1, little-endian) is a 34-byte header (magic, version, dtype
code, sequence count ``n``, document-index count ``d``) and three arrays: ``sequence_lengths``
(int32, tokens), ``sequence_pointers`` (int64, byte offsets into the ``.bin``) and
``document_indices`` (int64: document ``i`` is sequences ``document_indices[i] ..
document_indices[i + 1] - 1``). A row is a document, its sequences' tokens back to back.

The catalog scan reads the header and the arrays' first and last entries (O(1) per file: a
10⁹-document index opens as fast as a small one) and checks what they must say: the arrays
fill the file exactly, ``document_indices`` runs from 0 to ``n``, and the sequences start at
byte 0 and end where the ``.bin`` does. The catalog keeps ``[dtype code, n]`` as the file's
index; the listed file, whose size and mtime are the shard's identity, is the ``.bin``. Each
piece's sequences are checked to lie back to back (each starts where the one before ends) as
they are read.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs

from zephon.io._cache import ShardCache
from zephon.io._fs import Entry, Location
from zephon.io._shards import Format, Scan, Shards, register
from zephon.io._tokens import Bytes, TokenMeta, TokenReader, columns_of, digest, little

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = 34
BIN, IDX = ".bin", ".idx"
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}


@dataclass(frozen=True, slots=True)
class Header:
    """What an ``.idx`` header says: the token dtype's code, ``sequences`` and ``documents`` (documents + 1 entries)."""

    code: int
    sequences: int
    entries: int

    @property
    def dtype(self) -> np.dtype:
        return little(DTYPES[self.code])

    @property
    def lengths_at(self) -> int:
        return HEADER

    @property
    def pointers_at(self) -> int:
        return HEADER + 4 * self.sequences

    @property
    def documents_at(self) -> int:
        return HEADER + 12 * self.sequences

    @property
    def size(self) -> int:
        return HEADER + 12 * self.sequences + 8 * self.entries


def companion(name: str) -> str:
    """The ``.idx`` beside a ``.bin``."""
    return name[:-len(BIN)] + IDX


def parse(head: bytes, size: int) -> Header:
    """The header of an ``.idx`` of ``size`` bytes (``head``: its first bytes), or a ``ValueError`` saying what is wrong."""
    if len(head) < HEADER or head[:9] != MAGIC:
        raise ValueError(f"not a Megatron index (no {MAGIC!r} magic at its start)")
    version, code, sequences, entries = struct.unpack("<QBQQ", head[9:HEADER])
    if version != VERSION:
        raise ValueError(f"Megatron index version {version}; zephon reads version {VERSION}")
    if code not in DTYPES:
        raise ValueError(f"unknown dtype code {code} (known: {', '.join(f'{c} {n}' for c, n in DTYPES.items())})")
    if DTYPES[code].startswith("float"):
        raise ValueError(f"dtype code {code} ({DTYPES[code]}) holds no token ids; write the tokens as integers")
    header = Header(code, sequences, entries)
    if size == header.size + sequences and sequences:
        raise ValueError("a multimodal index (sequence modes after the document indices); zephon reads token indexes")
    if size != header.size:
        raise ValueError(f"{size:,} bytes, but its header's {sequences:,} sequences and {entries:,} document indices "
                         f"take {header.size:,}; the index is truncated or not this file's")
    if entries < 1:
        raise ValueError("no document indices (a valid index has at least the leading 0)")
    return header


def _check_ends(index: Bytes, header: Header, tokens_size: int) -> bytes:
    """Check the first and last entries of the arrays against the header and the ``.bin``; returns them."""
    first = int(index.array(header.documents_at, 1, "<i8")[0])
    last = int(index.array(header.documents_at + 8 * (header.entries - 1), 1, "<i8")[0])
    if first != 0 or last != header.sequences:
        raise ValueError(f"document indices run from {first:,} to {last:,}, not from 0 to the {header.sequences:,} "
                         "sequences; the index is corrupted")
    itemsize = header.dtype.itemsize
    if tokens_size % itemsize:
        raise ValueError(f"the .bin holds {tokens_size:,} bytes, not a whole number of {header.dtype.name} tokens")
    if not header.sequences:
        if tokens_size:
            raise ValueError(f"the index has no sequences but the .bin holds {tokens_size:,} bytes")
        return b""
    start = int(index.array(header.pointers_at, 1, "<i8")[0])
    pointer = int(index.array(header.pointers_at + 8 * (header.sequences - 1), 1, "<i8")[0])
    length = int(index.array(header.lengths_at + 4 * (header.sequences - 1), 1, "<i4")[0])
    if start != 0 or pointer + length * itemsize != tokens_size:
        raise ValueError(f"its sequences span bytes {start:,} .. {pointer + length * itemsize:,} of the .bin, which "
                         f"holds {tokens_size:,}; the .bin and .idx do not belong together (or one is truncated)")
    return struct.pack("<qqqi", first, last, pointer, length)


def _index(location: Location, name: str) -> tuple[Bytes, pafs.FileInfo]:
    info = location.info(companion(name))
    if info.type != pafs.FileType.File:
        raise ValueError(f"its index {location.uri_of(companion(name))} is missing; a Megatron dataset is a .bin and "
                         "an .idx with the same prefix")
    return Bytes(location, info), info


def scan(location: Location, entry: Entry) -> Scan:
    """One ``.bin``'s documents and digest from its ``.idx`` (header and array ends only)."""
    index, info = _index(location, entry.name)
    head = bytes(index.read(0, HEADER))
    try:
        header = parse(head, int(info.size))
        ends = _check_ends(index, header, entry.size)
    except ValueError as error:
        raise ValueError(f"{location.uri_of(companion(entry.name))}: {error}") from error
    return Scan(header.entries - 1, digest(head, ends, struct.pack("<q", entry.size)), columns_of(header.dtype),
                np.array([header.code, header.sequences], dtype=np.int64))


class MegatronReader(TokenReader):
    """Documents of Megatron ``.bin`` / ``.idx`` pairs."""

    def dtype(self, k: int) -> np.dtype:
        return Header(int(self.shards.index_of(k)[0]), 0, 0).dtype

    def _open_index(self, k: int) -> tuple[Bytes, Header]:
        index, info = _index(self.shards.location, self.shards.files[k])
        header = parse(bytes(index.read(0, HEADER)), int(info.size))
        code, sequences = self.shards.index_of(k).tolist()
        if (header.code, header.sequences, header.entries - 1) != (code, sequences, int(self.shards.rows[k])):
            raise ValueError(f"{self.shards.location.uri_of(companion(self.shards.files[k]))} changed since its "
                             "catalog was built; build the Dataset again")
        return index, header

    def _bounds(self, k: int, meta: TokenMeta, first: int, last: int) -> np.ndarray:
        index, header = meta.index
        documents = index.array(header.documents_at + 8 * first, last - first + 1, "<i8")
        low, high = int(documents[0]), int(documents[-1])
        if not 0 <= low <= high <= header.sequences or (np.diff(documents) < 0).any():
            raise ValueError(f"document indices {first:,}..{last:,} are not ascending within the {header.sequences:,} "
                             "sequences; the index is corrupted")
        before = 1 if low else 0  # the sequence before the piece: where the piece must start
        count = high - low + before
        pointers = index.array(header.pointers_at + 8 * (low - before), count, "<i8")
        lengths = index.array(header.lengths_at + 4 * (low - before), count, "<i4").astype(np.int64)
        itemsize = meta.dtype.itemsize
        ends = pointers + lengths * itemsize
        if count and ((lengths < 0).any() or (pointers[1:] != ends[:-1]).any() or (pointers % itemsize).any()):
            raise ValueError(f"the sequences of documents {first:,}..{last - 1:,} do not lie back to back in the .bin; "
                             "the index is corrupted")
        starts = np.append(pointers[before:], ends[-1] if count else 0) // itemsize
        bounds: np.ndarray = starts[documents - low]
        return bounds


class MegatronFormat(Format):
    name, suffixes, label = "megatron", (BIN,), "*.bin + *.idx"
    detect = False

    def scan(self, location: Location, entry: Entry) -> Scan:
        return scan(location, entry)

    def reader(self, shards: Shards, cache: ShardCache) -> MegatronReader:
        return MegatronReader(shards, cache)


MEGATRON = register(MegatronFormat())
