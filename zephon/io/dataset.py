"""Datasets: named, sharded collections of records, described by their shard table.

| constructor | payload |
|---|---|
| ``Dataset.from_counts(name, counts, shard_ids=None)`` | none: scheduling only |
| ``Dataset.from_records(name, shards)`` | in-memory records, shard id = position |

The scheduler reads only ``name``, ``ids()`` and ``counts()``; ``read`` turns pointers back
into records.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _int_array(parameter: str, name: str, values: Any) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(
            f"Dataset {name!r}: {parameter} must be a 1-D sequence of ints, got {_show(values)}; "
            f"pass e.g. [1000, 2000]"
        )
    return array.astype(np.int64)


def _show(values: Any) -> str:
    text = repr(values)
    return text if len(text) <= 80 else text[:77] + "..."


class Dataset:
    """A named dataset: shard ids, rows per shard and, optionally, a way to read the rows."""

    __slots__ = ("_name", "_ids", "_counts", "_shards")

    def __init__(self, name: str, shard_ids: Any, counts: Any, *, shards: Sequence[Sequence[Any]] | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"Dataset name must be a non-empty str, got {name!r}; pass e.g. 'web'")
        ids = _int_array("shard_ids", name, shard_ids)
        rows = _int_array("counts", name, counts)
        if len(ids) != len(rows):
            raise ValueError(
                f"Dataset {name!r}: {len(ids)} shard_ids but {len(rows)} counts; pass one id per shard"
            )
        if (rows < 0).any():
            raise ValueError(f"Dataset {name!r}: counts must be >= 0, got {int(rows.min())}; fix the shard table")
        if (ids < 0).any():
            raise ValueError(f"Dataset {name!r}: shard_ids must be >= 0, got {int(ids.min())}; renumber the shards")
        order = np.argsort(ids, kind="stable")
        ids, rows = ids[order], rows[order]
        if len(ids) > 1 and not (np.diff(ids) > 0).all():
            duplicate = int(ids[:-1][np.diff(ids) == 0][0])
            raise ValueError(f"Dataset {name!r}: shard id {duplicate} appears twice; shard ids must be unique")
        ids.flags.writeable = rows.flags.writeable = False
        self._name, self._ids, self._counts, self._shards = name, ids, rows, shards

    @classmethod
    def from_counts(cls, name: str, counts: Sequence[int], shard_ids: Sequence[int] | None = None) -> Dataset:
        """A count-only dataset: shard ``i`` has ``counts[i]`` rows and id ``shard_ids[i]`` (default ``i``)."""
        if shard_ids is None:
            shard_ids = np.arange(len(counts), dtype=np.int64)
        return cls(name, shard_ids, counts)

    @classmethod
    def from_records(cls, name: str, shards: Sequence[Sequence[Any]]) -> Dataset:
        """An in-memory dataset; ``shards[i]`` holds the records of shard ``i``."""
        shards = [list(shard) for shard in shards]
        return cls(name, np.arange(len(shards), dtype=np.int64), [len(s) for s in shards], shards=shards)

    @property
    def name(self) -> str:
        return self._name

    def ids(self) -> np.ndarray:
        """Shard ids, ascending (read-only int64)."""
        return self._ids

    def counts(self) -> np.ndarray:
        """Rows per shard, aligned with ``ids()`` (read-only int64)."""
        return self._counts

    def total(self) -> int:
        return int(self._counts.sum())

    def max_count(self) -> int:
        return int(self._counts.max()) if len(self._counts) else 0

    def shard_count(self) -> int:
        return len(self._ids)

    def __len__(self) -> int:
        return self.total()

    def read(self, shard_id: int, offsets: Sequence[int]) -> list[Any]:
        """The records at ``offsets`` of shard ``shard_id``, in the order asked."""
        if self._shards is None:
            raise TypeError(f"Dataset {self._name!r} is count-only (from_counts): it has no records to read")
        k = int(np.searchsorted(self._ids, shard_id))
        if k == len(self._ids) or self._ids[k] != shard_id:
            raise IndexError(f"Dataset {self._name!r} has no shard {shard_id}")
        shard = self._shards[k]
        for offset in offsets:
            if not 0 <= offset < len(shard):
                raise IndexError(f"Dataset {self._name!r}, shard {shard_id}: offset {offset} is out of range [0, {len(shard)})")
        return [shard[offset] for offset in offsets]

    def __repr__(self) -> str:
        return f"Dataset({self._name!r}, shards={self.shard_count()}, total={self.total()})"
