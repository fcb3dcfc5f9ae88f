"""The resolved, validated configuration of a mixture source: frozen, shared by its lanes.

Everything the user chose is expanded here once (weights as given, per-dataset policies,
resolved block sizes, shard tables as read-only int64 arrays); the core reads it and never
changes it. Both types are values: frozen, hashable, compared by value; what is derived
from them for the kernels lives in :mod:`zephon.core.cache`. The shell (``zephon.work``)
turns user input into these types with friendly messages; the constructors here refuse
anything the kernels could not run (types and ranges), so ``zephon.core.step`` is safe on
any config that exists.
"""
from __future__ import annotations

import hashlib
import math
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Any, Sequence

import numpy as np

from zephon.core.alloc import Allocator
from zephon.core.keys import DOMAIN_CHUNK_SEED, DOMAIN_LANE, purpose_key
from zephon.core.routing import ROUTINGS, ModuloRouting, PermuteRouting, Routing

COST_UNITS = 16  # a draw's cost is counted in 1/16 tokens (zephon.core.tokens)
MAX_COST = 2**24  # cost units: 2**20 tokens, the most one draw is priced at


def shard_costs(shard_counts: np.ndarray, shard_bytes: np.ndarray, ratio: float) -> np.ndarray:
    """Estimated tokens of one draw from each shard, ``max(1, bytes per row × ratio)``, as int64
    cost units (``COST_UNITS`` per token, rounded, at most ``MAX_COST``): integers keep token
    deficits exact."""
    rows = np.maximum(shard_counts, 1).astype(np.float64)
    tokens = np.maximum(1.0, shard_bytes / rows * ratio)
    costs: np.ndarray = np.minimum(np.rint(tokens * COST_UNITS), MAX_COST).astype(np.int64)
    costs.flags.writeable = False
    return costs


STOP, REPEAT, REDISTRIBUTE = "stop", "repeat", "redistribute"
POLICIES = (STOP, REPEAT, REDISTRIBUTE)
CARRY, DROP = "carry", "drop"
PASS_TAILS = (CARRY, DROP)  # what a repeating dataset does with a pass's tail shorter than its quota
MODULO, PERMUTE = ModuloRouting.name, PermuteRouting.name  # lane_assignment values (zephon.core.routing)
MEASURED, PINNED, FALLBACK = "measured", "pinned", "fallback"  # where a token ratio came from
EXACT = "exact"  # token files: 1 / the token's size, so a shard's cost is its exact tokens per document
ORIGINS = (MEASURED, PINNED, FALLBACK, EXACT)
FIXED = (PINNED, EXACT)  # origins set at construction (a checkpoint's ratio must match them)


def read_only(values: Any) -> np.ndarray:
    """``values`` as a contiguous, read-only int64 array (a frozen one is taken as it is)."""
    if isinstance(values, np.ndarray) and values.dtype == np.int64 and not values.flags.writeable \
            and values.flags.c_contiguous:
        return values  # a dataset's table: already frozen
    array: np.ndarray = np.ascontiguousarray(values, dtype=np.int64)
    array.flags.writeable = False
    return array


def shard_digest(shard_ids: np.ndarray, shard_counts: np.ndarray) -> str:
    """sha256 (16 hex digits) of a shard table: ids and counts as int64."""
    digest = hashlib.sha256(read_only(shard_ids).tobytes())
    digest.update(read_only(shard_counts).tobytes())
    return digest.hexdigest()[:16]


def _refuse_type(owner: str, name: str, value: Any, expected: str) -> TypeError:
    return TypeError(f"{owner}.{name} must be {expected}, got {value!r} ({type(value).__name__})")


