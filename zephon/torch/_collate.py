"""Batches: zephon's default collate, and the columnar form for path datasets."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import default_collate

from zephon._ext.strings import gather, strings
from zephon.io import take_rows
from zephon.runtime import KEY_COMPONENT, KEY_SAMPLE_ID

KEY_DOCUMENTS = "_documents"  # a packed sequence's pieces


def collate(items: Sequence[Any]) -> Any:
    """zephon's default ``collate_fn``: torch's ``default_collate``, except that ``_sample_id``
    becomes one ``(batch, 3)`` int64 tensor and ``_component`` stays a list of names. Packed
    sequences become ``(batch, seq_len)`` tensors, their ``_documents`` a list per sequence."""
    first = items[0] if items else None
    if isinstance(first, Mapping) and KEY_DOCUMENTS in first:
        out = {key: default_collate([item[key] for item in items]) for key in first if key != KEY_DOCUMENTS}
        out[KEY_DOCUMENTS] = [item[KEY_DOCUMENTS] for item in items]
        return out
    return collate_rows(items, None)


def collate_rows(items: Sequence[Any], sample_ids: np.ndarray | None) -> Any:
    """:func:`collate`, with the items' ``_sample_id`` rows given as an ``(n, 3)`` int64 array
    of the batch's own (the batch's tensor shares it: no list of tuples, no copy)."""
    if not items:
        raise ValueError("collate: cannot make a batch of no items")
    first = items[0]
    if not isinstance(first, Mapping) or KEY_SAMPLE_ID not in first:
        return default_collate(list(items))
    out: dict[str, Any] = {}
    for key in first:
        if key == KEY_SAMPLE_ID and sample_ids is not None:
            out[key] = torch.from_numpy(np.asarray(sample_ids, dtype=np.int64))
            continue
        try:
            values = [item[key] for item in items]
        except (KeyError, TypeError):
            raise ValueError(f"collate: the items of one batch have different fields ({key!r} is missing from some; "
                             "components with other fields are mixed): make them uniform with a map step, or "
                             "pass your own collate_fn") from None
        if key == KEY_SAMPLE_ID:
            out[key] = torch.tensor(values, dtype=torch.int64).reshape(-1, 3)
        elif key == KEY_COMPONENT:
            out[key] = values
        else:
            out[key] = default_collate(values)
    return out


def column_batch(column: pa.ChunkedArray) -> Any:
    """One column as ``default_collate`` would batch its Python values (without making them)."""
    kind = column.type
    if column.null_count == 0:
        if pa.types.is_integer(kind):
            return torch.from_numpy(np.asarray(column, dtype=np.int64).copy())
        if pa.types.is_floating(kind):
            return torch.from_numpy(np.asarray(column, dtype=np.float64).copy())
        if pa.types.is_boolean(kind):
            return torch.from_numpy(np.asarray(column.to_numpy(zero_copy_only=False), dtype=bool).copy())
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return column.to_pylist()
    return default_collate(column.to_pylist())


def gathered_columns(table: pa.Table, rows: np.ndarray) -> dict[str, Any]:
    """Rows ``rows`` of each column of ``table`` (``zephon.io.fetch_rows``), in that order: a
    column of strings without nulls as one :class:`Strings`, its rows' bytes gathered straight
    from the column's chunks (the ``strings`` kernel); any other column taken from each chunk
    (``zephon.io.take_rows``). A reader in the main process runs this in its fetch thread: the
    copies let the trainer's thread run."""
    out: dict[str, Any] = {}
    located: Located | None = None
    for name in table.column_names:
        column = table.column(name)
        if column.null_count == 0 and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            if located is None or not located.fits(column.chunks):  # a table's columns usually share their chunks
                located = Located(column.chunks, rows)
            out[name] = Strings(*gather_strings(column.chunks, located))
        else:
            out[name] = take_rows(column, rows)
    return out


def column_batches(column: Any, bounds: Sequence[int]) -> list[Any]:
    """What ``column_batch`` makes of rows ``bounds[k]:bounds[k + 1]`` of a gathered column
    (:func:`gathered_columns`), for each ``k``; strings as :class:`Strings`, which become their
    list when the batch is handed out."""
    spans = zip(bounds[:-1], bounds[1:])
    if type(column) is Strings:
        return [column.rows(a, b) for a, b in spans]
    return [column_batch(column.slice(a, b - a)) for a, b in spans]


class Located:
    """Rows of the concatenation of ``chunks``, each as its chunk and its row there."""

    __slots__ = ("lengths", "chunk", "local")

    def __init__(self, chunks: Sequence[pa.Array], rows: np.ndarray):
        self.lengths = np.array([len(chunk) for chunk in chunks], dtype=np.int64)
        ends = np.cumsum(self.lengths)
        self.chunk = np.searchsorted(ends, rows, side="right")
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


class Strings:
    """A batch's column of strings as its rows' UTF-8 bytes and offsets: it crosses from a
    worker as two byte strings, and :meth:`values` makes its list where the batch is handed out."""

    __slots__ = ("offsets", "data")

    def __init__(self, offsets: np.ndarray, data: np.ndarray):
        self.offsets, self.data = offsets, data

    def values(self) -> list[str]:
        return strings(self.offsets, self.data)

    def rows(self, a: int, b: int) -> Strings:
        """Rows ``a`` to ``b`` (their own offsets, a view of the bytes)."""
        offsets = self.offsets
        return Strings(offsets[a:b + 1] - offsets[a], self.data[offsets[a]:offsets[b]])

    def __reduce__(self) -> tuple[Any, ...]:
        return _arrive, (self.offsets.tobytes(), self.data.tobytes())


def _arrive(offsets: bytes, data: bytes) -> Strings:
    return Strings(np.frombuffer(offsets, dtype=np.int64), np.frombuffer(data, dtype=np.uint8))


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


def columnar_batches(pipeline: Any, columns: Mapping[str, Any], pointers: np.ndarray, components: np.ndarray,
                     bounds: Sequence[int]) -> list[dict[str, Any]]:
    """The batches ``[bounds[k], bounds[k + 1])`` of these samples, from their gathered
    ``columns`` (:func:`gathered_columns`): batch ``k`` equals
    ``collate(pipeline.materialize(...))`` of its samples once landed (see :class:`Strings`).
    The batches' ``_sample_id`` tensors are views of one copy of ``pointers`` (a batch kept
    keeps the whole copy, 24 bytes a sample of the bundle)."""
    per_column = {name: column_batches(column, bounds) for name, column in columns.items()}
    names = pipeline.batch_names(components, bounds)
    sample_ids = torch.split(torch.from_numpy(np.array(pointers, dtype=np.int64)), np.diff(bounds).tolist())
    batches = []
    for k, sample_id in enumerate(sample_ids):
        batch = {name: values[k] for name, values in per_column.items()}
        batch[KEY_SAMPLE_ID] = sample_id
        batch[KEY_COMPONENT] = names[k]
        batches.append(batch)
    return batches
