"""Other lanes' chunks skipped as blocks in closed form plan exactly what chunk-by-chunk planning
plans: ``AccumulatorAllocator.allocate_many`` against ``allocate``, the kernel against the reference."""
import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.alloc import AccumulatorAllocator
from zephon.core.cache import scheduler
from zephon.core.schedule import Ended, advance, initial_state, passes_done, plan_next, plan_next_reference

ACCUMULATOR = AccumulatorAllocator()
weight_vectors = st.lists(st.floats(0.001, 1.0) | st.just(0.0), min_size=1, max_size=5).filter(any)


def _normalised(weights):
    total = sum(weights)
    return [w / total for w in weights]


def _chunks(state, weights, chunk_size, n):
    summed = [0] * len(weights)
    for _ in range(n):
        quotas, state = ACCUMULATOR.allocate(state, weights, chunk_size)
        summed = [s + q for s, q in zip(summed, quotas)]
    return tuple(summed), state


@given(weight_vectors, st.integers(1, 20000), st.integers(0, 6), st.integers(1, 300))
def test_allocate_many_is_that_many_chunks_where_it_holds(weights, chunk_size, before, n):
    weights = _normalised(weights)
    _, state = _chunks(ACCUMULATOR.init(len(weights)), weights, chunk_size, before)
    many = ACCUMULATOR.allocate_many(state, weights, chunk_size, n)
    assert many is None or repr(many) == repr(_chunks(state, weights, chunk_size, n))


@given(st.lists(st.floats(-1.0, 1.0), min_size=3, max_size=3), st.integers(1, 300))
def test_allocate_many_refuses_or_agrees_from_any_checkpointed_state(acc, n):
    weights, chunk_size = _normalised([0.6, 0.3, 0.1]), 4096
    many = ACCUMULATOR.allocate_many(tuple(acc), weights, chunk_size, n)
    assert many is None or many == _chunks(tuple(acc), weights, chunk_size, n)


@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=12), st.integers(1, 20000), st.integers(0, 6),
       st.integers(1, 300))
def test_the_kernel_skips_a_block_exactly_where_allocate_many_holds(weights, chunk_size, before, n):
    """The kernel's block skip is allocate_many: one block where it holds, chunk by chunk where not."""
    datasets = [Dataset.from_counts(f"d{i}", [2**40]) for i in range(len(weights))]
    source = StaticMixtureWorkSource(datasets, {d.name: w for d, w in zip(datasets, weights)},
                                     chunk_size=chunk_size)
    config = source.clone_for_lane(0, 1).config
    weights = list(config.normalised)
    _, state = _chunks(ACCUMULATOR.init(len(weights)), weights, chunk_size, before)
    acc, zeros = np.array(state), np.zeros(len(weights), dtype=np.int64)
    positions = zeros.copy()
    skipped, work = scheduler(config).skip_quiet(acc, zeros.copy(), positions, n)
    many = ACCUMULATOR.allocate_many(state, weights, chunk_size, n)
    assert skipped == n and work == (1 if many is not None and n >= 16 else n)
    assert (tuple(positions.tolist()), tuple(acc.tolist())) == (many or _chunks(state, weights, chunk_size, n))


def _lane_of(totals, weights, chunk_size, before, policy, **kwargs):
    """The config of the one lane of datasets of ``totals`` samples under ``policy`` (and the
    source's other ``kwargs``), its normalised weights, and the accumulators after ``before`` chunks."""
    datasets = [Dataset.from_counts(f"d{i}", [t]) for i, t in enumerate(totals)]
    source = StaticMixtureWorkSource(datasets, {d.name: w for d, w in zip(datasets, weights)}, chunk_size=chunk_size,
                                     exhausted_policy=policy, **kwargs)
    config = source.clone_for_lane(0, 1).config
    weights = list(config.normalised)
    _, state = _chunks(ACCUMULATOR.init(len(weights)), weights, chunk_size, before)
    return config, weights, state


def _quiet_steps(state, weights, chunk_size, totals, n):
    """The twin of a skip up to ``n`` quiet chunks: chunk by chunk, until one would reach a total."""
    positions = [0] * len(weights)
    for k in range(n):
        quotas, after = ACCUMULATOR.allocate(state, weights, chunk_size)
        if any(q > 0 and p + q >= t for p, q, t in zip(positions, quotas, totals)):
            return k, positions, state
        positions, state = [p + q for p, q in zip(positions, quotas)], after
    return n, positions, state


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=6), st.integers(1, 5000), st.integers(0, 6),
       st.integers(16, 3000), st.data())