def _check_binding(owner: str, lane: Any, replicas: Any) -> None:
    """A lane binding: both None (the template), or lane ``0 <= lane < replicas``."""
    if (lane is None) != (replicas is None):
        raise ValueError(f"{owner}: lane and canonical_replicas are set together (a lane clone) or not at "
                         f"all (the template), got lane={lane!r}, canonical_replicas={replicas!r}")
    if lane is not None:
        _check_int(owner, "canonical_replicas", replicas, 1)
        _check_int(owner, "lane", lane, 0)
        if lane >= replicas:
            raise ValueError(f"{owner}.lane must be < canonical_replicas={replicas}, got {lane!r}")


def _check_int(owner: str, name: str, value: Any, minimum: int | None = None, optional: bool = False) -> None:
    if optional and value is None:
        return
    if type(value) is not int and (type(value) is bool or not isinstance(value, numbers.Integral)):
        raise _refuse_type(owner, name, value, "an int" + (" or None" if optional else ""))
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value!r}")


def _check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _refuse_type(owner, name, value, "True or False")


def _check_choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {list(choices)}, got {value!r}")


SHORT = 8  # tables up to this many shards are checked in Python (numpy's per-call cost dominates)


def _check_table(name: str, shard_ids: Any, shard_counts: Any, shard_bytes: Any) -> None:
    ids = shard_ids if isinstance(shard_ids, np.ndarray) else np.asarray(shard_ids)
    n = len(ids)
    for field_name, values in (("shard_ids", ids), ("shard_counts", shard_counts), ("shard_bytes", shard_bytes)):
        if field_name == "shard_bytes" and values is None:
            continue
        array = values if isinstance(values, np.ndarray) else np.asarray(values)
        if array.ndim != 1 or len(array) != n or (n and array.dtype.kind not in "iu"):
            raise TypeError(f"DatasetPlan({name!r}).{field_name} must be a 1-D integer array of one entry per "
                            f"shard ({n}), got shape {array.shape} of {array.dtype}")
        low = (min(array.tolist()) if n <= SHORT else int(array.min())) if n else 0
        if low < 0:
            raise ValueError(f"DatasetPlan({name!r}).{field_name} must be >= 0, got {low}")
    if n > 1:
        short = ids.tolist() if n <= SHORT else None
        ascending = all(a < b for a, b in zip(short, short[1:])) if short else bool((ids[1:] > ids[:-1]).all())
        if not ascending:
            raise ValueError(f"DatasetPlan({name!r}).shard_ids must be ascending and unique")


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DatasetPlan:
    """One dataset as the scheduler sees it: its shard table and its resolved settings.

    A value: equal plans have equal fields and equal hashes (the hash leaves the shard arrays
    out; they are compared element by element only when everything else is equal). The
    constructor refuses types and ranges the kernels cannot run.

    Fields: ``name``; ``shard_ids`` and ``shard_counts``, its shard table; ``weight``;
    ``policy``, ``max_repeats``, ``reshuffle_on_repeat``, ``block_size`` and ``pass_tail`` as resolved;
    ``data_fingerprint``, its content fingerprint; ``shard_bytes``, ``token_ratio`` and
    ``ratio_origin`` for token mode (units in the comments below); ``order``, the sample
    order a migrated run kept for it (``None``: the source's seed and the dataset's position).
    """

    name: str
    shard_ids: np.ndarray  # int64, ascending, unique, read-only
    shard_counts: np.ndarray  # int64 >= 0, aligned with shard_ids, read-only
    weight: float  # the user's weight, >= 0 (0: paused, in a phase of a curriculum), not normalised
    policy: str  # one of POLICIES
    max_repeats: int | None  # extra passes allowed after the first; None = unbounded
    reshuffle_on_repeat: bool  # False: every pass repeats pass 0's order
    block_size: int  # resolved mosaic block size; <= 1 means no block shuffle
    pass_tail: str = CARRY  # CARRY: a draw runs on into the next pass; DROP: skips the tail
    data_fingerprint: str | None = None  # the dataset's content fingerprint (files), if any
    shard_bytes: np.ndarray | None = None  # int64 raw bytes per shard (token mode's cost model)
    token_ratio: float | None = None  # tokens per raw byte, once primed (token mode)
    ratio_origin: str | None = None  # one of ORIGINS once primed
    order: tuple[int, int, bool, bool] | None = None  # (seed, key id, shuffle_shards, shuffle_within_shard)
    # that key this dataset's pass order instead of the source's (its id is its position): a
    # migrated run keeps each dataset's order (zephon.work.migrate)
    total: int = field(init=False)  # samples in one pass
    _digest: str | None = field(init=False, default=None, repr=False)  # ``digest``, computed on first use

    def __post_init__(self) -> None:
        self._check()
        object.__setattr__(self, "shard_ids", read_only(self.shard_ids))
        object.__setattr__(self, "shard_counts", read_only(self.shard_counts))
        if self.shard_bytes is not None:
            object.__setattr__(self, "shard_bytes", read_only(self.shard_bytes))
        counts = self.shard_counts  # a short table sums faster in Python than through numpy
        object.__setattr__(self, "total", sum(counts.tolist()) if len(counts) <= 8 else int(counts.sum()))

    def _check(self) -> None:
        if not isinstance(self.name, str):
            raise _refuse_type("DatasetPlan", "name", self.name, "a str")
        owner = f"DatasetPlan({self.name!r})"
        _check_table(self.name, self.shard_ids, self.shard_counts, self.shard_bytes)
        if type(self.weight) is not float and (type(self.weight) is bool or not isinstance(self.weight, numbers.Real)):
            raise _refuse_type(owner, "weight", self.weight, "a float")
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"{owner}.weight must be finite and >= 0 (0 pauses it), got {self.weight!r}")
        _check_choice(owner, "policy", self.policy, POLICIES)
        _check_int(owner, "max_repeats", self.max_repeats, 0, optional=True)
        _check_bool(owner, "reshuffle_on_repeat", self.reshuffle_on_repeat)
        _check_int(owner, "block_size", self.block_size, 0)
        _check_choice(owner, "pass_tail", self.pass_tail, PASS_TAILS)
        if self.token_ratio is not None:
            if self.shard_bytes is None:
                raise ValueError(f"{owner}.token_ratio needs shard_bytes (the cost model is bytes x ratio)")
            if not (isinstance(self.token_ratio, numbers.Real) and math.isfinite(self.token_ratio)
                    and self.token_ratio > 0):
                raise ValueError(f"{owner}.token_ratio must be a finite float > 0, got {self.token_ratio!r}")
            _check_choice(owner, "ratio_origin", self.ratio_origin, ORIGINS)
        if self.order is not None and not (
                isinstance(self.order, tuple) and len(self.order) == 4
                and all(type(v) is t for v, t in zip(self.order, (int, int, bool, bool))) and self.order[1] >= 0):
            raise ValueError(f"{owner}.order must be None or (seed, key id >= 0, shuffle_shards, "
                             f"shuffle_within_shard), got {self.order!r}")

    @property
    def digest(self) -> str:
        """sha256 (16 hex digits) of the shard ids and counts, computed on first use (a
        deterministic cache of the fields, for the checkpoint fingerprint)."""
        if self._digest is None:
            object.__setattr__(self, "_digest", shard_digest(self.shard_ids, self.shard_counts))
        assert self._digest is not None
        return self._digest

    def _scalars(self) -> tuple[Any, ...]:
        """Everything but the arrays: cheap to hash and compare."""
        return (self.name, self.total, len(self.shard_ids), self.weight, self.policy, self.max_repeats,
                self.reshuffle_on_repeat, self.block_size, self.pass_tail, self.data_fingerprint, self.token_ratio,
                self.ratio_origin, self.shard_bytes is None, self.order)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, DatasetPlan) and self._scalars() == other._scalars() and all(
            a is b or (a is not None and b is not None and np.array_equal(a, b))
            for a, b in ((self.shard_ids, other.shard_ids), (self.shard_counts, other.shard_counts),
                         (self.shard_bytes, other.shard_bytes)))

    def __hash__(self) -> int:
        return hash(self._scalars())  # the arrays are compared only when two plans must be told apart


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceConfig:
    """Everything a mixture source's stream depends on, including the lane binding.

    A value: frozen, compared by value, hashable (its derived tables are found by value in
    :mod:`zephon.core.cache`). The constructor refuses types and ranges the kernels cannot run.

    Fields: ``datasets`` (one :class:`DatasetPlan` each), ``chunk_size``, ``seed``,
    ``shuffle_shards``, ``shuffle_within_shard``, ``stop_after_passes``,
    ``lane_assignment`` and ``allocator`` as resolved from the source's arguments;
    ``token_mode``; ``weight_order``, the mixture's order; ``lane`` and
    ``canonical_replicas``, the lane binding (``None`` for the template).
    """

    datasets: tuple[DatasetPlan, ...]
    chunk_size: int  # pointers per chunk, >= 1
    seed: int
    shuffle_shards: bool
    shuffle_within_shard: bool
    stop_after_passes: int | None  # N >= 1 or None
    lane_assignment: str  # a key of ROUTINGS: MODULO or PERMUTE
    allocator: Allocator
    token_mode: bool = False  # weights are token shares (zephon.core.tokens)
    weight_order: tuple[int, ...] = ()  # datasets in the mixture's insertion order; () = dataset order
    lane: int | None = None  # None: the template (whole stream)
    canonical_replicas: int | None = None
    normalised: tuple[float, ...] = field(init=False, repr=False, compare=False)  # w / Σ w (mixture order)
    chunk_key: int = field(init=False, repr=False, compare=False)  # root key of per-chunk read seeds
    lane_key: int = field(init=False, repr=False, compare=False)  # root key of lane routing
    # values derived once per config (the lanes for_lane makes share the table; see cache.fingerprint_json)
    derived: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check()
        total = 0.0
        for c in self.summing_order:
            total += self.datasets[c].weight
        object.__setattr__(self, "normalised", tuple(d.weight / total for d in self.datasets))
        object.__setattr__(self, "chunk_key", purpose_key(self.seed, DOMAIN_CHUNK_SEED))
        object.__setattr__(self, "lane_key", purpose_key(self.seed, DOMAIN_LANE))
        object.__setattr__(self, "derived", {})

    def __hash__(self) -> int:
        # Integers only: cheap for any number of datasets; equal configs agree on all of them.
        return hash((self.chunk_size, self.seed, len(self.datasets), self.lane, self.canonical_replicas))

    def _check(self) -> None:
        owner = "SourceConfig"
        if not isinstance(self.datasets, tuple) or not self.datasets or not all(
                isinstance(d, DatasetPlan) for d in self.datasets):
            raise _refuse_type(owner, "datasets", self.datasets, "a non-empty tuple of DatasetPlan")
        if not any(d.weight > 0 for d in self.datasets):
            raise ValueError(f"{owner}.datasets must give at least one dataset a weight > 0, got "
                             f"{[d.weight for d in self.datasets]}")
        _check_int(owner, "chunk_size", self.chunk_size, 1)
        _check_int(owner, "seed", self.seed)
        _check_bool(owner, "shuffle_shards", self.shuffle_shards)
        _check_bool(owner, "shuffle_within_shard", self.shuffle_within_shard)
        _check_int(owner, "stop_after_passes", self.stop_after_passes, 1, optional=True)
        _check_choice(owner, "lane_assignment", self.lane_assignment, tuple(ROUTINGS))
        if not isinstance(self.allocator, Allocator):
            raise _refuse_type(owner, "allocator", self.allocator, "an Allocator (zephon.core.alloc)")
        _check_bool(owner, "token_mode", self.token_mode)
        if self.weight_order and sorted(self.weight_order) != list(range(len(self.datasets))):
            raise ValueError(f"{owner}.weight_order must be () or a permutation of range({len(self.datasets)}), "
                             f"got {self.weight_order!r}")
        _check_binding(owner, self.lane, self.canonical_replicas)

    def for_lane(self, lane: int | None, replicas: int | None) -> SourceConfig:
        """This config as lane ``lane`` of ``replicas`` (both None: the template). Only the binding
        is checked: everything else was checked (and derived) when this config was made, and is
        carried over (``dataclasses.replace`` checks it all again: 75 µs)."""
        _check_binding("SourceConfig", lane, replicas)
        out = object.__new__(SourceConfig)
        for f in fields(self):
            object.__setattr__(out, f.name, getattr(self, f.name))
        object.__setattr__(out, "lane", lane)
        object.__setattr__(out, "canonical_replicas", replicas)
        return out

    def with_normalised(self, normalised: Sequence[float]) -> SourceConfig:
        """This config with the normalised weights a run recorded (its fingerprint's), bit for
        bit: normalising them again may move a last bit, and with it a rounding tie of the
        allocator, so the run's chunks would be planned otherwise."""
        if len(normalised) != len(self.datasets) or any((w > 0.0) != (d.weight > 0.0)
                                                        for w, d in zip(normalised, self.datasets)):
            raise ValueError(f"the recorded normalised weights {list(normalised)} do not fit the datasets' weights "
                             f"{[d.weight for d in self.datasets]}; the record is corrupted")
        out = replace(self)
        object.__setattr__(out, "normalised", tuple(float(w) for w in normalised))
        return out

    @property
    def primed(self) -> bool:
        """False only in token mode before every dataset has its tokens-per-byte ratio."""
        return not self.token_mode or all(d.token_ratio is not None for d in self.datasets)

    @property
    def routing(self) -> Routing:
        """The lane routing ``lane_assignment`` names."""
        return ROUTINGS[self.lane_assignment]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.datasets)

    @property
    def summing_order(self) -> tuple[int, ...]:
        """The order weights are summed in when normalised: the mixture's insertion order."""
        return self.weight_order or tuple(range(len(self.datasets)))

    @property
    def lane_binding(self) -> tuple[int, int]:
        """``(lane, R)``; the template reads the whole stream as lane 0 of 1."""
        if self.lane is None:
            return 0, 1
        assert self.canonical_replicas is not None  # set together with lane (checked at construction)
        return self.lane, self.canonical_replicas

    def fingerprint(self) -> dict[str, Any]:
        """JSON summary of every setting that shapes the stream (lane binding excluded).

        It records what determines the stream, not how it was spelled: the normalised weights
        in dataset order (``{"web": 70, "code": 30}`` is ``{"code": 0.3, "web": 0.7}``), and the
        mixture order only where it can change a sum (three or more datasets, one of which
        redistributes: renormalising over the survivors sums in that order).
        """
        order_matters = len(self.datasets) > 2 and any(d.policy == REDISTRIBUTE for d in self.datasets)
        return {
            "datasets": [
                {"name": d.name, "shards": d.digest, "total": d.total, "data": d.data_fingerprint}
                for d in self.datasets
            ],
            "mode": "tokens" if self.token_mode else "samples",
            "weights": list(self.normalised),
            "mixture_order": [self.datasets[c].name for c in self.summing_order] if order_matters else None,
            "chunk_size": self.chunk_size,
            "seed": self.seed,
            "shuffle_shards": self.shuffle_shards,
            "shuffle_within_shard": self.shuffle_within_shard,
            "block_sizes": [d.block_size for d in self.datasets],
            "policies": [d.policy for d in self.datasets],
            "max_repeats": [d.max_repeats for d in self.datasets],
            "reshuffle_on_repeat": [d.reshuffle_on_repeat for d in self.datasets],
            "pass_tail": [d.pass_tail for d in self.datasets],
            "stop_after_passes": self.stop_after_passes,
            "lane_assignment": self.lane_assignment,
            "allocation": self.allocator.name,
            **({"orders": [None if d.order is None else list(d.order) for d in self.datasets]}
               if any(d.order is not None for d in self.datasets) else {}),
        }
