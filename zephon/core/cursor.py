"""A dataset cursor is arithmetic: the pointer at position ``p`` of pass ``e`` of a dataset.

For pass ``e`` (keys use ``e``, or 0 without ``reshuffle_on_repeat``)::

    p ──block mosaic──► q = block_start + perm_block(p − block_start)   (if block_size > 1)
    q ──shard lookup──► (k, r): k-th non-empty shard in this pass's shard order, row r
    r ──within shard──► offset = perm_shard(r)                          (if within-shard)

``pointer_reference`` is the readable definition. A dataset's stream is its passes back to
back: a position past the end of pass ``e`` continues in pass ``e + 1`` (``in_pass``), which
is how a ``pass_tail="carry"`` draw runs on across a pass boundary. ``take`` (a range of
positions, across passes) and ``take_at`` (any positions of one pass) write pointers, and
``shard_runs`` lists only the shards of a range (token mode prices draws by shard), with the
cursor kernel from a pass layout (``epoch_layout``), cached per dataset, never O(#samples):

* **uniform shards** — every shard has the same count ``u > 0`` except at most one, the odd
  shard, of any count (0 included): the layout is O(1). Order position ``k`` holds shard
  index ``perm(order_key, S, k)``, the odd shard sits at ``perm⁻¹(order_key, S, odd)``, the
  shard of a position is arithmetic around it, and a shard's within key is derived when
  needed. Detected once per dataset (``_shape``).
* **other shard tables** — the O(#shards) tables of the pass: ids in pass order,
  cumulative counts and within keys, searched by binary search.

A pass's three level keys are ``derive(prefix, e)``; the prefixes
``purpose_key(seed, domain, dataset_id)`` are computed once per dataset (``_table``).

**Compatibility**: the key paths below are frozen; they define sample order.
"""
from __future__ import annotations

import bisect

import numpy as np

from zephon._ext import cursor as _kernel
from zephon._ext.layout import PassLayout, ShardTable
from zephon.core.cache import plan_memo
from zephon.core.config import DatasetPlan, SourceConfig
from zephon.core.keys import DOMAIN_BLOCK, DOMAIN_SHARD_ORDER, DOMAIN_WITHIN_SHARD, derive, purpose_key
from zephon.core.perm import perm_reference

_CACHED_LAYOUTS = 2  # per dataset and seed: the pass being read and the next one
_SHAPE, _PASSES = "shape", "passes"  # keys of a plan's memo (``cache.plan_memo``)


def order_of(config: SourceConfig, dataset_id: int) -> tuple[int, int, bool, bool]:
    """``(seed, key id, shuffle_shards, shuffle_within_shard)`` that key a dataset's pass order:
    the source's settings and the dataset's position, unless a migration kept older ones."""
    plan = config.datasets[dataset_id]
    if plan.order is not None:
        return plan.order
    return config.seed, dataset_id, config.shuffle_shards, config.shuffle_within_shard


def _level_key(config: SourceConfig, dataset_id: int, domain: int, epoch: int) -> int:
    plan = config.datasets[dataset_id]
    seed, key_id, _, _ = order_of(config, dataset_id)
    return purpose_key(seed, domain, key_id, epoch if plan.reshuffle_on_repeat else 0)


def in_pass(plan: DatasetPlan, epoch: int, position: int) -> tuple[int, int]:
    """``(epoch', position')`` naming the same sample with ``position'`` inside its pass: a
    position past the end of a pass continues in the next ones."""
    if position < plan.total:
        return epoch, position
    passes, position = divmod(position, plan.total)
    return epoch + passes, position


def pointer_reference(config: SourceConfig, dataset_id: int, epoch: int, p: int) -> tuple[int, int, int]:
    """The pointer at position ``p`` of pass ``epoch`` of a dataset (pure; slow; the definition).

    ``p`` may lie past the end of the pass: it continues in the next passes (``in_pass``).
    """
    plan = config.datasets[dataset_id]
    epoch, p = in_pass(plan, epoch, p)
    shards = len(plan.shard_ids)
    order_key = _level_key(config, dataset_id, DOMAIN_SHARD_ORDER, epoch)
    _, _, shuffle_shards, shuffle_within_shard = order_of(config, dataset_id)
    order = [perm_reference(order_key, shards, k) if shuffle_shards else k for k in range(shards)]
    q = p
    if plan.block_size > 1:
        block, start = p // plan.block_size, p - p % plan.block_size
        length = min(plan.block_size, plan.total - start)
        q = start + perm_reference(derive(_level_key(config, dataset_id, DOMAIN_BLOCK, epoch), block), length, p - start)
    ends = np.cumsum(plan.shard_counts[order]).tolist() if shards else []
    k = bisect.bisect_right(ends, q)
    row = q - (ends[k - 1] if k else 0)
    shard_id = int(plan.shard_ids[order[k]])
    if shuffle_within_shard:
        key = derive(_level_key(config, dataset_id, DOMAIN_WITHIN_SHARD, epoch), shard_id)
        row = perm_reference(key, int(plan.shard_counts[order[k]]), row)
    return dataset_id, shard_id, row


def _shape(plan: DatasetPlan) -> tuple[int, int, int]:
    """``(u, odd, t)``: every shard has ``u > 0`` rows except shard index ``odd`` (-1: none),
    which has ``t``; ``(0, -1, 0)`` if the shard table is not of that form. Memoised on the plan.
    """
    memo = plan_memo(plan)
    shape = memo.get(_SHAPE)
    if shape is None:
        shape = _detect_shape(plan.shard_counts)
        memo[_SHAPE] = shape
    return shape


