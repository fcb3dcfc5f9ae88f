"""Tables derived from the frozen configs: built lazily, kept in bounded caches keyed by value.

Configs and plans are values (frozen, hashable, compared by value), so everything the kernels
need from them is computed here on first use and found again by any equal config (a clone of
the same lane, a copy unpickled in a worker), or kept in the config's ``derived`` table, which
the lanes' configs made by ``for_lane`` share:

| cache | key | holds |
|---|---|---|
| :func:`plan_memo` | a :class:`DatasetPlan` | the cursor's shard tables and pass layouts, token cost lookups |
| :func:`costs` | a :class:`DatasetPlan` | int64 cost units of one draw per shard (token mode) |
| :func:`scheduler` | (kept in the config, by lane binding) | the scheduling kernel (``None`` when Python plans), over the config's tables |
| :func:`fingerprint_json` | (kept in the config, for all its lanes) | its fingerprint as canonical JSON (a lane seals a state per chunk) |
| :func:`memoised` | any hashable key | a named table of another core module (e.g. a stream index's lookup kernel) |

Each cache keeps its most recently used entries up to a bound; dropping one only costs
rebuilding it. :func:`clear` empties them all.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, TypeVar

import numpy as np

from zephon._ext.schedule import ScheduleTables, Scheduler
from zephon.core.alloc import KERNEL_CODES
from zephon.core.config import CARRY, POLICIES, DatasetPlan, SourceConfig, read_only, shard_costs

T = TypeVar("T")
PLANS = 4096  # datasets whose memo is kept (each holds O(#shards) tables)
TABLES = 64  # other tables (e.g. random-access kernels, each up to ~40 MB)


class Bounded:
    """A thread-safe LRU map that builds a missing value with ``build()`` (outside the lock).

    The hot path is the very key object asked for before (a lane asks once per chunk and
    dataset): it is answered by identity, without hashing the key; at most ``size`` such
    objects are remembered (they are held, so their ids stay theirs).
    """

    def __init__(self, size: int):
        self._size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._recent: dict[int, tuple[Hashable, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        recent = self._recent.get(id(key))
        if recent is not None and recent[0] is key:
            return recent[1]  # type: ignore[no-any-return]
        with self._lock:
            found = key in self._items
            if found:
                self._items.move_to_end(key)
                value = self._items[key]
        if not found:
            value = build()
            with self._lock:
                self._items[key] = value
                while len(self._items) > self._size:
                    self._items.popitem(last=False)
        with self._lock:
            if len(self._recent) >= self._size:
                self._recent.clear()
            self._recent[id(key)] = (key, value)
        return value  # type: ignore[no-any-return]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._recent.clear()


_MEMOS = Bounded(PLANS)
_COSTS = Bounded(PLANS)
_TABLES = Bounded(TABLES)
_FINGERPRINT = "fingerprint json"  # its key in a config's derived table
_KERNELS = "scheduling kernels"  # its key in a config's derived table: lane binding -> kernel, and ...
_TABLES_KEY = "tables"  # ... under this key the config's ScheduleTables, which its lanes' kernels share


class Remade(dict[Any, Any]):
    """A table of a config's ``derived`` whose values are made again where they are used, so it
    pickles empty: a source pickled for a spawned worker would carry all its process made (a
    scheduling kernel for every lane it read, half a kilobyte each pickled)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return Remade, ()


def derived_table(config: SourceConfig, key: str) -> Remade:
    """The :class:`Remade` table ``key`` of ``config``'s ``derived`` values (shared by its lanes)."""
    table: Remade | None = config.derived.get(key)  # not setdefault: that makes a Remade at every chunk
    if table is None:
        table = config.derived[key] = Remade()
    return table


def plan_memo(plan: DatasetPlan) -> dict[Any, Any]:
    """The mutable memo of derived tables of one dataset plan (its owners choose the keys)."""
    return _MEMOS.get(plan, dict)


def costs(plan: DatasetPlan) -> np.ndarray:
    """Estimated cost units of one draw from each shard (``shard_costs``); needs a token ratio."""
    if plan.token_ratio is None or plan.shard_bytes is None:
        raise ValueError(f"dataset {plan.name!r} has no token ratio (or byte sizes) yet: prime the source first")
    ratio, shard_bytes = plan.token_ratio, plan.shard_bytes
    return _COSTS.get(plan, lambda: shard_costs(plan.shard_counts, shard_bytes, ratio))


def scheduler(config: SourceConfig) -> Scheduler | None:
    """The scheduling kernel of ``config``; ``None`` for token mode and a fork's allocator. Kept
    in the config's ``derived`` table by lane binding, for all the lanes ``for_lane`` makes of
    it: making one costs less than finding an equal config's by value (45 µs, where a second
    source of the same settings had made it), and a bounded cache of one kernel per lane config
    missed at every chunk once a process read more lanes than it held. The lanes' kernels share
    the config's tables (``ScheduleTables``): a kernel holds only its lane's binding."""
    kernels = derived_table(config, _KERNELS)
    binding = (config.lane, config.canonical_replicas)
    if binding not in kernels:
        kernels[binding] = _make_scheduler(config, kernels)
    kernel: Scheduler | None = kernels[binding]
    return kernel


def fingerprint_json(config: SourceConfig, encode: Callable[[Any], str]) -> str:
    """``encode(config.fingerprint())`` (``encode``: the checkpoint's canonical JSON), made once
    per config and kept in its ``derived`` table, which the lanes' configs made by ``for_lane``
    share (the fingerprint leaves the lane out). Kept in a bounded cache by config, a process
    that seals the states of more lanes than the cache holds made it again for each."""
    text: str | None = config.derived.get(_FINGERPRINT)
    if text is None:
        text = config.derived[_FINGERPRINT] = encode(config.fingerprint())
    return text


def memoised(key: Hashable, build: Callable[[], T]) -> T:
    """A table another core module derives from values in ``key`` (kept among the last ``TABLES``)."""
    return _TABLES.get(key, build)


def clear() -> None:
    """Forget every table of the caches above (they are rebuilt on next use); a config keeps
    its own ``derived`` values."""
    for cache in (_MEMOS, _COSTS, _TABLES):
        cache.clear()


def _make_scheduler(config: SourceConfig, kernels: Remade) -> Scheduler | None:
    """A lane's kernel over the config's tables, made once into ``kernels`` for all its lanes."""
    code = KERNEL_CODES.get(type(config.allocator))  # exact types: a subclass may allocate otherwise
    if config.token_mode or code is None:
        return None
    tables = kernels.get(_TABLES_KEY)
    if tables is None:
        tables = kernels[_TABLES_KEY] = ScheduleTables(
            code,
            np.array(config.normalised, dtype=np.float64),
            read_only([d.total for d in config.datasets]),
            read_only([POLICIES.index(d.policy) for d in config.datasets]),
            read_only([-1 if d.max_repeats is None else d.max_repeats for d in config.datasets]),
            read_only([d.pass_tail == CARRY for d in config.datasets]),
            read_only(config.summing_order), config.stop_after_passes or 0, config.chunk_size,
        )
    lane, replicas = config.lane_binding
    return Scheduler(tables, lane, replicas, config.routing.code, config.lane_key)
