"""A map-style view of an indexable source: ``len`` and ``[i]`` over its sample pointers.

Torch-free on purpose: the torch layer wraps it into a map-style ``Dataset``, and anything
else that expects ``__len__``/``__getitem__`` (samplers, HF-style pipelines) can use it as is.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from zephon.core.chunk import SampleId
from zephon.work.source import WorkSource


class PointerSequence(Sequence[SampleId]):
    """``seq[i]`` is ``source.sample_id_at(i)``; a slice or an index array gives ``(n, 3)`` int64."""

    def __init__(self, source: WorkSource):
        if not source.supports_indexing():
            raise TypeError(
                f"{type(source).__name__} does not support indexing (an infinite stream, a custom "
                f"allocator or a streaming-only source); use it as an iterable instead"
            )
        self._source = source

    def __len__(self) -> int:
        return len(self._source)

    # A slice or an index array gives one (n, 3) array, not a sequence of tuples.
    @overload  # type: ignore[override]
    def __getitem__(self, i: int) -> SampleId: ...

    @overload
    def __getitem__(self, i: slice | Sequence[int] | np.ndarray) -> np.ndarray: ...

    def __getitem__(self, i: Any) -> SampleId | np.ndarray:
        if isinstance(i, slice):
            return self._source.sample_ids_at(np.arange(*i.indices(len(self)), dtype=np.int64))
        if isinstance(i, (Sequence, np.ndarray)):
            return self._source.sample_ids_at(i)
        if isinstance(i, (int, np.integer)) and not isinstance(i, bool) and i < 0:
            i += len(self)
        return self._source.sample_id_at(i)
