"""The resolved, validated configuration of a mixture source: frozen, shared by its lanes.

Everything the user chose is expanded here once (weights as given, per-dataset policies,
resolved block sizes, shard tables as read-only int64 arrays); the core reads it and never
changes it. Validation of user input lives in the shell (``zephon.work``); these types only
assert the invariants the kernels rely on.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon._ext.schedule import Scheduler
from zephon.core.alloc import BUILT_IN, Allocator
from zephon.core.keys import DOMAIN_CHUNK_SEED, DOMAIN_LANE, purpose_key

COST_UNITS = 16  # a draw's cost is counted in 1/16 tokens (zephon.core.tokens)
MAX_COST = 2**24  # cost units: 2**20 tokens, the most one draw is priced at


def shard_costs(shard_counts: np.ndarray, shard_bytes: np.ndarray, ratio: float) -> np.ndarray:
    """Estimated tokens of one draw from each shard, ``max(1, bytes per row × ratio)``, as int64
    cost units (``COST_UNITS`` per token, rounded, at most ``MAX_COST``): integers keep token
    deficits exact."""
    rows = np.maximum(shard_counts, 1).astype(np.float64)
    tokens = np.maximum(1.0, shard_bytes / rows * ratio)
    costs = np.minimum(np.rint(tokens * COST_UNITS), MAX_COST).astype(np.int64)
    costs.flags.writeable = False
    return costs


_DIGEST = "shard digest"  # key of a plan's memo (``DatasetPlan.layouts``)
STOP, REPEAT, REDISTRIBUTE = "stop", "repeat", "redistribute"
POLICIES = (STOP, REPEAT, REDISTRIBUTE)
CARRY, DROP = "carry", "drop"
PASS_TAILS = (CARRY, DROP)  # what a repeating dataset does with a pass's tail shorter than its quota
MODULO, PERMUTE = "modulo", "permute"
KERNEL_ALLOCATORS = ("accumulator", "fixed")  # the scheduling kernel's allocator codes


def _read_only(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == np.int64 and not values.flags.writeable \
            and values.flags.c_contiguous:
        return values  # a dataset's table: already frozen
    array = np.ascontiguousarray(values, dtype=np.int64)
    array.flags.writeable = False
    return array


def shard_digest(shard_ids: np.ndarray, shard_counts: np.ndarray) -> str:
    """sha256 (16 hex digits) of a shard table: ids and counts as int64."""
    digest = hashlib.sha256(_read_only(shard_ids).tobytes())
    digest.update(_read_only(shard_counts).tobytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DatasetPlan:
    """One dataset as the scheduler sees it: its shard table and its resolved settings.

    Compared by identity: plans hold arrays and a layout cache and are shared by clones.
    """

    name: str
    shard_ids: np.ndarray  # int64, ascending, unique, read-only
    shard_counts: np.ndarray  # int64 >= 0, aligned with shard_ids, read-only
    weight: float  # the user's weight, > 0, not normalised
    policy: str  # one of POLICIES
    max_repeats: int | None  # extra passes allowed after the first; None = unbounded
    reshuffle_on_repeat: bool  # False: every pass repeats pass 0's order
    block_size: int  # resolved mosaic block size; <= 1 means no block shuffle
    pass_tail: str = CARRY  # CARRY: a draw runs on into the next pass; DROP: skips the tail
    data_fingerprint: str | None = None  # the dataset's content fingerprint (files), if any
    shard_bytes: np.ndarray | None = None  # int64 raw bytes per shard (token mode's cost model)
    token_ratio: float | None = None  # tokens per raw byte, once primed (token mode)
    ratio_origin: str | None = None  # "measured", "pinned" or "fallback"
    order: tuple[int, int, bool, bool] | None = None  # (seed, key id, shuffle_shards, shuffle_within_shard)
    # that key this dataset's pass order instead of the source's (its id is its position): a
    # migrated run keeps each dataset's order (zephon.work.migrate)
    costs: np.ndarray | None = field(init=False, repr=False)  # int64 cost units per draw per shard
    total: int = field(init=False)  # samples in one pass
    layouts: dict = field(init=False, repr=False)  # the cursor's per-dataset memo (core.cursor)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_ids", _read_only(self.shard_ids))
        object.__setattr__(self, "shard_counts", _read_only(self.shard_counts))
        if self.shard_bytes is not None:
            object.__setattr__(self, "shard_bytes", _read_only(self.shard_bytes))
        counts = self.shard_counts  # a short table sums faster in Python than through numpy
        object.__setattr__(self, "total", sum(counts.tolist()) if len(counts) <= 8 else int(counts.sum()))
        costs = None
        if self.token_ratio is not None:
            costs = shard_costs(self.shard_counts, self.shard_bytes, self.token_ratio)
        object.__setattr__(self, "costs", costs)
        object.__setattr__(self, "layouts", {})

    @property
    def digest(self) -> str:
        """sha256 (16 hex digits) of the shard ids and counts, computed on first use."""
        digest = self.layouts.get(_DIGEST)
        if digest is None:
            digest = self.layouts[_DIGEST] = shard_digest(self.shard_ids, self.shard_counts)
        return digest


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class SourceConfig:
    """Everything a mixture source's stream depends on, including the lane binding."""

    datasets: tuple[DatasetPlan, ...]
    chunk_size: int  # pointers per chunk, >= 1
    seed: int
    shuffle_shards: bool
    shuffle_within_shard: bool
    stop_after_passes: int | None  # N >= 1 or None
    lane_assignment: str  # MODULO or PERMUTE
    allocator: Allocator
    token_mode: bool = False  # weights are token shares (zephon.core.tokens)
    weight_order: tuple[int, ...] = ()  # datasets in the mixture's insertion order; () = dataset order
    lane: int | None = None  # None: the template (whole stream)
    canonical_replicas: int | None = None
    normalised: tuple[float, ...] = field(init=False, repr=False)  # w / Σ w (summed in mixture order)
    chunk_key: int = field(init=False, repr=False)  # root key of per-chunk read seeds
    lane_key: int = field(init=False, repr=False)  # root key of lane routing
    scheduler: Scheduler | None = field(init=False, repr=False)  # the kernel; None for a fork's allocator

    def __post_init__(self) -> None:
        total = 0.0
        for c in self.summing_order:
            total += self.datasets[c].weight
        object.__setattr__(self, "normalised", tuple(d.weight / total for d in self.datasets))
        object.__setattr__(self, "chunk_key", purpose_key(self.seed, DOMAIN_CHUNK_SEED))
        object.__setattr__(self, "lane_key", purpose_key(self.seed, DOMAIN_LANE))
        object.__setattr__(self, "scheduler", self._make_scheduler())

    @property
    def primed(self) -> bool:
        """False only in token mode before every dataset has its tokens-per-byte ratio."""
        return not self.token_mode or all(d.token_ratio is not None for d in self.datasets)

    def _make_scheduler(self) -> Scheduler | None:
        if self.token_mode or self.allocator.name not in KERNEL_ALLOCATORS or BUILT_IN[self.allocator.name] is not self.allocator:
            return None
        lane, replicas = self.lane_binding
        return Scheduler(
            KERNEL_ALLOCATORS.index(self.allocator.name),
            np.array(self.normalised, dtype=np.float64),
            _read_only([d.total for d in self.datasets]),
            _read_only([POLICIES.index(d.policy) for d in self.datasets]),
            _read_only([-1 if d.max_repeats is None else d.max_repeats for d in self.datasets]),
            _read_only([d.pass_tail == CARRY for d in self.datasets]),
            _read_only(self.summing_order), self.stop_after_passes or 0, self.chunk_size, lane, replicas,
            self.lane_assignment != MODULO, self.lane_key,
        )

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
