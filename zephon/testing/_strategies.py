"""Hypothesis strategies for zephon's own suite and for downstream projects.

Every argument accepts a value or a strategy (``num_datasets=3`` or
``num_datasets=st.integers(1, 4)``). Examples shrink toward fewer, smaller datasets, small
chunks, seed 0 and no shuffling.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from zephon.io import Dataset
from zephon.work import StaticMixtureWorkSource

POLICY_CHOICES = ("repeat", "stop", "redistribute")


def _strategy(value: Any) -> SearchStrategy:
    return value if isinstance(value, SearchStrategy) else st.just(value)


@st.composite
def datasets(draw, *, name: Any = "d", max_shards: Any = 6, max_count: Any = 40) -> Dataset:
    """A count-only :class:`Dataset` with 1..``max_shards`` shards of 0..``max_count`` rows.

    Shrinks toward one small shard.
    """
    shards, largest = draw(_strategy(max_shards)), draw(_strategy(max_count))
    if shards < 1 or largest < 0:
        raise InvalidArgument(f"datasets() needs max_shards >= 1 and max_count >= 0, got {shards}, {largest}")
    counts = draw(st.lists(st.integers(0, largest), min_size=1, max_size=shards))
    ids = draw(st.lists(st.integers(0, 10**6), min_size=len(counts), max_size=len(counts), unique=True))
    return Dataset.from_counts(draw(_strategy(name)), counts, shard_ids=sorted(ids))


@st.composite
def mixtures(draw, *, names: Any) -> dict[str, float]:
    """Weights for ``names``: positive floats between 0.05 and 1 (shrinks toward equal weights)."""
    return {n: draw(st.floats(0.05, 1.0)) for n in draw(_strategy(names))}


def _valid(kwargs: dict[str, Any]) -> bool:
    """Construction succeeds and the first chunk can be produced."""
    try:
        StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1).next_chunk()
    except ValueError:
        return False
    return True


@st.composite
def _source_configs(draw, num_datasets, max_chunk_size, policies, block_sizes, allocations) -> dict[str, Any]:
    n = draw(_strategy(num_datasets))
    if n < 1:
        raise InvalidArgument(f"source_configs() needs num_datasets >= 1, got {n}")
    data = [draw(datasets(name=f"d{i}")) for i in range(n)]
    kwargs: dict[str, Any] = {
        "datasets": data,
        "mixture": draw(mixtures(names=[d.name for d in data])),
        "chunk_size": draw(st.integers(1, draw(_strategy(max_chunk_size)))),
        "seed": draw(st.integers(0, 2**64)),
        "shuffle_shards": draw(st.booleans()),
        "shuffle_within_shard": draw(st.booleans()),
        "shuffle_block_size": draw(_strategy(block_sizes)),
        "lane_assignment": draw(st.sampled_from(["permute", "modulo"])),
        "allocation": draw(_strategy(allocations)),
    }
    style = draw(st.sampled_from(["passes", "policies"]))
    if style == "passes":
        kwargs["stop_after_passes"] = draw(st.integers(1, 3))
    else:
        kwargs["exhausted_policy"] = {d.name: draw(_strategy(policies)) for d in data}
        kwargs["max_repeats"] = draw(st.none() | st.integers(0, 2))
        if kwargs["max_repeats"] is None:
            kwargs["stop_after_passes"] = None
    kwargs["reshuffle_on_repeat"] = draw(st.booleans())
    return kwargs


def source_configs(
    *,
    num_datasets: Any = st.integers(1, 3),
    max_chunk_size: Any = 24,
    policies: Any = st.sampled_from(POLICY_CHOICES),
    block_sizes: Any = st.none() | st.integers(1, 64) | st.sampled_from(["auto", "global"]),
    allocations: Any = st.sampled_from(["accumulator", "fixed"]),
) -> SearchStrategy[dict[str, Any]]:
    """Keyword arguments of a valid, *finite* :class:`StaticMixtureWorkSource`.

    Valid: it constructs and its first chunk can be produced.
    Finite: either ``stop_after_passes`` is set, or per-dataset policies with every repeating
    dataset capped by ``max_repeats`` — the stream always ends. Shrinks toward one dataset,
    chunk size 1, ``stop_after_passes=1``.
    """
    def finite(kwargs: dict[str, Any]) -> bool:
        policies_ = kwargs.get("exhausted_policy") or {}
        return kwargs.get("stop_after_passes") is not None or kwargs["max_repeats"] is not None or \
            "repeat" not in policies_.values()

    return _source_configs(num_datasets, max_chunk_size, policies, block_sizes, allocations) \
        .filter(finite).filter(_valid)


@st.composite
def cut_points(draw, *, max_chunks: Any = 40, max_cuts: Any = 4) -> list[int]:
    """Sorted, distinct chunk indices in ``[0, max_chunks]`` at which to checkpoint.

    Shrinks toward ``[0]``.
    """
    top, cuts = draw(_strategy(max_chunks)), draw(_strategy(max_cuts))
    if top < 0 or cuts < 1:
        raise InvalidArgument(f"cut_points() needs max_chunks >= 0 and max_cuts >= 1, got {top}, {cuts}")
    return sorted(draw(st.lists(st.integers(0, top), min_size=1, max_size=cuts, unique=True)))
