"""Batches: zephon's default collate, and the columnar form for path datasets."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import default_collate

from zephon.io import fetch_table
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


def columnar_batch(pipeline: Any, pointers: np.ndarray, components: np.ndarray) -> dict[str, Any]:
    """The batch of ``pointers`` read as Arrow columns: equal to ``collate(pipeline.materialize(...))``."""
    table = fetch_table(pipeline.datasets_by_id, pointers, pipeline.columns)
    out = {name: column_batch(table.column(name)) for name in table.column_names}
    out[KEY_SAMPLE_ID] = torch.from_numpy(np.array(pointers, dtype=np.int64))
    out[KEY_COMPONENT] = pipeline.component_names(components)
    return out
