"""WorkChunk: one unit of work, the sample pointers of a few mixture components.

A chunk keeps every component's ``(dataset_id, shard_id, offset)`` pointers back to back in
one read-only ``(N, 3)`` int64 buffer and reads them in an order chosen by a
``MixtureReadConfig`` (see ``zephon/core/readorder.py``). Orders are computed as arrays by
the readorder kernel and cached on the chunk, which never changes; Python tuples are built
only when a caller iterates. ``state_dict()`` is tagged, versioned JSON.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from itertools import accumulate
from numbers import Integral, Real
from types import MappingProxyType
from typing import Any

import numpy as np

from zephon.core.readorder import iter_pairs as _iter_pairs
from zephon.core.readorder import read_pointers as _read_pointers

SampleId = tuple[int, int, int]  # (dataset_id, shard_id, offset)

STATE_KIND = "zephon.WorkChunk"
STATE_VERSION = 1
KEY_KIND = "kind"
KEY_VERSION = "version"
KEY_COMPONENTS = "components"
KEY_COUNTS = "counts"
KEY_SEED = "seed"
KEY_TARGET_MIXTURE = "target_mixture"
KEY_SOURCE_EXHAUSTED = "source_exhausted"
STATE_KEYS = (
    KEY_KIND, KEY_VERSION, KEY_COMPONENTS, KEY_COUNTS, KEY_SEED, KEY_TARGET_MIXTURE,
    KEY_SOURCE_EXHAUSTED,
)

_INT64 = np.dtype(np.int64)
_INT64_MAX = np.iinfo(np.int64).max
_NORMALISED = 1e-12  # a target whose sum is this close to 1 is kept as given


class MixtureReadMode(Enum):
    """How a chunk interleaves its components."""

    WEIGHTED_ROUND_ROBIN = "weighted_round_robin"
    WEIGHTED_RANDOM = "weighted_random"


class ComponentOrder(Enum):
    """Order of the samples inside one component."""

    AS_IS = "as_is"
    SHUFFLE = "shuffle"


@dataclass(frozen=True, slots=True)
class MixtureReadConfig:
    """How to read a chunk; validated on construction.

    Parameters
    ----------
    mode : MixtureReadMode, default WEIGHTED_ROUND_ROBIN
        Interleave components by smooth weighted round robin, or draw one per sample.
    seed : int or None, default None
        The seed of random choices; ``None``: the chunk's seed, or 0 when it has none.
    precompute : bool, default False
        Keep the ``(sample_id, name)`` pairs on the chunk for reuse.
    within_component : ComponentOrder, default AS_IS
        Read each component's pointers as stored, or shuffled first.
    """

    mode: MixtureReadMode = MixtureReadMode.WEIGHTED_ROUND_ROBIN
    seed: int | None = None  # None: the chunk's seed, or 0 when the chunk has none
    precompute: bool = False  # keep the (sample_id, name) pairs on the chunk for reuse
    within_component: ComponentOrder = ComponentOrder.AS_IS

    def __post_init__(self) -> None:
        _check_enum("mode", self.mode, MixtureReadMode)
        _check_enum("within_component", self.within_component, ComponentOrder)
        _check_seed("MixtureReadConfig.seed", self.seed)
        if not isinstance(self.precompute, bool):
            raise TypeError(
                f"MixtureReadConfig.precompute={self.precompute!r} must be a bool; "
                "pass True or False"
            )


class WorkChunk:
    """The pointers of a few named components, read in a seeded, reproducible order.

    ``WorkChunk(components, seed=None, target_mixture=None, source_exhausted=())`` copies
    and validates ``components`` (name -> list of triples or ``(n, 3)`` integer array);
    ``from_buffer`` wraps a ready buffer without copying. Immutable; equal chunks compare
    equal with ``==``.
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
        arrays = [_pointer_array(name, value) for name, value in components.items()]
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

        ``names`` are the components in order, ``pointers`` the buffer and ``counts`` the
        rows of each component; ``seed``, ``target_mixture`` and ``source_exhausted`` are
        stored as by the constructor.

        Component ``k`` is rows ``[sum(counts[:k]), sum(counts[:k + 1]))``. Only shapes,
        dtype and counts are checked, never the pointer values (the caller guarantees they
        are non-negative), and the caller must not write to ``pointers`` afterwards.
        """
        if not (isinstance(pointers, np.ndarray) and pointers.dtype == _INT64
                and pointers.ndim == 2 and pointers.shape[1] == 3
                and pointers.flags.c_contiguous):
            raise TypeError(
                f"from_buffer: pointers={_describe(pointers)} must be a C-contiguous "
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
        _check_names(names)
        _check_seed("seed", seed)
        target = _target_mixture(target_mixture)
        exhausted = _source_exhausted(source_exhausted)
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
        return self._seed

    @property
    def target_mixture(self) -> dict[str, float] | None:
        """The normalised target shares, or None."""
        return None if self._target is None else dict(self._target)

    @property
    def source_exhausted(self) -> tuple[str, ...]:
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
        """
        config = _check_config(config)
        key = self._order_key(config)
        order = self._orders.get(key)
        if order is None:
            pointers, component = _read_pointers(
                self._buffer, self._counts,
                weighted_random=key[0] is MixtureReadMode.WEIGHTED_RANDOM,
                shuffle=key[1] is ComponentOrder.SHUFFLE, seed=key[2],
            )
            pointers.flags.writeable = False
            component.flags.writeable = False
            order = self._orders[key] = (pointers, component)
        return order

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
        """
        config = _check_config(config)
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
        """All ``(sample_id, component_name)`` pairs in read order, as a new list."""
        return list(self.iter_samples(config))

    def sample_at(self, i: int, config: MixtureReadConfig | None = None) -> tuple[SampleId, str]:
        """The ``i``-th pair of the read order; ``IndexError`` unless ``0 <= i < len``."""
        if not isinstance(i, Integral) or isinstance(i, bool):
            raise TypeError(f"sample_at: i={i!r} must be an int; pass a position")
        if not 0 <= i < len(self._buffer):
            raise IndexError(
                f"sample_at: i={i} is outside the chunk; pass 0 <= i < {len(self._buffer)}"
            )
        pointers, component = self.read_order(config)
        return tuple(pointers[i].tolist()), self._names[component[i]]

    # -- JSON state -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The chunk as tagged, versioned JSON-able data (str/int/float/list/dict/None)."""
        return {
            KEY_KIND: STATE_KIND,
            KEY_VERSION: STATE_VERSION,
            KEY_COMPONENTS: {name: ids.tolist() for name, ids in self.components.items()},
            KEY_COUNTS: self.counts,
            KEY_SEED: self._seed,
            KEY_TARGET_MIXTURE: self.target_mixture,
            KEY_SOURCE_EXHAUSTED: list(self._exhausted),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> WorkChunk:
        """Rebuild a chunk from ``state_dict()``; any mismatch raises ``ValueError``."""
        _check_state_header(state)
        components, counts = state[KEY_COMPONENTS], state[KEY_COUNTS]
        if not isinstance(components, dict) or not isinstance(counts, dict):
            raise ValueError(
                f"from_state: {KEY_COMPONENTS!r} and {KEY_COUNTS!r} must be dicts keyed by "
                "component name; pass the output of WorkChunk.state_dict()"
            )
        arrays = {name: _ids_from_state(name, ids) for name, ids in components.items()}
        actual = {name: len(ids) for name, ids in arrays.items()}
        if counts != actual or not all(type(n) is int for n in counts.values()):
            raise ValueError(
                f"from_state: {KEY_COUNTS}={counts!r} does not match the components, which "
                f"hold {actual!r}; the state is corrupted"
            )
        try:
            return cls(arrays, seed=state[KEY_SEED],
                       target_mixture=state[KEY_TARGET_MIXTURE],
                       source_exhausted=state[KEY_SOURCE_EXHAUSTED])
        except (TypeError, ValueError) as error:
            raise ValueError(f"from_state: {error}") from error


# -- validation ---------------------------------------------------------------------------


def _describe(value: Any) -> str:
    """Short description of an argument for error messages."""
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape}, dtype={value.dtype})"
    return repr(value)


