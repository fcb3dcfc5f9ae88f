"""A mixture's whole stream on numbers: quotas and cursors per global chunk, no pointers.

:func:`plan_stream` walks the template's schedule (the same planner ``next_chunk`` runs,
without writing pointers) and keeps, per global chunk, each dataset's quota and where its
cursor stands after the chunk; :func:`lane_owners` routes the chunks to ``R`` lanes. Preview
numbers and figures are read off these arrays.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from zephon.core import SourceConfig, initial_state
from zephon.core.config import MODULO
from zephon.core.schedule import Ended, lane_of, plan_next
from zephon.core.tokens import plan_next_tokens, token_shares
from zephon.io.progress import Progress


@dataclass(frozen=True)
class StreamPlan:
    """The planned stream: ``chunks`` global chunks of ``len(names)`` datasets."""

    names: tuple[str, ...]
    quotas: np.ndarray  # (chunks, datasets) int64: pointers per dataset per chunk
    passes: np.ndarray  # (chunks, datasets) float64: passes completed after the chunk (epoch + position / total)
    complete: bool  # False: the walk stopped at the cap, the stream goes on
    ended_by: str | None  # the dataset that ended the stream, None if it ended because all were done

    @property
    def chunks(self) -> int:
        return len(self.quotas)

    @property
    def samples(self) -> int:
        return int(self.quotas.sum())


def plan_stream(config: SourceConfig, max_chunks: int, expected: int | None = None,
                progress: bool | None = None) -> StreamPlan:
    """Plan the template's global chunks until the stream ends or ``max_chunks`` are planned.

    ``expected`` (chunks) sizes the progress bar, shown on a terminal when the walk is slow.
    """
    config = dataclasses.replace(config, lane=None, canonical_replicas=None)  # the whole stream
    planner = plan_next_tokens if config.token_mode else plan_next
    totals = np.array([max(d.total, 1) for d in config.datasets], dtype=np.float64)
    state = initial_state(config)
    quotas: list[tuple[int, ...]] = []
    passes: list[list[float]] = []
    bar = Progress(min(expected or max_chunks, max_chunks), "planning chunks", progress)
    ended: Ended | None = None
    while len(quotas) < max_chunks:
        planned = planner(state, config)
        if isinstance(planned, Ended):
            ended = planned
            break
        state = planned.state
        quotas.append(planned.quotas)
        passes.append([c.epoch + c.position / t for c, t in zip(state.cursors, totals)])
        bar.advance()
    bar.close()
    n = len(config.datasets)
    by = None if ended is None or ended.dataset is None else config.datasets[ended.dataset].name
    return StreamPlan(config.names, np.array(quotas, dtype=np.int64).reshape(-1, n),
                      np.array(passes, dtype=np.float64).reshape(-1, n), ended is not None, by)


def lane_owners(config: SourceConfig, chunks: int, lanes: int, assignment: str | None = None) -> np.ndarray:
    """The lane of each of the first ``chunks`` global chunks with ``lanes`` lanes (int64).

    ``assignment`` overrides the config's ``lane_assignment`` (``"permute"`` / ``"modulo"``).
    """
    bound = dataclasses.replace(config, lane=0, canonical_replicas=lanes,
                                lane_assignment=assignment or config.lane_assignment)
    if bound.lane_assignment == MODULO:
        return np.arange(chunks, dtype=np.int64) % lanes
    return np.array([lane_of(bound, g) for g in range(chunks)], dtype=np.int64)


def target_shares(config: SourceConfig) -> np.ndarray:
    """Each dataset's target share of the samples (in token mode: the sample shares that deliver the token weights)."""
    if config.token_mode:
        return np.array(token_shares(config.datasets))
    weights = np.array([d.weight for d in config.datasets], dtype=np.float64)
    shares: np.ndarray = weights / weights.sum()
    return shares
