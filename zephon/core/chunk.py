"""WorkChunk: one unit of work, the sample pointers of a few mixture components.

A chunk keeps every component's ``(dataset_id, shard_id, offset)`` pointers back to back in
one read-only ``(N, 3)`` int64 buffer and reads them in an order chosen by a
``MixtureReadConfig`` (``zephon/core/read_config.py``). Orders are computed as arrays by the
readorder kernel (``zephon/core/readorder.py``) and cached on the chunk, which never changes;
Python tuples are built only when a caller iterates. Its arguments are checked in
``zephon/core/chunk_checks.py``; ``state_dict()`` is the tagged, versioned JSON of
``zephon/core/chunk_state.py``.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from itertools import accumulate
from numbers import Integral
from types import MappingProxyType
from typing import Any

import numpy as np

from zephon.core import chunk_checks as checks
from zephon.core.chunk_state import WorkChunkStateDict, fields_from_json, state_to_json
from zephon.core.read_config import (
    ComponentOrder,
    MixtureReadConfig,
    MixtureReadMode,
    read_config_or_default,
)
from zephon.core.readorder import iter_pairs as _iter_pairs
from zephon.core.readorder import read_pointers as _read_pointers

SampleId = tuple[int, int, int]  # (dataset_id, shard_id, offset)

_INT64 = np.dtype(np.int64)


class WorkChunk:
    """The pointers of a few named components, read in a seeded, reproducible order.

    The constructor copies and validates ``components``; ``from_buffer`` wraps a ready
    buffer without copying. Immutable; equal chunks compare equal with ``==``.

    Parameters
    ----------
    components : Mapping[str, Any]
        Component name -> its pointers, a list of ``(dataset_id, shard_id, offset)``
        triples or an ``(n, 3)`` integer array of non-negative ids. Components keep this
        order; an empty one is kept with a count of 0.
    seed : int or None, default None
        Seed of the random read orders when the ``MixtureReadConfig`` gives none.
    target_mixture : Mapping[str, float] or None, default None
        The shares the chunk was aiming for, name -> weight ``>= 0`` with a positive sum;
        stored scaled to sum to 1.
    source_exhausted : Iterable[str], default ()
        The datasets that can give the stream nothing more (drained, or capped and short of
        their next quota); stored sorted, each name once.
    """

    __slots__ = ("_names", "_counts", "_buffer", "_seed", "_target", "_exhausted",
                 "_orders", "_pairs")

    def __init__(
        self,
        components: Mapping[str, Any],
        seed: int | None = None,
        target_mixture: Mapping[str, float] | None = None,
        source_exhausted: Iterable[str] = (),
    ) -> None:
        if not isinstance(components, Mapping):
            raise TypeError(
                f"components={components!r} must be a mapping name -> pointers; "
                "pass a dict such as {'web': [(0, 0, 0), (0, 0, 1)]}"
            )
        arrays = [checks.pointer_array(name, value) for name, value in components.items()]
        buffer = np.concatenate(arrays) if arrays else np.empty((0, 3), dtype=np.int64)
        buffer.flags.writeable = False
        self._setup(tuple(components), buffer, tuple(len(a) for a in arrays),
                    seed, target_mixture, source_exhausted)

    @classmethod
    def from_buffer(
        cls,
        names: Sequence[str],
        pointers: np.ndarray,
        counts: Sequence[int] | np.ndarray,
        *,
        seed: int | None = None,
        target_mixture: Mapping[str, float] | None = None,
        source_exhausted: Iterable[str] = (),
    ) -> WorkChunk:
        """Wrap an ``(N, 3)`` int64 C-contiguous buffer without copying it.

        Component ``k`` is rows ``[sum(counts[:k]), sum(counts[:k + 1]))``. Only shapes,
        dtype and counts are checked, never the pointer values (the caller guarantees they
        are non-negative), and the caller must not write to ``pointers`` afterwards.

        Parameters
        ----------
        names : Sequence[str]
            The component names, in buffer order.
        pointers : numpy.ndarray
            The ``(N, 3)`` int64 C-contiguous buffer of ``(dataset_id, shard_id, offset)``
            rows.
        counts : Sequence[int] or numpy.ndarray
            The rows of each component, one non-negative int per name, summing to ``N``.
        seed : int or None, default None
            As for the constructor.
        target_mixture : Mapping[str, float] or None, default None
            As for the constructor.
        source_exhausted : Iterable[str], default ()
            As for the constructor.

        Returns
        -------
        WorkChunk
            A chunk whose components are read-only views of ``pointers``.
        """
        if not (isinstance(pointers, np.ndarray) and pointers.dtype == _INT64
                and pointers.ndim == 2 and pointers.shape[1] == 3
                and pointers.flags.c_contiguous):
            raise TypeError(
                f"from_buffer: pointers={checks.describe(pointers)} must be a C-contiguous "
                "(N, 3) int64 array; build it with np.empty((N, 3), dtype=np.int64)"
            )
        if isinstance(names, str):
            raise TypeError(f"from_buffer: names={names!r} must be a sequence of names, not a str")
        counts = tuple(counts.tolist() if isinstance(counts, np.ndarray) else counts)
        if (len(counts) != len(names) or not all(type(n) is int and n >= 0 for n in counts)
                or sum(counts) != len(pointers)):
            raise ValueError(
                f"from_buffer: counts={counts!r} must hold one non-negative int per name "
                f"({len(names)} names) summing to the {len(pointers)} pointer rows"
            )
        view = pointers.view()
        view.flags.writeable = False
        chunk = cls.__new__(cls)
        chunk._setup(tuple(names), view, counts, seed, target_mixture, source_exhausted)
        return chunk

    def _setup(self, names: tuple[str, ...], buffer: np.ndarray, counts: tuple[int, ...],
               seed: Any, target_mixture: Any, source_exhausted: Any) -> None:
        """Validate the non-pointer fields, then fill the slots."""
        checks.check_names(names)
        checks.check_seed("seed", seed)
        target = checks.target_mixture(target_mixture)
        exhausted = checks.source_exhausted(source_exhausted)
        self._names, self._counts, self._buffer = names, counts, buffer
        self._seed = None if seed is None else int(seed)
        self._target, self._exhausted = target, exhausted
        self._orders: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._pairs: dict[tuple[Any, ...], list[tuple[SampleId, str]]] = {}

    # -- contents ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._buffer)

    @property
    def components(self) -> Mapping[str, np.ndarray]:
        """Read-only mapping name -> read-only ``(n, 3)`` int64 view, in insertion order."""
        starts = accumulate(self._counts, initial=0)
        return MappingProxyType({
            name: self._buffer[start:start + n]
            for name, n, start in zip(self._names, self._counts, starts)
        })

    @property
    def component_names(self) -> tuple[str, ...]:
        """The component names, in insertion order."""
        return self._names

    @property
    def counts(self) -> dict[str, int]:
        """Pointers per component, empty components included."""
        return dict(zip(self._names, self._counts))

    @property
    def mixture(self) -> dict[str, float]:
        """Count shares of the non-empty components."""
        total = len(self._buffer)
        return {name: n / total for name, n in zip(self._names, self._counts) if n}

    @property
    def seed(self) -> int | None:
        """Seed of the random read orders when a ``MixtureReadConfig`` gives none, or None."""
        return self._seed

    @property
    def target_mixture(self) -> dict[str, float] | None:
        """The normalised target shares, or None."""
        return None if self._target is None else dict(self._target)

    @property
    def source_exhausted(self) -> tuple[str, ...]:
        """The datasets that can give the stream nothing more (drained, or capped and short of
        their next quota), sorted."""
        return self._exhausted

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkChunk):
            return NotImplemented
        return (self._names == other._names and self._counts == other._counts
                and self._seed == other._seed and self._target == other._target
                and self._exhausted == other._exhausted
                and np.array_equal(self._buffer, other._buffer))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"WorkChunk(counts={self.counts!r}, seed={self._seed!r}, "
                f"target_mixture={self._target!r}, source_exhausted={self._exhausted!r})")

    # -- read order -------------------------------------------------------------------

    def read_order(self, config: MixtureReadConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(pointers (N, 3) int64, component_index (N,) int64)`` in read order.

        ``component_index`` indexes ``component_names``. Both arrays are read-only and
        cached on the chunk.

        Parameters
        ----------
        config : MixtureReadConfig or None, default None
            The read order; ``None`` reads by weighted round robin, components as stored.
        """
        key = self._order_key(read_config_or_default(config))
        order = self._orders.get(key)
        if order is None:
            pointers, component = self._read(key)
            pointers.flags.writeable = False
            component.flags.writeable = False
            order = self._orders[key] = (pointers, component)
        return order

    def read_order_into(self, pointers: np.ndarray, component: np.ndarray,
                        config: MixtureReadConfig | None = None) -> None:
        """:meth:`read_order` written into arrays of the caller's, for one that wants the order
        in its place (a DataLoader worker's shared slot) rather than a copy of it. Nothing is
        cached on the chunk. An order the chunk has not cached is written there with its
        pointers past the CPU's caches where it has such stores (x86-64), as suits an array read
        later or by another process, not at once.

        Parameters
        ----------
        pointers : numpy.ndarray
            A writable C-contiguous ``(N, 3)`` int64 array (``N = len(chunk)``): the pointers.
        component : numpy.ndarray
            A writable C-contiguous ``(N,)`` int64 array: the component indexes.
        config : MixtureReadConfig or None, default None
            The read order, as for :meth:`read_order`.

        Raises
        ------
        ValueError
            An array of another shape, dtype or layout, or read-only.
        """
        checks.order_arrays(pointers, component, len(self))
        order = self._orders.get(key := self._order_key(read_config_or_default(config)))
        if order is not None:
            pointers[...], component[...] = order
        else:
            self._read(key, (pointers, component))

    def _read(self, key: tuple[Any, ...], out: tuple[np.ndarray, np.ndarray] | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """The read order of cache key ``key`` (:meth:`_order_key`), into ``out`` if given."""
        return _read_pointers(self._buffer, self._counts, weighted_random=key[0] is MixtureReadMode.WEIGHTED_RANDOM,
                              shuffle=key[1] is ComponentOrder.SHUFFLE, seed=key[2], out=out)

    def _order_key(self, config: MixtureReadConfig) -> tuple[Any, ...]:
        """Cache key: mode, within-component order and the effective seed (0 if unused)."""
        seed = config.seed if config.seed is not None else self._seed or 0
        if (config.mode is MixtureReadMode.WEIGHTED_ROUND_ROBIN
                and config.within_component is ComponentOrder.AS_IS):
            seed = 0
        return config.mode, config.within_component, seed

    def iter_samples(self, config: MixtureReadConfig | None = None) -> Iterator[tuple[SampleId, str]]:
        """``(sample_id, component_name)`` pairs in read order, as plain Python values.

        Like ``zip``, the iterator refills a pair for a later step once nothing holds it.

        Parameters
        ----------
        config : MixtureReadConfig or None, default None
            The read order; ``None`` reads by weighted round robin, components as stored.
        """
        config = read_config_or_default(config)
        if config.precompute:
            return iter(self._precomputed(config))
        pointers, component = self.read_order(config)
        return _iter_pairs(pointers, component, self._names)

    def _precomputed(self, config: MixtureReadConfig) -> list[tuple[SampleId, str]]:
        """The pairs of ``config``, built once and kept on the chunk."""
        key = self._order_key(config)
        pairs = self._pairs.get(key)
        if pairs is None:
            lazy = replace(config, precompute=False)
            pairs = self._pairs[key] = list(self.iter_samples(lazy))
        return pairs

    def __iter__(self) -> Iterator[tuple[SampleId, str]]:
        return self.iter_samples()

    def materialize_order(self, config: MixtureReadConfig | None = None) -> list[tuple[SampleId, str]]:
        """All ``(sample_id, component_name)`` pairs in read order, as a new list.

        Parameters
        ----------
        config : MixtureReadConfig or None, default None
            The read order; ``None`` reads by weighted round robin, components as stored.
        """
        return list(self.iter_samples(config))

    def sample_at(self, i: int, config: MixtureReadConfig | None = None) -> tuple[SampleId, str]:
        """The ``i``-th pair of the read order; ``IndexError`` unless ``0 <= i < len``.

        Parameters
        ----------
        i : int
            The position in the read order.
        config : MixtureReadConfig or None, default None
            The read order; ``None`` reads by weighted round robin, components as stored.
        """
        if not isinstance(i, Integral) or isinstance(i, bool):
            raise TypeError(f"sample_at: i={i!r} must be an int; pass a position")
        if not 0 <= i < len(self._buffer):
            raise IndexError(
                f"sample_at: i={i} is outside the chunk; pass 0 <= i < {len(self._buffer)}"
            )
        pointers, component = self.read_order(config)
        return tuple(pointers[i].tolist()), self._names[component[i]]

    # -- JSON state -------------------------------------------------------------------

    def state_dict(self) -> WorkChunkStateDict:
        """The chunk as tagged, versioned JSON-able data (str/int/float/list/dict/None); see
        :class:`WorkChunkStateDict`."""
        return state_to_json(self.components, self._seed, self._target, self._exhausted)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> WorkChunk:
        """Rebuild a chunk from ``state_dict()``; any mismatch raises ``ValueError``."""
        fields = fields_from_json(state)
        try:
            return cls(fields.components, seed=fields.seed,
                       target_mixture=fields.target_mixture,
                       source_exhausted=fields.source_exhausted)
        except (TypeError, ValueError) as error:
            raise ValueError(f"from_state: {error}") from error
