"""Rows of an Arrow table or column of many chunks (decoded row groups), in a given order:
as Arrow (``take_rows``), column by column with strings as bytes (``gather_columns``), or as
Python records (``take_records``)."""
from __future__ import annotations

from typing import Any, Sequence, TypeVar

import numpy as np
import pyarrow as pa

from zephon._ext.strings import gather, strings

Data = TypeVar("Data", pa.Table, pa.ChunkedArray)
TABLE_ROWS = 16  # chunk_of builds its table for up to this many chunk rows per row looked up


def chunk_of(ends: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``np.searchsorted(ends, rows, side="right")``: for rows of chunks that end at ``ends``
    (cumulative lengths), the chunk each lies in (int64). Where the rows are many beside the
    chunks' rows, through a table of every row's chunk: a binary search per row mispredicts its
    branches: 2.4 ms for a bundle's 65,536 rows in 120 row groups, where the table takes 0.4."""
    rows = np.asarray(rows)
    total = int(ends[-1]) if len(ends) else 0
    if not len(rows) or total > TABLE_ROWS * len(rows) or rows.min() < 0 or rows.max() >= total:
        return np.searchsorted(ends, rows, side="right")
    chunks: np.ndarray = np.repeat(np.arange(len(ends), dtype=np.int64), np.diff(ends, prepend=0))[rows]
    return chunks


def take_rows(data: Data, rows: np.ndarray) -> Data:
    """Rows ``rows`` of ``data``, in that order: taken from each chunk on its own, then put in
    order with one ``take`` of the rows taken. Arrow's own ``take`` first joins every chunk (a
    copy of all the row groups, for however few rows)."""
    rows = np.asarray(rows, dtype=np.int64)
    if isinstance(data, pa.Table) and not data.num_columns:  # Arrow's take of it gives no rows
        return no_columns(len(rows))
    chunks = data.column(0).chunks if isinstance(data, pa.Table) and data.num_columns else \
        getattr(data, "chunks", [])
    if len(chunks) <= 1 or not len(rows):
        return data.take(pa.array(rows, pa.int64()))
    lengths = np.array([len(chunk) for chunk in chunks], dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    chunk = chunk_of(ends, rows)
    order = np.argsort(chunk, kind="stable")
    parts = []
    for part in np.split(order, np.flatnonzero(np.diff(chunk[order])) + 1):
        c = int(chunk[part[0]])
        parts.append(data.slice(int(starts[c]), int(lengths[c])).take(pa.array(rows[part] - starts[c])))
    joined = pa.concat_tables(parts) if isinstance(data, pa.Table) else \
        pa.chunked_array([piece for part in parts for piece in part.chunks], data.type)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return joined.take(pa.array(inverse))


def no_columns(rows: int) -> pa.Table:
    """A table of ``rows`` rows and no columns (what ``columns=[]`` reads)."""
    return pa.table({"": pa.nulls(rows)}).drop_columns([""])


def gather_columns(table: pa.Table, rows: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray] | pa.ChunkedArray]:
    """Rows ``rows`` of each column of ``table`` (e.g. ``fetch_rows``), in that order: a column
    of strings without nulls as one ``(int64 offsets, UTF-8 bytes)`` pair, each row copied once
    straight from the column's chunks (the ``strings`` kernel); the other columns taken
    together, from each chunk (:func:`take_rows`). ``IndexError`` for a row outside a table with
    columns."""
    rows = np.asarray(rows, dtype=np.int64)
    outside = (rows < 0) | (rows >= table.num_rows)
    if table.num_columns and outside.any():  # joined row groups without columns keep no row count
        raise IndexError(f"row {int(rows[outside][0])} is outside the table's {table.num_rows} rows")
    plain = [column.null_count == 0 and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type))
             for column in table.columns]
    others = [k for k, is_plain in enumerate(plain) if not is_plain]
    taken = iter(take_rows(table.select(others), rows).columns if others else ())
    out: dict[str, tuple[np.ndarray, np.ndarray] | pa.ChunkedArray] = {}
    located: Located | None = None
    for name, column, is_plain in zip(table.column_names, table.columns, plain):
        if not is_plain:
            out[name] = next(taken)
            continue
        if located is None or not located.fits(column.chunks):  # a table's columns usually share their chunks
            located = Located(column.chunks, rows)
        out[name] = gather_strings(column.chunks, located)
    return out


