"""Rows of an Arrow table or column of many chunks (decoded row groups), in a given order."""
from __future__ import annotations

from typing import TypeVar

import numpy as np
import pyarrow as pa

Data = TypeVar("Data", pa.Table, pa.ChunkedArray)


def take_rows(data: Data, rows: np.ndarray) -> Data:
    """Rows ``rows`` of ``data``, in that order: taken from each chunk on its own, then put in
    order with one ``take`` of the rows taken. Arrow's own ``take`` first joins every chunk (a
    copy of all the row groups, for however few rows)."""
    rows = np.asarray(rows, dtype=np.int64)
    chunks = data.column(0).chunks if isinstance(data, pa.Table) and data.num_columns else \
        getattr(data, "chunks", [])
    if len(chunks) <= 1 or not len(rows):
        return data.take(pa.array(rows, pa.int64()))
    lengths = np.array([len(chunk) for chunk in chunks], dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    chunk = np.searchsorted(starts, rows, side="right") - 1
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
