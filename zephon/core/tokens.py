"""Token-aware mixtures: weights describe shares of tokens, not of samples.

Each dataset has a measured or pinned *tokens per raw byte* ratio; a draw from a shard costs
``max(1, bytes_per_row(shard) × ratio)`` estimated tokens (``config.shard_costs``). A chunk is drawn
sample by sample: the active dataset with the largest token deficit gives the next sample,
then every active deficit grows by ``weight × cost`` of that sample and the drawn dataset's
falls by its cost (``draw_reference``; the kernel is ``zephon/_ext/tokens.pyx``). Passes,
caps, ``stop_after_passes`` and END follow SPEC §4 as in sample mode: a dataset that runs out
of its pass during a chunk starts its next pass (dropping the unread tail) and the chunk is
drawn again from the deficits saved at its start; a redistributing dataset that runs dry ends
the chunk short.

Costs of the samples a chunk may draw come from the cursor (their shards), so planning a
chunk computes the candidate pointers of each dataset; chunks of other lanes cost the same
planning (their pointers are dropped).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from zephon._ext import tokens as _kernel
from zephon.core.config import REDISTRIBUTE, STOP, DatasetPlan, SourceConfig
from zephon.core.cursor import take
from zephon.core.schedule import (
    CursorState,
    Ended,
    Planned,
    SourceState,
    active_weights,
    passes_done,
    start_next_pass,
    walk_to_lane,
)

_DONE = -1


_MEAN_COST, _COST_OF_ID = "mean cost", "costs by id"  # keys of a plan's memo (``DatasetPlan.layouts``)


def mean_cost(plan: DatasetPlan) -> float:
    """Average cost of a draw over one pass (row-weighted over shards), memoised on the plan."""
    cost = plan.layouts.get(_MEAN_COST)
    if cost is None:
        cost = float((plan.shard_counts * plan.costs).sum() / plan.total) if plan.total else 1.0
        plan.layouts[_MEAN_COST] = cost
    return cost


def token_shares(plans: Sequence[DatasetPlan]) -> list[float]:
    """Sample shares that deliver the token weights on average: ``normalise(w / mean cost)``."""
    raw = [d.weight / mean_cost(d) for d in plans]
    return [r / math.fsum(raw) for r in raw]


def with_ratios(config: SourceConfig, ratios: dict[str, tuple[float, str]]) -> SourceConfig:
    """The config with these tokens-per-byte ratios (and their origins) set."""
    plans = tuple(
        dataclasses.replace(d, token_ratio=ratios[d.name][0], ratio_origin=ratios[d.name][1])
        if d.name in ratios else d
        for d in config.datasets
    )
    return dataclasses.replace(config, datasets=plans)


def draw_reference(deficits: list[float], weights: Sequence[float], costs: Sequence[Sequence[float]],
                   available: Sequence[int], drawn: list[int], target: int) -> int:
    """The per-draw loop (the kernel's definition); ``deficits`` and ``drawn`` change in place.

    Returns -1 when ``sum(drawn) == target``, else the dataset whose next cost is missing.
    """
    while sum(drawn) < target:
        best = max((c for c in range(len(weights)) if weights[c] > 0.0), key=lambda c: (deficits[c], -c))
        if drawn[best] == available[best]:
            return best
        cost = costs[best][drawn[best]]
        for c in range(len(weights)):
            if weights[c] > 0.0:
                deficits[c] = deficits[c] + weights[c] * cost
        deficits[best] = deficits[best] - cost
        drawn[best] += 1
    return _DONE


def _cost_of_shard_id(plan: DatasetPlan) -> Callable[[np.ndarray], np.ndarray]:
    """Shard ids → draw costs: a direct table when ids are dense (the usual case), else a search."""
    memo = plan.layouts.get(_COST_OF_ID)
    if memo is None:
        top = int(plan.shard_ids[-1]) if len(plan.shard_ids) else 0
        if top < 4 * len(plan.shard_ids) + 1024:
            table = np.zeros(top + 1)
            table[plan.shard_ids] = plan.costs
            memo = table.take
        else:
            memo = lambda ids: plan.costs[np.searchsorted(plan.shard_ids, ids)]
        plan.layouts[_COST_OF_ID] = memo
    return memo


def _candidate_costs(config: SourceConfig, c: int, cursor: CursorState, count: int) -> np.ndarray:
    """Costs of the next ``count`` samples of dataset ``c``'s pass from ``cursor``."""
    pointers = np.empty((count, 3), dtype=np.int64)
    take(pointers, 0, config, c, cursor.epoch, cursor.position, count)
    return _cost_of_shard_id(config.datasets[c])(pointers[:, 1])


class _Costs:
    """Cost buffers of one chunk's candidate draws, grown on demand (doubling)."""

    def __init__(self, config: SourceConfig, cursors: list[CursorState], weights: Sequence[float]):
        self.config, self.cursors = config, cursors
        shares = token_shares(config.datasets)
        n = len(cursors)
        self.available = np.zeros(n, dtype=np.int64)
        self.table = np.zeros((n, 0), dtype=np.float64)
        wanted = [min(self.remaining(c), int(1.25 * shares[c] * config.chunk_size) + 64) if weights[c] > 0 else 0
                  for c in range(n)]
        self.grow(wanted)

    def remaining(self, c: int) -> int:
        return self.config.datasets[c].total - self.cursors[c].position

    def grow(self, wanted: list[int]) -> None:
        width = max(self.table.shape[1], max(wanted))
        table = np.zeros((len(wanted), width), dtype=np.float64)
        table[:, :self.table.shape[1]] = self.table
        for c, count in enumerate(wanted):
            have = int(self.available[c])
            if count > have:
                ahead = CursorState(epoch=self.cursors[c].epoch, position=self.cursors[c].position + have)
                table[c, have:count] = _candidate_costs(self.config, c, ahead, count - have)
                self.available[c] = count
        self.table = table

    def extend(self, c: int) -> bool:
        """More candidates for ``c`` from its pass; False if its pass has none left."""
        have = int(self.available[c])
        if have >= self.remaining(c):
            return False
        wanted = [int(a) for a in self.available]
        wanted[c] = min(self.remaining(c), max(2 * have, have + 64))
        self.grow(wanted)
        return True


def plan_token_chunk(config: SourceConfig, deficits: tuple[float, ...], cursors: tuple[CursorState, ...]):
    """Plan one global chunk in token mode: ``(quotas, starts, weights, deficits', cursors')`` or ``Ended``."""
    weights = active_weights(config, cursors)
    if not any(weights):
        return Ended(-1, None)
    if config.stop_after_passes is not None and passes_done(config, list(cursors)):
        return Ended(-1, None)
    saved = list(deficits)
    if any(w == 0.0 and d != 0.0 for w, d in zip(weights, saved)):
        saved = [0.0] * len(saved)
    now = list(cursors)
    while True:
        outcome = _draw_chunk(config, saved, weights, now)
        if not isinstance(outcome, int):
            break
        ended = start_next_pass(config, now, outcome)
        if ended:
            return ended
    if isinstance(outcome, Ended):
        return outcome
    quotas, new_deficits = outcome
    after = tuple(CursorState(epoch=cur.epoch, position=cur.position + q) for cur, q in zip(now, quotas))
    return quotas, tuple(now), weights, new_deficits, after


def _draw_chunk(config: SourceConfig, saved: list[float], weights: Sequence[float], now: list[CursorState]):
    """Draw one chunk from ``now``: ``(quotas, deficits)``, ``Ended``, or a repeating dataset that ran out."""
    deficits = np.array(saved, dtype=np.float64)
    drawn = np.zeros(len(now), dtype=np.int64)
    costs = _Costs(config, now, weights)
    w = np.array(weights, dtype=np.float64)
    while True:
        c = _kernel.draw(deficits, w, costs.table, costs.available, drawn, config.chunk_size)
        if c == _DONE:
            return tuple(drawn.tolist()), tuple(deficits.tolist())
        if costs.extend(c):
            continue
        policy = config.datasets[c].policy
        if policy == STOP:
            return Ended(-1, c)
        if policy == REDISTRIBUTE:
            return tuple(drawn.tolist()), tuple(deficits.tolist())
        return c


def plan_next_tokens(state: SourceState, config: SourceConfig) -> Planned | Ended:
    """Walk the token-mode schedule from ``state`` to the lane's next chunk (pure)."""
    return walk_to_lane(state, config, plan_token_chunk)
