"""Parquet shards: footer scans for the catalog, and row-group reads through the fetch cache.

Row counts and schemas come from the footer (no data pages read). A read of some rows of a
shard decodes only the row groups those rows fall in, keeps each decoded row group in the
:class:`~zephon.io._cache.ShardCache` and gathers the rows with Arrow ``take``.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon.io._cache import ShardCache

SUFFIX = ".parquet"


@dataclass(frozen=True, slots=True)
class ParquetScan:
    """What the catalog keeps of one Parquet file."""

    rows: int
    digest: str  # blake2b-64 of the footer (schema, row groups, offsets, sizes, statistics), hex
    columns: tuple[tuple[str, str], ...]  # (name, Arrow type) per top-level column


def scan(path: str) -> ParquetScan:
    """Read one file's footer (errors name the file)."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            if size < 12:
                raise ValueError(f"{size} bytes is too short for Parquet")
            file.seek(size - 8)
            tail = file.read(8)
            if tail[4:] != b"PAR1":
                raise ValueError("no Parquet magic bytes at the end")
            length = int.from_bytes(tail[:4], "little")
            if length > size - 12:
                raise ValueError(f"footer length {length} exceeds the file")
            file.seek(size - 8 - length)
            footer = file.read(length)
            file.seek(0)
            metadata = pq.read_metadata(file)
            schema = metadata.schema.to_arrow_schema()
    except (OSError, ValueError, pa.ArrowException) as error:
        raise ValueError(f"{path}: cannot read this Parquet file ({error}); check that it is readable and "
                         "not corrupted") from error
    digest = hashlib.blake2b(footer, digest_size=8).hexdigest()
    return ParquetScan(metadata.num_rows, digest, tuple((f.name, str(f.type)) for f in schema))


class _Open:
    """An open shard: its ParquetFile and where each row group ends."""

    __slots__ = ("file", "ends", "starts")

    def __init__(self, path: str, rows: int):
        try:
            self.file = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as error:
            raise ValueError(f"{path}: cannot open this Parquet file ({error})") from error
        metadata = self.file.metadata
        counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        self.ends = np.cumsum(counts, dtype=np.int64)
        self.starts = self.ends - np.asarray(counts, dtype=np.int64)
        if metadata.num_rows != rows:
            raise ValueError(f"{path}: the file changed since its catalog was built ({rows:,} -> "
                             f"{metadata.num_rows:,} rows); build the Dataset again")


class ParquetReader:
    """Reads rows of a Parquet dataset, one row group at a time, through the fetch cache."""

    def __init__(self, directory: str, files: Sequence[str], rows: np.ndarray, cache: ShardCache):
        self._directory, self._files, self._rows = directory, list(files), rows
        self.cache = cache

    def path(self, k: int) -> str:
        return os.path.join(self._directory, self._files[k])

    def _open(self, k: int) -> _Open:
        return self.cache.handle(k, lambda: _Open(self.path(k), int(self._rows[k])))

    def _row_group(self, k: int, shard: _Open, group: int, columns: tuple[str, ...] | None) -> pa.Table:
        key = (group, columns)
        table = self.cache.get(k, key)
        if table is None:
            try:
                table = shard.file.read_row_group(group, columns=None if columns is None else list(columns))
            except (OSError, pa.ArrowException) as error:
                raise ValueError(f"{self.path(k)}: cannot read row group {group} ({error}); the file is "
                                 "corrupted or changed since its catalog was built") from error
            self.cache.put(k, key, table, table.get_total_buffer_size())
        return table

    def read_table(self, k: int, offsets: np.ndarray, columns: Sequence[str] | None) -> pa.Table:
        """Rows ``offsets`` of shard ``k`` (validated by the caller), in that order."""
        shard = self._open(k)
        columns = None if columns is None else tuple(columns)
        if not len(offsets):
            empty = shard.file.schema_arrow.empty_table()
            return empty if columns is None else empty.select(list(columns))
        groups = np.searchsorted(shard.ends, offsets, side="right")
        first, last = int(groups.min()), int(groups.max())
        if first == last:
            table = self._row_group(k, shard, first, columns)
            return table.take(pa.array(offsets - shard.starts[first]))
        ascending = bool((groups[1:] >= groups[:-1]).all())  # e.g. offsets sorted by fetch_table
        order = np.arange(len(groups)) if ascending else np.argsort(groups, kind="stable")
        cuts = np.flatnonzero(np.diff(groups[order])) + 1
        pieces = []
        for segment in np.split(order, cuts):
            group = int(groups[segment[0]])
            table = self._row_group(k, shard, group, columns)
            pieces.append(table.take(pa.array(offsets[segment] - shard.starts[group])))
        gathered = pa.concat_tables(pieces)  # one chunk per row group, no copy
        if ascending:
            return gathered
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return gathered.combine_chunks().take(pa.array(inverse))

    def read(self, k: int, offsets: np.ndarray, columns: Sequence[str] | None) -> list[dict[str, Any]]:
        return self.read_table(k, offsets, columns).to_pylist()