def _check_enum(name: str, value: Any, kind: type[Enum]) -> None:
    if not isinstance(value, kind):
        choices = ", ".join(f"{kind.__name__}.{member.name}" for member in kind)
        raise TypeError(f"MixtureReadConfig.{name}={value!r} must be one of {choices}")


def _check_seed(name: str, seed: Any) -> None:
    if seed is not None and (not isinstance(seed, Integral) or isinstance(seed, bool)):
        raise TypeError(f"{name}={seed!r} must be None or an int; pass an integer seed")


def _check_config(config: Any) -> MixtureReadConfig:
    if config is None:
        return DEFAULT_READ
    if not isinstance(config, MixtureReadConfig):
        raise TypeError(
            f"config={config!r} must be a MixtureReadConfig or None; "
            "pass MixtureReadConfig(mode=..., within_component=...)"
        )
    return config


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"component name {name!r} must be a non-empty str; rename it")


def _check_names(names: tuple[Any, ...]) -> None:
    for name in names:
        _check_name(name)
    if len(set(names)) != len(names):
        raise ValueError(f"names={names!r} repeat a component; give each a unique name")


def _pointer_array(name: Any, value: Any) -> np.ndarray:
    """``value`` as an ``(n, 3)`` int64 array of non-negative ids, or a clear error."""
    _check_name(name)
    fix = "pass a list of (dataset_id, shard_id, offset) triples or an (n, 3) integer array"
    try:
        array = np.asarray(value)
    except ValueError as error:
        raise ValueError(f"components[{name!r}] is ragged ({error}); {fix}") from None
    if array.shape == (0,):
        return np.empty((0, 3), dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"components[{name!r}]={_describe(array)} is not integer; {fix}")
    if array.ndim != 2 or array.shape[1] != 3:
        raise ValueError(f"components[{name!r}]={_describe(array)} is not (n, 3); {fix}")
    if array.size and (array.min() < 0 or array.max() > _INT64_MAX):
        raise ValueError(
            f"components[{name!r}] holds ids outside [0, 2**63); ids are non-negative int64"
        )
    return array.astype(np.int64, copy=False)