def test_a_skip_ends_exactly_where_a_dataset_would_reach_its_total(weights, chunk_size, before, n, data):
    """The block skip finds where the quiet chunks end (from its estimate, then checked) as
    stepping chunk by chunk does."""
    totals = [data.draw(st.integers(1, 2 * n * chunk_size)) for _ in weights]
    config, weights, state = _lane_of(totals, weights, chunk_size, before, "stop")
    acc, positions = np.array(state), np.zeros(len(weights), dtype=np.int64)
    skipped, _ = scheduler(config).skip_quiet(acc, np.zeros(len(weights), dtype=np.int64), positions, n)
    expected, moved, after = _quiet_steps(state, weights, chunk_size, totals, n)
    assert (skipped, positions.tolist(), tuple(acc.tolist())) == (expected, moved, tuple(after))


def _endless_steps(config, state, weights, chunk_size, n):
    """The twin of a skip over ``n`` chunks of datasets that repeat endlessly: chunk by chunk,
    the cursors moved as a planned chunk moves them (on through the ends of passes)."""
    cursors = initial_state(config).cursors
    for _ in range(n):
        quotas, state = ACCUMULATOR.allocate(state, weights, chunk_size)
        cursors = advance(config, cursors, quotas)
    return [c.epoch for c in cursors], [c.position for c in cursors], state


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=6), st.integers(1, 5000), st.integers(0, 6),
       st.integers(16, 3000), st.data())
def test_a_skip_runs_through_the_pass_ends_of_datasets_that_repeat_endlessly(weights, chunk_size, before, n, data):
    """Datasets that repeat with "carry" tails and no limit end passes without changing a quota:
    the skip runs through those ends, as one block where the closed form holds."""
    totals = [data.draw(st.integers(chunk_size, 3 * chunk_size)) for _ in weights]  # a repeating one holds a chunk
    config, weights, state = _lane_of(totals, weights, chunk_size, before, "repeat")
    acc, epochs, positions = np.array(state), np.zeros(len(weights), dtype=np.int64), np.zeros(len(weights), np.int64)
    skipped, work = scheduler(config).skip_quiet(acc, epochs, positions, n)
    expected = _endless_steps(config, state, weights, chunk_size, skipped)
    assert (epochs.tolist(), positions.tolist(), tuple(acc.tolist())) == (expected[0], expected[1], tuple(expected[2]))
    if ACCUMULATOR.allocate_many(state, weights, chunk_size, n) is not None:
        assert (skipped, work) == (n, 1)
    else:
        assert skipped == n or work == 1  # stepped to the end, or one block as far as the closed form holds


def _counted_steps(config, state, weights, n):
    """The twin of a skip up to ``n`` chunks of datasets that repeat until each has made
    ``stop_after_passes`` passes: chunk by chunk, until one would start with every pass made."""
    cursors = initial_state(config).cursors
    for k in range(n):
        if passes_done(config, list(cursors)):
            return k, [c.epoch for c in cursors], [c.position for c in cursors], state
        quotas, state = config.allocator.allocate(state, weights, config.chunk_size)
        cursors = advance(config, cursors, quotas)
    return n, [c.epoch for c in cursors], [c.position for c in cursors], state


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=6), st.integers(1, 5000), st.integers(0, 6),
       st.integers(16, 3000), st.integers(1, 4), st.sampled_from(["accumulator", "fixed"]), st.data())
def test_a_skip_runs_through_pass_ends_to_the_chunk_where_the_passes_counted_are_made(weights, chunk_size, before, n,
                                                                                     passes, allocation, data):
    """Counting passes (``stop_after_passes``) leaves a pass end changing no quota: the skip runs
    through the ends, as far as the last chunk that starts before every dataset has made its passes."""
    totals = [data.draw(st.integers(chunk_size, 3 * chunk_size)) for _ in weights]
    try:
        config, weights, state = _lane_of(totals, weights, chunk_size, before, "repeat", stop_after_passes=passes,
                                          allocation=allocation)
    except ValueError:  # the fixed allocator refuses shares below one sample
        assume(False)
    state = state if allocation == "accumulator" else ()
    acc = np.array(state) if state else np.zeros(len(weights))
    epochs, positions = np.zeros(len(weights), dtype=np.int64), np.zeros(len(weights), dtype=np.int64)
    skipped, work = scheduler(config).skip_quiet(acc, epochs, positions, n)
    expected = _counted_steps(config, state, weights, n)
    assert (skipped, epochs.tolist(), positions.tolist()) == tuple(expected[:3])
    if state:
        assert tuple(acc.tolist()) == tuple(expected[3])
    if allocation == "fixed" or ACCUMULATOR.allocate_many(state, weights, chunk_size, n) is not None:
        assert work == 1  # one block: its end found in closed form or by bisection, no chunk stepped


