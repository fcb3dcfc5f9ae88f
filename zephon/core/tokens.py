"""Token-aware mixtures: weights describe shares of tokens, not of samples.

Each dataset has a measured or pinned *tokens per raw byte* ratio; a draw from a shard costs
``max(1, bytes_per_row(shard) × ratio)`` estimated tokens (``config.shard_costs``). A chunk is drawn
sample by sample: the active dataset with the largest token deficit gives the next sample,
then every active deficit grows by ``(weight − [drawn]) × cost`` of that sample: by
``weight × cost``, less the whole cost for the drawn dataset (``draw_reference``; the kernel is
``_ext/tokens.pyx``).

The arithmetic is exact: costs are integer units of 1/16 token (``COST_UNITS``, at most
``MAX_COST``) and the active weights integer units summing to ``WEIGHT_SCALE`` (largest
remainder, every active dataset at least one unit), so deficits are int64 that sum to 0 and
stay within ``deficit_bound``; they never depend on floating-point rounding. Passes,
caps, ``stop_after_passes`` and END follow the exhaustion rules of sample mode: under
``pass_tail="carry"`` a dataset's draws run on into its next pass, each priced by the sample it
takes, and the stream ends when a capped dataset would run past its last allowed pass; under
``"drop"`` a dataset that runs out of its pass during a chunk starts its next pass (the unread
tail is skipped) and the chunk is drawn again from the deficits saved at its start; a
redistributing dataset that runs dry ends the chunk short.

A draw's cost depends only on its shard, so planning prices each dataset's candidate samples
by runs of equal shard from the cursor (``cursor.shard_runs``) and computes no pointers: O(shards
touched) per chunk without a block mosaic, O(candidates) with one. Chunks of other lanes cost
the same planning and nothing more.
"""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache
from itertools import accumulate
from typing import Callable, Sequence, cast

import numpy as np

from zephon._ext import tokens as _kernel
from zephon.core import cache
from zephon.core.config import CARRY, COST_UNITS, MAX_COST, REDISTRIBUTE, REPEAT, STOP, DatasetPlan, SourceConfig
from zephon.core.cursor import shard_runs
from zephon.core.schedule import (
    ChunkPlan,
    CursorState,
    Ended,
    Planned,
    SourceState,
    active_weights,
    advance,
    draw_start,
    passes_done,
    start_next_pass,
    walk_to_lane,
)

_DONE = -1
WEIGHT_SCALE = 2**24  # active weight units (must match _ext/tokens.pyx); a draw moves a deficit < 2**48
MAX_DATASETS = 2**14  # keeps every deficit inside int64 (deficit_bound)


_MEAN_COST, _COST_OF_ID = "mean cost", "costs by id"  # keys of a plan's memo (``cache.plan_memo``)


def mean_cost(plan: DatasetPlan) -> float:
    """Average tokens of a draw over one pass (row-weighted over shards), memoised on the plan."""
    memo = cache.plan_memo(plan)
    cost = memo.get(_MEAN_COST)
    if cost is None:
        rows = plan.shard_counts.astype(np.float64)  # int64 products could wrap
        cost = float((rows * cache.costs(plan)).sum() / plan.total / COST_UNITS) if plan.total else 1.0
        memo[_MEAN_COST] = cost
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


@lru_cache(maxsize=64)
def weight_units(weights: tuple[float, ...]) -> tuple[int, ...]:
    """Active weights (summing to 1) as ints summing to ``WEIGHT_SCALE``: one unit per active
    dataset, and the rest apportioned by largest remainder (ties to the earlier dataset)."""
    active = [c for c, w in enumerate(weights) if w > 0.0]
    spare = WEIGHT_SCALE - len(active)
    units = [1 + math.floor(w * spare) if w > 0.0 else 0 for w in weights]
    left = WEIGHT_SCALE - sum(units)
    if not 0 <= left <= len(active):
        raise ValueError(f"weight_units: weights={weights!r} must be >= 0 and sum to 1 over the active datasets")
    by_remainder = sorted(active, key=lambda c: (units[c] - 1 - weights[c] * spare, c))
    for c in by_remainder[:left]:
        units[c] += 1
    return tuple(units)