def take_records(table: pa.Table, rows: np.ndarray) -> list[dict[str, Any]]:
    """``take_rows(table, rows).to_pylist()``, made column by column (:func:`gather_columns`):
    strings by the ``strings`` kernel, other values by Arrow (``take_rows`` copies a string twice
    before Arrow makes it ``str``). A table without columns gives an empty dict a row, where
    Arrow's ``take`` of it gives no rows."""
    columns = gather_columns(table, rows)
    if not columns:
        return [{} for _ in range(len(rows))]
    names = list(columns)
    values = [strings(*column) if isinstance(column, tuple) else column.to_pylist() for column in columns.values()]
    records = [{names[0]: value} for value in values[0]]
    for name, column in zip(names[1:], values[1:]):  # a column at a time: a third of dict(zip(...)) a row
        for record, value in zip(records, column):
            record[name] = value
    return records


class Located:
    """Rows of the concatenation of ``chunks``, each as its chunk and its row there."""

    __slots__ = ("lengths", "chunk", "local")

    def __init__(self, chunks: Sequence[pa.Array], rows: np.ndarray):
        self.lengths = np.array([len(chunk) for chunk in chunks], dtype=np.int64)
        ends = np.cumsum(self.lengths)
        self.chunk = chunk_of(ends, rows)
        self.local = rows - (ends - self.lengths)[self.chunk]

    def fits(self, chunks: Sequence[pa.Array]) -> bool:
        """Whether ``chunks`` have the lengths these rows were located in."""
        return len(chunks) == len(self.lengths) and all(len(c) == n for c, n in zip(chunks, self.lengths.tolist()))


def gather_strings(chunks: Sequence[pa.Array], located: Located) -> tuple[np.ndarray, np.ndarray]:
    """The ``located`` rows of the concatenation of ``chunks`` (string arrays without nulls) as
    one ``(offsets, UTF-8 bytes)`` pair, each row copied once (``zephon._ext.strings.gather``)."""
    offsets, data = zip(*(_buffers(array) for array in chunks)) if chunks else ((), ())
    return gather(list(offsets), list(data), located.chunk, located.local)


def _buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string array's offsets (its own rows' only, int32 or int64 as Arrow keeps them: a view)
    and its UTF-8 bytes."""
    if not len(array):  # its offsets buffer may be empty or absent
        return _NO_ROWS, _NO_BYTES
    _, offsets, data = array.buffers()
    width = np.int64 if pa.types.is_large_string(array.type) else np.int32
    start = array.offset
    own = np.frombuffer(offsets, dtype=width)[start:start + len(array) + 1]
    return own, (np.frombuffer(data, dtype=np.uint8) if data is not None else _NO_BYTES)


_NO_ROWS, _NO_BYTES = np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8)


def gather_reference(offsets: Sequence[np.ndarray], data: Sequence[np.ndarray], chunk: np.ndarray,
                     local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the ``strings`` kernel's ``gather`` computes: row ``i`` is bytes ``offsets[c][r]``
    to ``offsets[c][r + 1]`` of ``data[c]``, with ``c, r = chunk[i], local[i]``."""
    rows = [bytes(data[c][offsets[c][r]:offsets[c][r + 1]]) for c, r in zip(chunk.tolist(), local.tolist())]
    ends = np.cumsum([0] + [len(row) for row in rows], dtype=np.int64)
    return ends, np.frombuffer(b"".join(rows), dtype=np.uint8)


def strings_reference(offsets: np.ndarray, data: np.ndarray) -> list[str]:
    """What the ``strings`` kernel's ``strings`` computes: row ``i``'s UTF-8 bytes decoded."""
    return [bytes(data[a:b]).decode() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
