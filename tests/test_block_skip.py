"""Other lanes' chunks skipped as blocks in closed form plan exactly what chunk-by-chunk planning
plans: ``AccumulatorAllocator.allocate_many`` against ``allocate``, the kernel against the reference."""
import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import accumulator_states
from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.alloc import AccumulatorAllocator, is_accumulator_state
from zephon.core.cache import scheduler
from zephon.core.config import CARRY, REPEAT
from zephon.core.schedule import (
    CursorState, Ended, SourceState, active_weights, advance, can_carry, initial_state, passes_done,
    plan_chunk_reference, plan_next, plan_next_reference,
)

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


@given(accumulator_states(3), st.integers(1, 300))
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


def _limited_steps(config, alloc, n):
    """The twin of a skip up to ``n`` chunks of datasets that repeat with "carry" tails: chunk
    by chunk as ``plan_chunk_reference`` plans them, until one would end the stream."""
    cursors = initial_state(config).cursors
    for k in range(n):
        planned = plan_chunk_reference(config, alloc, cursors)
        if isinstance(planned, Ended):
            return k, [c.epoch for c in cursors], [c.position for c in cursors], alloc
        *_, alloc, cursors = planned
    return n, [c.epoch for c in cursors], [c.position for c in cursors], alloc


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=6), st.integers(1, 5000), st.integers(0, 6),
       st.integers(16, 3000), st.sampled_from(["stop_after_passes", "max_repeats"]), st.integers(0, 3),
       st.sampled_from(["accumulator", "fixed"]), st.data())
def test_a_skip_runs_through_pass_ends_to_the_chunk_where_the_stream_ends(weights, chunk_size, before, n, limit,
                                                                         passes, allocation, data):
    """Under ``stop_after_passes`` or ``max_repeats`` a pass end still changes no quota: the skip
    runs through the ends, as far as the last chunk before the one that ends the stream (every
    dataset has made its passes, or one would draw from a pass past its repeats)."""
    totals = [data.draw(st.integers(chunk_size, 3 * chunk_size)) for _ in weights]
    try:
        config, weights, state = _lane_of(totals, weights, chunk_size, before, "repeat", allocation=allocation,
                                          **{limit: passes + (limit == "stop_after_passes")})
    except ValueError:  # the fixed allocator refuses shares below one sample
        assume(False)
    state = state if allocation == "accumulator" else ()
    acc = np.array(state) if state else np.zeros(len(weights))
    epochs, positions = np.zeros(len(weights), dtype=np.int64), np.zeros(len(weights), dtype=np.int64)
    skipped, work = scheduler(config).skip_quiet(acc, epochs, positions, n)
    expected = _limited_steps(config, state, n)
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
        kwargs["pass_tail"] = draw(st.sampled_from(["carry", "drop"]) | st.fixed_dictionaries(
            {d.name: st.sampled_from(["carry", "drop"]) for d in datasets}))
    try:
        source = StaticMixtureWorkSource(datasets, mixture, **kwargs)
    except ValueError:  # the fixed allocator refuses shares below one sample
        assume(False)
    replicas = draw(st.integers(16, 400))
    return source.clone_for_lane(draw(st.integers(0, replicas - 1)), replicas).config


@settings(max_examples=60, deadline=None)
@given(many_lane_configs(), st.booleans(), st.data())
def test_the_kernel_skips_lanes_as_the_reference_plans_them(config, restored, data):
    """From the start, or from a state whose accumulators lie anywhere a checkpoint allows
    (off every grid: the block skip must decline and step)."""
    state = initial_state(config)
    if restored and config.allocator.name == "accumulator":
        state = dataclasses.replace(state, alloc=data.draw(accumulator_states(len(config.datasets))))
    _plans_as_the_reference(config, state)


def _plans_as_the_reference(config, state, chunks=6):
    """The kernel plans the next ``chunks`` chunks from ``state`` as the reference does."""
    for _ in range(chunks):
        planned = plan_next(state, config)
        assert repr(planned) == repr(plan_next_reference(state, config))  # repr: -0.0 is not 0.0
        if isinstance(planned, Ended):
            break
        state = planned.state


def _stream(config, plan):
    state, out = initial_state(config), []
    while True:
        planned = plan(state, config)
        out.append(repr(planned))
        if isinstance(planned, Ended):
            return out
        state = planned.state