def deficit_bound(n: int) -> int:
    """No token deficit leaves ``[-bound, bound]``: deficits sum to 0, a deficit falls only when
    it is the largest (so at least 0) and by less than ``WEIGHT_SCALE × MAX_COST``."""
    return n * WEIGHT_SCALE * MAX_COST


def draw_reference(deficits: list[int], weights: Sequence[int], costs: Sequence[Sequence[int]],
                   available: Sequence[int], drawn: list[int], target: int) -> int:
    """The per-draw loop (the kernel's definition); ``deficits`` and ``drawn`` change in place.

    ``weights`` are ``weight_units``; ``costs[c][j]`` is the cost (in units) of dataset c's
    j-th draw of the chunk, known for ``j < available[c]``. Returns -1 when ``sum(drawn) ==
    target``, else the dataset whose next cost is missing.
    """
    while sum(drawn) < target:
        best = max((c for c in range(len(weights)) if weights[c] > 0), key=lambda c: (deficits[c], -c))
        if drawn[best] == available[best]:
            return best
        cost = costs[best][drawn[best]]
        for c in range(len(weights)):
            if weights[c] > 0:
                deficits[c] += (weights[c] - (WEIGHT_SCALE if c == best else 0)) * cost
        drawn[best] += 1
    return _DONE


def _cost_of_shard_id(plan: DatasetPlan) -> Callable[[np.ndarray], np.ndarray]:
    """Shard ids → draw costs: a direct table when ids are dense (the usual case), else a search."""
    memo = cache.plan_memo(plan)
    lookup = memo.get(_COST_OF_ID)
    if lookup is None:
        top = int(plan.shard_ids[-1]) if len(plan.shard_ids) else 0
        shard_costs = cache.costs(plan)
        if top < 4 * len(plan.shard_ids) + 1024:
            table = np.zeros(top + 1, dtype=np.int64)
            table[plan.shard_ids] = shard_costs
            lookup = table.take
        else:
            lookup = lambda ids: shard_costs[np.searchsorted(plan.shard_ids, ids)]
        memo[_COST_OF_ID] = lookup
    return lookup


class _Runs:
    """Cost runs of the draws one chunk may take from each dataset, extended on demand.

    Dataset c's candidates are the samples its draw would take next (``draw_start``), as many as
    it can still give: the rest of its pass, or under "carry" on into its next passes up to its
    last allowed one; a run is a stretch of them in one shard, so it has one cost
    (``cursor.shard_runs``: no pointers). ``ends[c]`` and
    ``costs[c]`` list the runs' cumulative ends (in draws) and costs.
    """

    def __init__(self, config: SourceConfig, cursors: list[CursorState], weights: Sequence[float]):
        self.config, self.cursors = config, cursors
        n = len(cursors)
        self.available = [0] * n
        self.ends, self.costs = [_NONE] * n, [_NONE] * n
        for c, share in enumerate(token_shares(config.datasets)):
            if weights[c] > 0:
                self.add(c, min(self.remaining(c), int(1.25 * share * config.chunk_size) + 64))

    def remaining(self, c: int) -> int:
        """Samples ``c`` can still give this chunk (a chunk never draws more than its size)."""
        d, cursor = self.config.datasets[c], self.cursors[c]
        if d.pass_tail != CARRY or d.policy != REPEAT:
            return d.total - cursor.position
        if d.max_repeats is None:
            return self.config.chunk_size if d.total else 0
        return (d.max_repeats + 1) * d.total - cursor.epoch * d.total - cursor.position

    def add(self, c: int, count: int) -> None:
        """Append the runs of dataset ``c``'s next ``count`` candidates."""
        if count <= 0:
            return
        start, have = draw_start(self.config.datasets[c], self.cursors[c]), self.available[c]
        ends, ids = shard_runs(self.config, c, start.epoch, start.position + have, count)
        costs = _cost_of_shard_id(self.config.datasets[c])(ids)
        self.ends[c] = np.concatenate([self.ends[c], ends + have]) if have else ends
        self.costs[c] = np.concatenate([self.costs[c], costs]) if have else costs
        self.available[c] = have + count

    def extend(self, c: int) -> bool:
        """More candidates for ``c`` (doubling); False if it has none left (``remaining``)."""
        have = self.available[c]
        self.add(c, min(self.remaining(c), max(2 * have, have + 64)) - have)
        return self.available[c] > have

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ends, costs, first)`` as the kernel reads them: every dataset's runs back to back,
        dataset c's from ``first[c]`` to ``first[c + 1]``."""
        first = np.array([0, *accumulate(len(e) for e in self.ends)], dtype=np.int64)
        return np.concatenate(self.ends), np.concatenate(self.costs), first