def test_allocate_many_holds_for_ordinary_mixtures():
    """The closed form is what makes lane skipping cheap: it must hold for usual mixtures."""
    for weights in ([0.6, 0.3, 0.1], [0.5, 0.25, 0.125, 0.125], [1 / 3, 1 / 3, 1 / 3], [0.07, 0.93]):
        for chunk_size in (1024, 4096, 16384):
            weights = _normalised(weights)
            _, state = _chunks(ACCUMULATOR.init(len(weights)), weights, chunk_size, 3)
            many = ACCUMULATOR.allocate_many(state, weights, chunk_size, 2000)
            assert many is not None and many == _chunks(state, weights, chunk_size, 2000)


@st.composite
def many_lane_configs(draw):
    """A lane of many (16..400) over datasets large enough that long stretches are quiet; round
    numbers too, so that a pass often ends exactly at a chunk's end."""
    n = draw(st.integers(1, 12))
    counts = st.integers(1, 40_000) | st.integers(1, 400).map(lambda k: 100 * k)
    datasets = [Dataset.from_counts(f"d{i}", draw(st.lists(counts, min_size=1, max_size=3))) for i in range(n)]
    mixture = {d.name: draw(st.floats(0.001, 1.0) | st.sampled_from([1, 2, 3, 4])) for d in datasets}
    kwargs = dict(chunk_size=draw(st.integers(1, 3000) | st.sampled_from([10, 20, 50, 100, 200])),
                  seed=draw(st.integers(0, 2**32)),
                  allocation=draw(st.sampled_from(["accumulator", "fixed"])),
                  exhausted_policy=draw(st.sampled_from(["repeat", "redistribute", "stop"])),
                  lane_assignment=draw(st.sampled_from(["permute", "modulo"])))
    if kwargs["exhausted_policy"] == "repeat":
        kwargs["max_repeats"] = draw(st.none() | st.integers(0, 2))
        if kwargs["max_repeats"] is None:  # passes counted: the stream ends where each dataset made them
            kwargs["stop_after_passes"] = draw(st.none() | st.integers(1, 3))
            kwargs["pass_tail"] = draw(st.sampled_from(["carry", "drop"]))
    try:
        source = StaticMixtureWorkSource(datasets, mixture, **kwargs)
    except ValueError:  # the fixed allocator refuses shares below one sample
        assume(False)
    replicas = draw(st.integers(16, 400))
    return source.clone_for_lane(draw(st.integers(0, replicas - 1)), replicas).config


@settings(max_examples=60, deadline=None)
@given(many_lane_configs(), st.none() | st.lists(st.floats(-1.0, 1.0), min_size=12, max_size=12))
def test_the_kernel_skips_lanes_as_the_reference_plans_them(config, acc):
    """From the start, or from a state whose accumulators lie anywhere a checkpoint allows
    (off every grid: the block skip must decline and step)."""
    state = initial_state(config)
    if acc is not None and config.allocator.name == "accumulator":
        state = dataclasses.replace(state, alloc=tuple(acc[:len(config.datasets)]))
    for _ in range(6):
        planned = plan_next(state, config)
        assert repr(planned) == repr(plan_next_reference(state, config))  # repr: -0.0 is not 0.0
        if isinstance(planned, Ended):
            break
        state = planned.state


def test_a_skip_longer_than_a_lane_ever_takes_is_refused():
    """Datasets that repeat forever bound no skip: the test hook takes at most 2^32 chunks, where
    a lane skips fewer than twice its lane count."""
    config, weights, state = _lane_of([1000, 3000], [1.0, 1.0], 1024, 0, "repeat")
    zeros = np.zeros(len(weights), dtype=np.int64)
    with pytest.raises(ValueError, match="count"):
        scheduler(config).skip_quiet(np.array(state), zeros.copy(), zeros.copy(), 2**32 + 1)