def _detect_shape(counts: np.ndarray) -> tuple[int, int, int]:
    for u in (int(counts[0]), int(counts[-1])) if len(counts) else ():
        if u > 0:
            odd = np.flatnonzero(counts != u)
            if len(odd) <= 1:
                return (u, -1, 0) if len(odd) == 0 else (u, int(odd[0]), int(counts[odd[0]]))
    return 0, -1, 0


def _table(config: SourceConfig, dataset_id: int) -> ShardTable:
    """The kernel's view of a dataset under ``config``'s seed and shuffles, memoised on the plan."""
    plan = config.datasets[dataset_id]
    key = order_of(config, dataset_id)
    memo = plan_memo(plan)
    table = memo.get(key)
    if table is None:
        u, odd, t = _shape(plan)
        seed, key_id, shuffle_shards, shuffle_within_shard = key
        order, within, block = (purpose_key(seed, domain, key_id)
                                for domain in (DOMAIN_SHARD_ORDER, DOMAIN_WITHIN_SHARD, DOMAIN_BLOCK))
        table = ShardTable(plan.shard_ids, plan.shard_counts, u, odd, t, shuffle_shards,
                           shuffle_within_shard, order, within, block, plan.block_size)
        memo[key] = table
    return table


def epoch_layout(config: SourceConfig, dataset_id: int, epoch: int) -> PassLayout:
    """The kernel layout of pass ``epoch`` (a pure function of its inputs), memoised on the plan.

    O(1) for uniform shards, O(#shards) otherwise; the plan keeps the last two per seed and
    shuffle settings.
    """
    plan = config.datasets[dataset_id]
    key = (*order_of(config, dataset_id), epoch if plan.reshuffle_on_repeat else 0)
    passes: dict[tuple[int, ...], PassLayout] = plan_memo(plan).setdefault(_PASSES, {})
    layout = passes.get(key)
    if layout is None:
        layout = _table(config, dataset_id).layout(key[-1])
        while len(passes) >= _CACHED_LAYOUTS:
            passes.pop(next(iter(passes)), None)
        passes[key] = layout
    return layout


def take(out: np.ndarray, row: int, config: SourceConfig, dataset_id: int, epoch: int, position: int, count: int) -> None:
    """Write the pointers at positions ``[position, position + count)`` of pass ``epoch`` into
    ``out[row:]``; positions past the end of the pass continue in the next ones (``in_pass``).
    The caller keeps ``position`` inside the pass or at its end."""
    head = config.datasets[dataset_id].total - position
    if count > head:  # a "carry" draw: the rest of this pass, then on from the next one's start
        take(out, row, config, dataset_id, epoch, position, head)
        take(out, row + head, config, dataset_id, epoch + 1, 0, count - head)
        return
    _kernel.take(out, row, dataset_id, epoch_layout(config, dataset_id, epoch), position, count)


def take_at(config: SourceConfig, dataset_id: int, epoch: int, positions: np.ndarray,
            out: np.ndarray | None = None) -> np.ndarray:
    """The pointers at ``positions`` (any order, repeats allowed) of pass ``epoch`` of a dataset.

    Returns an ``(m, 3)`` int64 array (``out`` if given, which must be C-contiguous int64 of
    that shape). Raises ``ValueError`` naming the first position outside ``[0, total)``.
    Pure apart from writing ``out``; ``out[j]`` is ``pointer_reference(config, dataset_id,
    epoch, positions[j])``.
    """
    positions = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
    if out is None:
        out = np.empty((len(positions), 3), dtype=np.int64)
    elif out.shape != (len(positions), 3) or out.dtype != np.int64 or not out.flags.c_contiguous:
        raise ValueError(f"take_at: out must be a C-contiguous int64 array of shape ({len(positions)}, 3), "
                         f"got {out.dtype} {out.shape}; pass np.empty((len(positions), 3), np.int64)")
    bad = _kernel.take_at(out, dataset_id, epoch_layout(config, dataset_id, epoch), positions)
    if bad >= 0:
        plan = config.datasets[dataset_id]
        raise ValueError(f"take_at: positions[{bad}] = {int(positions[bad])} is outside pass [0, {plan.total}) "
                         f"of dataset {plan.name!r}; pass positions inside the pass")
    return out


def shard_runs(config: SourceConfig, dataset_id: int, epoch: int, position: int, count: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(ends, ids)``: the shard ids of positions ``[position, position + count)`` of pass
    ``epoch`` as runs; positions past the end of the pass continue in the next ones.

    Run ``r`` covers offsets ``[ends[r-1], ends[r])`` from ``position`` (``ends[-1]`` = 0) and
    reads shard ``ids[r]``: the run-length encoding of ``pointer_reference(...)[1]`` over the
    range, except that a pass boundary always starts a new run (adjacent runs may then share an id).
    """
    plan, done = config.datasets[dataset_id], 0
    epoch, position = in_pass(plan, epoch, position)
    if position + count <= plan.total:
        return _kernel.shard_runs(epoch_layout(config, dataset_id, epoch), position, count)
    parts = []
    while done < count:
        part = min(count - done, plan.total - position)
        ends, ids = _kernel.shard_runs(epoch_layout(config, dataset_id, epoch), position, part)
        parts.append((ends + done, ids))
        done, epoch, position = done + part, epoch + 1, 0
    return np.concatenate([e for e, _ in parts]), np.concatenate([i for _, i in parts])
