"""Arrow IPC shards (``*.arrow``, ``*.feather``): random access by record batch.

Both IPC layouts are read: the *file* format (``ARROW1`` magic, what ``pyarrow.feather`` and
``pa.ipc.new_file`` write) and the *stream* format (what Hugging Face ``datasets`` writes).
The catalog scan walks the file's messages once and keeps, per file, an ``index`` of int64
triples ``(byte offset, byte length, rows)``: first the schema message, then one per record
batch. A piece is a record batch, read with one ranged request and decoded without a copy.
Files with dictionary-encoded columns are refused (their batches are not independent).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from zephon.io._fs import Entry, Location
from zephon.io._cache import ShardCache
from zephon.io._shards import Format, Handles, Scan, ShardReader, Shards, register

SUFFIXES = (".arrow", ".feather")
FILE_MAGIC = b"ARROW1"


def _messages(file: pa.NativeFile) -> list[tuple[int, int, pa.ipc.Message]]:
    """``(offset, length, message)`` of every message up to the end of the stream."""
    start = 8 if file.read_at(6, 0) == FILE_MAGIC else 0
    file.seek(start)
    reader = pa.ipc.MessageReader.open_stream(file)
    out: list[tuple[int, int, pa.ipc.Message]] = []
    while True:
        position = file.tell()
        try:
            message = reader.read_next_message()
        except StopIteration:
            return out
        out.append((position, file.tell() - position, message))


def scan(location: Location, entry: Entry) -> Scan:
    """Walk one file's messages: rows, schema, digest of every message, and the batch index."""
    uri = location.uri_of(entry.name)
    hasher = hashlib.blake2b(digest_size=8)
    with location.open(location.info(entry.name)) as file:
        messages = _messages(file)
    if not messages or messages[0][2].type != "schema":
        raise ValueError(f"{uri}: not an Arrow IPC file (no schema message at its start)")
    schema = pa.ipc.read_schema(messages[0][2])
    encoded = [f.name for f in schema if pa.types.is_dictionary(f.type)]
    if encoded:
        raise ValueError(f"{uri}: dictionary-encoded Arrow columns ({', '.join(encoded)}) are not supported; cast "
                         "them to their value type (e.g. table.cast(...)) and write the file again")
    triples, rows = [], 0
    for offset, length, message in messages:
        hasher.update(message.metadata)
        if message.body is not None:
            hasher.update(message.body)
        count = 0
        if message.type == "record batch":
            count = pa.ipc.read_record_batch(message, schema).num_rows
            rows += count
        triples.append((offset, length, count))
    index = np.asarray(triples, dtype=np.int64).reshape(-1)
    return Scan(rows, hasher.hexdigest(), tuple((f.name, str(f.type)) for f in schema), index)


@dataclass(frozen=True, slots=True)
class _Meta:
    info: pafs.FileInfo
    files: Handles
    schema: pa.Schema
    batches: np.ndarray  # (batches, 3): offset, length, rows
    ends: np.ndarray


class ArrowReader(ShardReader[_Meta]):
    """Reads rows of an Arrow IPC dataset, one record batch at a time, through the fetch cache."""

    piece_name = "record batch"

    def _open(self, k: int, info: pafs.FileInfo) -> _Meta:
        triples = self.shards.index_of(k).reshape(-1, 3)
        offset, length, _ = triples[0].tolist()
        files = Handles(self.shards.location, info)
        with files.use() as file:
            schema = pa.ipc.read_schema(pa.ipc.read_message(file.read_at(length, offset)))
        batches = triples[1:]
        return _Meta(info, files, schema, batches, np.cumsum(batches[:, 2], dtype=np.int64))

    def _ends(self, k: int, meta: _Meta) -> np.ndarray:
        return meta.ends

    def _estimate(self, k: int, meta: _Meta, piece: int, columns: tuple[str, ...] | None) -> int:
        return int(meta.batches[piece, 1])

    def _load(self, k: int, meta: _Meta, piece: int, columns: tuple[str, ...] | None) -> tuple[pa.Table, int]:
        offset, length, _ = meta.batches[piece].tolist()
        with meta.files.use() as file:
            data = file.read_at(length, offset)
        batch = pa.ipc.read_record_batch(pa.ipc.read_message(data), meta.schema)
        table = pa.Table.from_batches([batch])
        if columns is not None:
            table = table.select(list(columns))
        # a compressed body decodes to more; an uncompressed one is kept whole by the columns selected from it
        return table, max(len(data), table.get_total_buffer_size())

    def empty(self, k: int, columns: tuple[str, ...] | None) -> pa.Table:
        empty = self.meta(k).schema.empty_table()
        return empty if columns is None else empty.select(list(columns))


class ArrowFormat(Format):
    name, suffixes, label = "arrow", SUFFIXES, "*.arrow"

    def scan(self, location: Location, entry: Entry) -> Scan:
        return scan(location, entry)

    def reader(self, shards: Shards, cache: ShardCache) -> ArrowReader:
        return ArrowReader(shards, cache)


ARROW = register(ArrowFormat())