@pytest.mark.parametrize("totals, weights, tails, limit", [
    ((1000, 1000), (1, 1), CARRY, {"stop_after_passes": 1}),  # every pass ends at a chunk's end: the stream at 20
    ((1030, 970), (1, 1), CARRY, {"stop_after_passes": 2}),
    ((1000, 3000, 130), (0.6, 0.3, 0.1), CARRY, {"stop_after_passes": 3}),  # passes of the third every 13 chunks
    ((1020, 1000), (1, 1), {"d0": "drop", "d1": CARRY}, {"stop_after_passes": 1}),  # a "drop" tail in the last chunk
    ((1010, 2000, 500), (2, 1, 1), {"d0": "drop", "d1": CARRY, "d2": CARRY}, {"stop_after_passes": 2}),
    ((1000, 3000, 130), (0.6, 0.3, 0.1), CARRY, {"max_repeats": 4, "exhausted_policy": "repeat"}),
    ((1030, 970), (1, 1), {"d0": "drop", "d1": CARRY}, {"max_repeats": 1, "exhausted_policy": "repeat"}),
])
@pytest.mark.parametrize("allocation", ["accumulator", "fixed"])
@pytest.mark.parametrize("routing", ["modulo", "permute"])
def test_every_lane_ends_where_the_reference_ends_under_limited_passes(totals, weights, tails, limit, allocation,
                                                                       routing):
    """Each lane of 64 from the start to the stream's end: the skip through pass ends stops exactly
    at the chunk that ends the stream (passes made, or a repeat past the limit), whatever the
    lane's offset to it."""
    datasets = [Dataset.from_counts(f"d{i}", [t]) for i, t in enumerate(totals)]
    source = StaticMixtureWorkSource(datasets, {d.name: w for d, w in zip(datasets, weights)}, chunk_size=100,
                                     pass_tail=tails, allocation=allocation, lane_assignment=routing, **limit)
    for lane in range(64):
        config = source.clone_for_lane(lane, 64).config
        assert _stream(config, plan_next) == _stream(config, plan_next_reference)


@st.composite
def restored_lanes(draw):
    """A lane's config over datasets that repeat, with passes counted or repeats limited, "carry"
    and "drop" tails mixed, some datasets paused (weight 0, as a curriculum's phase pauses them),
    and a state anywhere near the passes' limit: cursors at and around pass ends, accumulators off
    the start's."""
    n, chunk_size = draw(st.integers(2, 4)), draw(st.integers(4, 300) | st.sampled_from([16, 64, 100, 128]))
    totals = [draw(st.integers(chunk_size, 30 * chunk_size) | st.sampled_from([chunk_size, 10 * chunk_size]))
              for _ in range(n)]
    datasets = [Dataset.from_counts(f"d{i}", [t]) for i, t in enumerate(totals)]
    limit, passes = draw(st.sampled_from(["stop_after_passes", "max_repeats"])), draw(st.integers(1, 3))
    allocation = draw(st.sampled_from(["accumulator", "fixed"]))
    try:
        source = StaticMixtureWorkSource(
            datasets, {d.name: draw(st.floats(0.05, 1.0) | st.sampled_from([1.0, 0.5, 0.25])) for d in datasets},
            chunk_size=chunk_size, exhausted_policy="repeat", allocation=allocation, seed=draw(st.integers(0, 99)),
            pass_tail={d.name: draw(st.sampled_from([CARRY, "drop"])) for d in datasets}, **{limit: passes})
    except ValueError:  # the fixed allocator refuses shares below one sample
        assume(False)
    replicas = draw(st.integers(1, 300))
    config = source.clone_for_lane(draw(st.integers(0, replicas - 1)), replicas).config
    if draw(st.booleans()):
        plans = [dataclasses.replace(d, weight=0.0) if draw(st.integers(0, 2)) == 0 else d for d in config.datasets]
        total = sum(p.weight for p in plans)
        assume(total > 0 and (allocation == "accumulator" or all(
            p.weight == 0 or p.weight / total * chunk_size >= 1 for p in plans)))
        config = dataclasses.replace(config, datasets=tuple(plans))
    cursors = []
    for d in config.datasets:
        epoch = draw(st.integers(max(0, passes - 1), passes + 1))
        position = draw(st.integers(0, d.total) | st.just(d.total) | st.integers(max(0, d.total - 3 * chunk_size),
                                                                                   d.total))
        if d.pass_tail == CARRY and epoch > 0 and position == 0:  # a "carry" cursor rests at a pass's end
            position = d.total
        tails = 0 if d.pass_tail == CARRY else epoch * draw(st.integers(0, d.total - 1))
        cursors.append(CursorState(epoch=epoch, position=position, tails=tails))
    alloc = config.allocator.init(n)
    if allocation == "accumulator" and draw(st.booleans()):
        alloc = tuple(draw(st.sampled_from([0.0, 0.5, -0.5, 0.25, -0.75])) if d.weight > 0 else 0.0
                      for d in config.datasets)
        assume(is_accumulator_state(list(alloc), n))
    return config, SourceState(chunk_index=draw(st.integers(0, 500)), alloc=alloc, cursors=tuple(cursors))