def _target_mixture(target: Any) -> dict[str, float] | None:
    """Validated target shares scaled to sum to 1 (kept as given when they already do)."""
    if target is None:
        return None
    if not isinstance(target, Mapping):
        raise TypeError(
            f"target_mixture={target!r} must be a mapping name -> weight or None; "
            "pass e.g. {'web': 0.7, 'code': 0.3}"
        )
    for name, weight in target.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"target_mixture key {name!r} must be a non-empty str")
        if (not isinstance(weight, Real) or isinstance(weight, bool)
                or not math.isfinite(weight) or weight < 0):
            raise ValueError(
                f"target_mixture[{name!r}]={weight!r} must be a finite number >= 0"
            )
    total = math.fsum(float(w) for w in target.values())
    if total <= 0:
        raise ValueError(f"target_mixture={dict(target)!r} must have a positive sum")
    scale = 1.0 if abs(total - 1.0) <= _NORMALISED else total
    return {name: float(weight) / scale for name, weight in target.items()}


def _source_exhausted(names: Any) -> tuple[str, ...]:
    """Unique non-empty names, sorted."""
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(
            f"source_exhausted={names!r} must be a collection of names; "
            "pass e.g. ['web'], not a single string"
        )
    names = list(names)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"source_exhausted entry {name!r} must be a non-empty str")
    if len(set(names)) != len(names):
        raise ValueError(f"source_exhausted={names!r} repeats a name; list each once")
    return tuple(sorted(names))


def _check_state_header(state: Any) -> None:
    """Type, fields, kind and version of a state, checked before anything is built."""
    if not isinstance(state, dict):
        raise ValueError(
            f"from_state: state must be a dict from WorkChunk.state_dict(), "
            f"got {type(state).__name__}"
        )
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"from_state: state lacks fields {missing}; it is not a chunk state")
    if state[KEY_KIND] != STATE_KIND:
        raise ValueError(
            f"from_state: {KEY_KIND}={state[KEY_KIND]!r} is not {STATE_KIND!r}; "
            "pass a WorkChunk state"
        )
    version = state[KEY_VERSION]
    if type(version) is not int or version != STATE_VERSION:
        raise ValueError(
            f"from_state: {KEY_VERSION}={version!r} is unknown; this zephon reads version "
            f"{STATE_VERSION}, so load the state with the zephon that wrote it"
        )


def _ids_from_state(name: Any, ids: Any) -> np.ndarray:
    """A state's id list as an ``(n, 3)`` int64 array; bools and negatives are refused."""
    def valid(sample_id: Any) -> bool:
        return (isinstance(sample_id, list) and len(sample_id) == 3
                and all(type(v) is int and 0 <= v <= _INT64_MAX for v in sample_id))

    if not isinstance(ids, list) or not all(map(valid, ids)):
        raise ValueError(
            f"from_state: components[{name!r}] must be a list of [dataset_id, shard_id, "
            "offset] lists of non-negative ints; the state is corrupted"
        )
    return np.array(ids, dtype=np.int64).reshape(-1, 3)


DEFAULT_READ = MixtureReadConfig()  # built last: its validation uses the helpers above