_NONE = np.zeros(0, dtype=np.int64)


def plan_token_chunk(config: SourceConfig, deficits: tuple[int, ...], cursors: tuple[CursorState, ...]) -> ChunkPlan | Ended:
    """Plan one global chunk in token mode: ``(quotas, starts, weights, deficits', cursors')`` or ``Ended``."""
    weights = active_weights(config, cursors)
    if not any(weights):
        return Ended(-1, None)
    if config.stop_after_passes is not None and passes_done(config, list(cursors)):
        return Ended(-1, None)
    saved = list(deficits)
    if any(w == 0.0 and d != 0 for w, d in zip(weights, saved)):
        saved = [0] * len(saved)
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
    return quotas, tuple(now), weights, new_deficits, advance(config, now, quotas)


def _draw_chunk(config: SourceConfig, saved: list[int], weights: Sequence[float],
                now: list[CursorState]) -> tuple[tuple[int, ...], tuple[int, ...]] | Ended | int:
    """Draw one chunk from ``now``: ``(quotas, deficits)``, ``Ended``, or a repeating dataset that ran out."""
    deficits = np.array(saved, dtype=np.int64)
    drawn = np.zeros(len(now), dtype=np.int64)
    runs = _Runs(config, now, weights)
    w = np.array(weight_units(weights), dtype=np.int64)
    while True:
        c = _kernel.draw(deficits, w, *runs.tables(), drawn, config.chunk_size)
        if c == _DONE:
            return tuple(drawn.tolist()), tuple(deficits.tolist())
        if runs.extend(c):
            continue
        plan = config.datasets[c]
        if plan.policy == STOP or (plan.policy == REPEAT and plan.pass_tail == CARRY):
            return Ended(-1, c)
        if plan.policy == REDISTRIBUTE:
            return tuple(drawn.tolist()), tuple(deficits.tolist())
        return c


def plan_token_chunk_once(config: SourceConfig, deficits: tuple[int, ...], cursors: tuple[CursorState, ...]
                          ) -> ChunkPlan | Ended:
    """:func:`plan_token_chunk`, remembered for the last state it was asked (on the config): a
    chunk's ``source_exhausted`` plans the chunk after it, which the next step plans again."""
    key, last = config.derived.get(_LAST_PLAN, (None, None))
    if key == (deficits, cursors):
        return cast("ChunkPlan | Ended", last)
    planned = plan_token_chunk(config, deficits, cursors)
    config.derived[_LAST_PLAN] = ((deficits, cursors), planned)
    return planned


_LAST_PLAN = "last token plan"


def plan_next_tokens(state: SourceState, config: SourceConfig) -> Planned | Ended:
    """Walk the token-mode schedule from ``state`` to the lane's next chunk (pure)."""
    return walk_to_lane(state, config, plan_token_chunk_once)