@given(restored_lanes())
def test_lanes_restored_near_their_limits_plan_as_the_reference(case):
    _plans_as_the_reference(*case)


def _quiet(config, cursors, quotas):
    """No dataset draws past its room in this chunk: a "carry" one within its repeats, any other
    short of its pass's end."""
    return all(q == 0 or (can_carry(d, c, q) if d.pass_tail == CARRY and d.policy == REPEAT and d.total > 0
                          else c.position + q < d.total) for d, c, q in zip(config.datasets, cursors, quotas))


@given(restored_lanes(), st.integers(16, 5000))
def test_a_skip_from_a_restored_state_goes_exactly_as_far_as_the_quiet_chunks(case, count):
    """As far as stepping chunk by chunk goes while no dataset draws past its room and the passes
    counted are not all made: the whole way in one block wherever the closed form holds."""
    config, state = case
    weights = active_weights(config, state.cursors)
    alloc, cursors, quiet = state.alloc, state.cursors, 0
    while quiet < count and not (config.stop_after_passes and passes_done(config, list(cursors))):
        quotas, after = config.allocator.allocate(alloc, weights, config.chunk_size)
        if not _quiet(config, cursors, quotas):
            break
        alloc, cursors, quiet = after, advance(config, list(cursors), quotas), quiet + 1
    acc = np.array(state.alloc or (0.0,) * len(weights), dtype=np.float64)
    epochs = np.array([c.epoch for c in state.cursors], dtype=np.int64)
    positions = np.array([c.position for c in state.cursors], dtype=np.int64)
    skipped, _ = scheduler(config).skip_quiet(acc, epochs, positions, count)
    closed = config.allocator.name == "fixed" or (
        quiet > 0 and ACCUMULATOR.allocate_many(state.alloc, weights, config.chunk_size, quiet) is not None)
    assert skipped == quiet if closed else skipped <= quiet
    alloc, cursors = state.alloc, state.cursors
    for _ in range(skipped):
        quotas, alloc = config.allocator.allocate(alloc, weights, config.chunk_size)
        cursors = advance(config, list(cursors), quotas)
    assert (epochs.tolist(), positions.tolist()) == ([c.epoch for c in cursors], [c.position for c in cursors])
    if state.alloc:
        assert repr(tuple(acc.tolist())) == repr(tuple(alloc))


@pytest.mark.parametrize("allocation, tails, paused, cursors, expected", [
    # the "drop" one made its pass, the "carry" one makes its own in chunk 20; a later probe finds
    # the drop one's pass end (chunk 50): the skip still takes all 20
    ("accumulator", ("drop", CARRY), False, ((1, 0), (0, 0)), 20),
    # paused (weight 0) at its pass's end, that pass made: only the other's passes are waited for
    ("fixed", (CARRY, CARRY), True, ((0, 2500), (0, 0)), 10),
    # paused before its pass's end: its passes are never made, so the stream's end bounds no skip
    ("fixed", (CARRY, CARRY), True, ((0, 5), (0, 0)), 100),
])
def test_a_skip_from_a_restored_state_ends_exactly_where_the_passes_are_made(allocation, tails, paused, cursors,
                                                                             expected):
    datasets = [Dataset.from_counts("d0", [2500]), Dataset.from_counts("d1", [1000])]
    source = StaticMixtureWorkSource(datasets, {"d0": 1, "d1": 1}, chunk_size=100, stop_after_passes=1,
                                     allocation=allocation, pass_tail=dict(zip(("d0", "d1"), tails)))
    config = source.clone_for_lane(0, 1).config
    if paused:
        config = dataclasses.replace(config, datasets=(dataclasses.replace(config.datasets[0], weight=0.0),
                                                       config.datasets[1]))
    acc, epochs, positions = np.zeros(2), *(np.array(column, dtype=np.int64) for column in zip(*cursors))
    assert scheduler(config).skip_quiet(acc, epochs, positions, 100) == (expected, 1)


def test_a_skip_longer_than_a_lane_ever_takes_is_refused():
    """Datasets that repeat forever bound no skip: the test hook takes at most 2^32 chunks, where
    a lane skips fewer than twice its lane count."""
    config, weights, state = _lane_of([1000, 3000], [1.0, 1.0], 1024, 0, "repeat")
    zeros = np.zeros(len(weights), dtype=np.int64)
    with pytest.raises(ValueError, match="count"):
        scheduler(config).skip_quiet(np.array(state), zeros.copy(), zeros.copy(), 2**32 + 1)
