"""A dataset cursor is arithmetic: the pointer at position ``p`` of pass ``e`` of a dataset.

For pass ``e`` (keys use ``e``, or 0 without ``reshuffle_on_repeat``)::

    p ──block mosaic──► q = block_start + perm_block(p − block_start)   (if block_size > 1)
    q ──shard lookup──► (k, r): k-th non-empty shard in this pass's shard order, row r
    r ──within shard──► offset = perm_shard(r)                          (if within-shard)

``pointer_reference`` is the readable definition; ``take`` writes many pointers with the
cursor kernel from an :class:`EpochLayout` (the O(#shards) per-pass tables, cached per
dataset, never O(#samples)).

**Compatibility**: the key paths below are frozen; they define sample order.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from zephon._ext import cursor as _kernel
from zephon.core.config import DatasetPlan, SourceConfig
from zephon.core.keys import DOMAIN_BLOCK, DOMAIN_SHARD_ORDER, DOMAIN_WITHIN_SHARD, derive, purpose_key
from zephon.core.perm import perm_range, perm_reference

_CACHED_LAYOUTS = 2  # per dataset: the pass being read and the next one


def _level_key(config: SourceConfig, dataset_id: int, domain: int, epoch: int) -> int:
    plan = config.datasets[dataset_id]
    return purpose_key(config.seed, domain, dataset_id, epoch if plan.reshuffle_on_repeat else 0)


def pointer_reference(config: SourceConfig, dataset_id: int, epoch: int, p: int) -> tuple[int, int, int]:
    """The pointer at position ``p`` of pass ``epoch`` of a dataset (pure; slow; the definition)."""
    plan = config.datasets[dataset_id]
    shards = len(plan.shard_ids)
    order_key = _level_key(config, dataset_id, DOMAIN_SHARD_ORDER, epoch)
    order = [perm_reference(order_key, shards, k) if config.shuffle_shards else k for k in range(shards)]
    q = p
    if plan.block_size > 1:
        block, start = p // plan.block_size, p - p % plan.block_size
        length = min(plan.block_size, plan.total - start)
        q = start + perm_reference(derive(_level_key(config, dataset_id, DOMAIN_BLOCK, epoch), block), length, p - start)
    ends = np.cumsum(plan.shard_counts[order]).tolist() if shards else []
    k = bisect.bisect_right(ends, q)
    row = q - (ends[k - 1] if k else 0)
    shard_id = int(plan.shard_ids[order[k]])
    if config.shuffle_within_shard:
        key = derive(_level_key(config, dataset_id, DOMAIN_WITHIN_SHARD, epoch), shard_id)
        row = perm_reference(key, int(plan.shard_counts[order[k]]), row)
    return dataset_id, shard_id, row


@dataclass(frozen=True, slots=True)
class EpochLayout:
    """The O(#shards) tables of one pass of one dataset, as the cursor kernel reads them."""

    ordered_ids: np.ndarray  # int64: shard ids in this pass's order
    cum_end: np.ndarray  # int64: cumulative row counts in that order
    within_keys: np.ndarray  # uint64 per ordered shard; empty without within-shard shuffle
    block_key: int  # level key of the block mosaic


def epoch_layout(config: SourceConfig, dataset_id: int, epoch: int) -> EpochLayout:
    """The layout of pass ``epoch``, memoised on the dataset plan (a pure function of its inputs)."""
    plan = config.datasets[dataset_id]
    cache_key = (config.seed, dataset_id, config.shuffle_shards, config.shuffle_within_shard,
                 epoch if plan.reshuffle_on_repeat else 0)
    layout = plan.layouts.get(cache_key)
    if layout is None:
        layout = _build_layout(config, plan, dataset_id, epoch)
        while len(plan.layouts) >= _CACHED_LAYOUTS:
            plan.layouts.pop(next(iter(plan.layouts)))
        plan.layouts[cache_key] = layout
    return layout


def _build_layout(config: SourceConfig, plan: DatasetPlan, dataset_id: int, epoch: int) -> EpochLayout:
    shards = len(plan.shard_ids)
    if config.shuffle_shards:
        order = perm_range(_level_key(config, dataset_id, DOMAIN_SHARD_ORDER, epoch), shards, 0, shards)
    else:
        order = np.arange(shards, dtype=np.int64)
    ordered_ids = np.ascontiguousarray(plan.shard_ids[order])
    within_keys = np.empty(0, dtype=np.uint64)
    if config.shuffle_within_shard:
        within_keys = _kernel.derive_many(_level_key(config, dataset_id, DOMAIN_WITHIN_SHARD, epoch), ordered_ids)
    return EpochLayout(
        ordered_ids=ordered_ids,
        cum_end=np.cumsum(plan.shard_counts[order], dtype=np.int64),
        within_keys=within_keys,
        block_key=_level_key(config, dataset_id, DOMAIN_BLOCK, epoch),
    )


def take(out: np.ndarray, row: int, config: SourceConfig, dataset_id: int, epoch: int, position: int, count: int) -> None:
    """Write the pointers at positions ``[position, position + count)`` of a pass into ``out[row:]``."""
    plan = config.datasets[dataset_id]
    layout = epoch_layout(config, dataset_id, epoch)
    _kernel.take(out, row, dataset_id, position, count, layout.ordered_ids, layout.cum_end,
                 layout.within_keys, plan.block_size, layout.block_key, plan.total)
