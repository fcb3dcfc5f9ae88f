"""Batches: zephon's default collate, and the columnar form for path datasets."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import default_collate

from zephon._ext.strings import strings
from zephon.io import gather_columns
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
    width = len(first)
    try:
        uneven = any(len(item) != width for item in items)  # with each of first's keys found below: the same fields
    except TypeError:  # an item without a length: not a mapping
        uneven = True
    if uneven:
        raise ValueError(_MIXED)
    out: dict[str, Any] = {}
    for key in first:
        if key == KEY_SAMPLE_ID and sample_ids is not None:
            out[key] = torch.from_numpy(np.asarray(sample_ids, dtype=np.int64))
            continue
        try:
            values = [item[key] for item in items]
        except (KeyError, TypeError):
            raise ValueError(f"{_MIXED} ({key!r} is missing from some)") from None
        if key == KEY_SAMPLE_ID:
            out[key] = torch.tensor(values, dtype=torch.int64).reshape(-1, 3)
        elif key == KEY_COMPONENT:
            out[key] = values
        else:
            out[key] = collate_values(values)
    return out


_MIXED = ("collate: the items of one batch have different fields (records with other fields, or components "
          "with other fields, are mixed): make them uniform with a map step, or pass your own collate_fn")


def collate_values(values: list[Any]) -> Any:
    """``default_collate(values)``. A list of Python ints or floats (what a map step's numeric
    field gives) goes through numpy, which makes the same tensor in a third of the time:
    ``torch.tensor`` of 256 ints takes 32 µs (5 % of the benchmark's map workers), this 10.
    numpy must read the list as int64 (or float64) whole, and only a list of Python ints alone
    (or floats alone) takes that way; anything else (ints with floats, which torch makes
    float32, with numpy scalars, which it may refuse, an int beyond int64, None, a nested list)
    is left to ``default_collate``."""
    kind = type(values[0])
    if kind is np.ndarray:
        return _stacked(values)
    if (kind is int or kind is float) and len(set(map(type, values))) == 1:
        try:
            array = np.array(values)
        except (ValueError, TypeError, OverflowError):  # ragged or odd: default_collate says what it makes of it
            return default_collate(values)
        if array.dtype == (np.int64 if kind is int else np.float64):
            return torch.from_numpy(array)
    return default_collate(values)


def _stacked(values: list[Any]) -> Any:
    """``default_collate`` of numpy arrays: arrays of one numeric dtype and shape are stacked by
    numpy into a new array the batch owns (token files' documents are read-only views, which
    torch warns about when it wraps them one by one); anything else is left to it."""
    first = values[0]
    if first.dtype.kind not in "biuf" or any(type(v) is not np.ndarray or v.dtype != first.dtype
                                              or v.shape != first.shape for v in values):
        return default_collate(values)
    try:
        return torch.from_numpy(np.stack(values))
    except TypeError:  # a dtype torch cannot hold: default_collate says so
        return default_collate(values)


def column_batch(column: pa.ChunkedArray) -> Any:
    """One column as ``default_collate`` would batch its Python values (without making them):
    integers as int64 (a ``uint64`` column is checked by :func:`column_batches` first)."""
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
    """Rows ``rows`` of each column of ``table`` (``zephon.io.fetch_rows``), in that order
    (``zephon.io.gather_columns``), a column of strings as one :class:`Strings`. A reader in
    the main process runs this in its fetch threads: the copies let the trainer's thread run."""
    return {name: Strings(*column) if isinstance(column, tuple) else column
            for name, column in gather_columns(table, rows).items()}


def column_batches(column: Any, bounds: Sequence[int], name: str = "") -> list[Any]:
    """What ``column_batch`` makes of rows ``bounds[k]:bounds[k + 1]`` of a gathered column
    ``name`` (:func:`gathered_columns`), for each ``k``; strings as :class:`Strings`, which
    become their list when the batch is handed out. A ``uint64`` value past int64 raises
    ``ValueError`` (as the record path's ``default_collate`` raises for it), never wraps."""
    spans = zip(bounds[:-1], bounds[1:])
    if type(column) is Strings:
        return [column.rows(a, b) for a, b in spans]
    if pa.types.is_uint64(column.type):
        _check_int64(name, column)
    return [column_batch(column.slice(a, b - a)) for a, b in spans]


def _check_int64(name: str, column: pa.ChunkedArray) -> None:
    """Raise ``ValueError`` if the unsigned ``column`` holds a value an int64 tensor cannot."""
    largest = pc.max(column).as_py()
    if largest is not None and largest > np.iinfo(np.int64).max:
        raise ValueError(f"column {name!r} holds the uint64 value {largest}, past the int64 a batch tensor holds (it "
                         "would wrap to a negative number); turn it into what you need with a map step (e.g. "
                         "str(value), or value - 2**63), or pass your own collate_fn")


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


def columnar_batches(pipeline: Any, columns: Mapping[str, Any], pointers: np.ndarray, components: np.ndarray,
                     bounds: Sequence[int]) -> list[dict[str, Any]]:
    """The batches ``[bounds[k], bounds[k + 1])`` of these samples, from their gathered
    ``columns`` (:func:`gathered_columns`): batch ``k`` equals
    ``collate(pipeline.materialize(...))`` of its samples once landed (see :class:`Strings`).
    The batches' ``_sample_id`` tensors are views of one copy of ``pointers`` (a batch kept
    keeps the whole copy, 24 bytes a sample of the bundle)."""
    per_column = {name: column_batches(column, bounds, name) for name, column in columns.items()}
    names = pipeline.batch_names(components, bounds)
    sample_ids = torch.split(torch.from_numpy(np.array(pointers, dtype=np.int64)), np.diff(bounds).tolist())
    batches = []
    for k, sample_id in enumerate(sample_ids):
        batch = {name: values[k] for name, values in per_column.items()}
        batch[KEY_SAMPLE_ID] = sample_id
        batch[KEY_COMPONENT] = names[k]
        batches.append(batch)
    return batches
