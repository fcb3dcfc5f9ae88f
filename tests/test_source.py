"""StaticMixtureWorkSource as users see it: replay, lanes, passes, mixture, END (SPEC §2–4, §7)."""
import copy
import json
from collections import Counter

import pytest
from helpers import lane_stream, pointers_of, three_datasets
from hypothesis import given
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core import CursorState, SourceState, initial_state, step
from zephon.testing import assert_lanes_partition, assert_replay_equivalent, collect, cut_points, source_configs


@given(source_configs(), cut_points(max_chunks=60), st.integers(1, 4), st.data())
def test_replay_from_any_cut_equals_the_uninterrupted_stream(kwargs, cuts, replicas, data):
    lane = data.draw(st.integers(0, replicas - 1))
    assert_replay_equivalent(lambda: StaticMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas), cuts, max_chunks=80)


@given(source_configs(), st.integers(1, 7))
def test_lanes_are_disjoint_and_merge_into_the_single_lane_stream(kwargs, replicas):
    assert_lanes_partition(lambda: StaticMixtureWorkSource(**kwargs), replicas, max_chunks=150)


@pytest.mark.parametrize("routing", ["permute", "modulo"])
def test_every_lane_gets_one_chunk_per_block(routing):
    source = StaticMixtureWorkSource(three_datasets(10), {"web": 5, "code": 3, "math": 2}, chunk_size=7,
                                     lane_assignment=routing, stop_after_passes=None, exhausted_policy="repeat")
    lanes = [source.clone_for_lane(lane, 8) for lane in range(8)]
    for _ in range(5):
        indices = []
        for lane in lanes:
            lane.next_chunk()
            indices.append(lane.state.chunk_index - 1)
        assert sorted(i % 8 for i in indices) == list(range(8))
        assert len({i // 8 for i in indices}) == 1


def test_permuted_routing_spreads_a_periodic_component_over_all_lanes():
    data = [Dataset.from_counts("big", [10**6]), Dataset.from_counts("rare", [10**6])]
    kwargs = dict(datasets=data, mixture={"big": 0.75, "rare": 0.25}, chunk_size=1, exhausted_policy="repeat")
    for routing, expected_lanes in (("modulo", 1), ("permute", 4)):
        source = StaticMixtureWorkSource(**kwargs, lane_assignment=routing)
        seen = [any("rare" in c.components for c in collect(source.clone_for_lane(l, 4), 40)) for l in range(4)]
        assert sum(seen) == expected_lanes


@given(source_configs(policies="repeat"), st.data())
def test_every_pass_emits_each_sample_at_most_once_and_drained_passes_all(kwargs, data):
    source = StaticMixtureWorkSource(**dict(kwargs, pass_tail="drop")).clone_for_lane(0, 1)
    per_pass = {}
    for _ in range(120):
        chunk = source.next_chunk()
        if chunk is None:
            break
        for d, cursor in zip(source.config.datasets, source.state.cursors):
            if d.name in chunk.components:
                per_pass.setdefault((d.name, cursor.epoch), []).extend(map(tuple, chunk.components[d.name].tolist()))
    for d, cursor in zip(source.config.datasets, source.state.cursors):
        full = sorted((source.component_ids()[d.name], int(s), o) for s, n in zip(d.shard_ids, d.shard_counts) for o in range(n))
        for (name, epoch), samples in per_pass.items():
            if name != d.name:
                continue
            assert len(samples) == len(set(samples))
            if epoch < cursor.epoch and len(samples) == d.total or (epoch == cursor.epoch and cursor.position == d.total):
                assert sorted(samples) == full


@given(source_configs(policies="repeat", allocations="accumulator"))
def test_cumulative_mixture_stays_within_two_samples_of_the_weights(kwargs):
    source = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1)
    weights = [d.weight for d in source.config.datasets]
    weights = [w / sum(weights) for w in weights]
    drawn, total = Counter(), 0
    for chunk in collect(source, 100):
        drawn.update(chunk.counts)
        total += len(chunk)
        for d, w in zip(source.config.datasets, weights):
            assert abs(drawn[d.name] - w * total) <= 2


def test_stop_after_passes_ends_once_every_dataset_completed_its_passes():
    for passes in (1, 2, 3):
        source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10,
                                         stop_after_passes=passes).clone_for_lane(0, 1)
        collect(source)
        completed = [c.epoch + (c.position == d.total) for d, c in zip(source.config.datasets, source.state.cursors)]
        assert min(completed) == passes


def test_reshuffle_off_repeats_pass_zero_through_the_source():
    data = [Dataset.from_counts("a", [13, 9, 11])]
    kwargs = dict(datasets=data, mixture={"a": 1}, chunk_size=11, shuffle_within_shard=True, stop_after_passes=3)
    stream = pointers_of(lane_stream(dict(kwargs, reshuffle_on_repeat=False)))
    assert stream[:33] == stream[33:66] == stream[66:99]
    stream = pointers_of(lane_stream(dict(kwargs, reshuffle_on_repeat=True)))
    assert stream[:33] != stream[33:66]


def test_end_has_no_side_effects_and_repeats():
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10,
                                     exhausted_policy="stop").clone_for_lane(0, 1)
    chunks = collect(source)
    assert chunks and source.next_chunk() is None
    saved = source.state_dict()
    assert source.next_chunk() is None and source.state_dict() == saved
    fresh = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10,
                                    exhausted_policy="stop").clone_for_lane(0, 1)
    fresh.load_state_dict(saved)
    assert fresh.next_chunk() is None


@pytest.mark.parametrize("lane", [0, 1, 2])
def test_first_chunk_failure_raises_on_every_lane(lane):
    data = [Dataset.from_counts("big", [1000]), Dataset.from_counts("tiny", [2])]
    source = StaticMixtureWorkSource(data, {"big": 0.5, "tiny": 0.5}, chunk_size=10, exhausted_policy="stop")
    with pytest.raises(ValueError, match="'tiny'"):
        source.clone_for_lane(lane, 3).next_chunk()


def test_redistribute_shortens_chunks_stamps_target_and_exhaustion():
    data = [Dataset.from_counts("main", [1030]), Dataset.from_counts("side", [25])]
    source = StaticMixtureWorkSource(data, {"main": 0.5, "side": 0.5}, chunk_size=20,
                                     exhausted_policy={"main": "repeat", "side": "redistribute"},
                                     max_repeats={"main": 0})
    chunks = collect(source.clone_for_lane(0, 1))
    assert [len(c) for c in chunks[:3]] == [20, 20, 15]
    assert chunks[0].target_mixture == {"main": 0.5, "side": 0.5}
    assert chunks[2].source_exhausted == ("side",) and chunks[1].source_exhausted == ()
    assert chunks[3].target_mixture == {"main": 1.0} and chunks[3].counts == {"main": 20}
    assert sum(c.counts.get("side", 0) for c in chunks) == 25
    assert chunks[-1].source_exhausted == ("main", "side")  # main drained exactly: 30 + 50 x 20


def test_no_target_mixture_without_redistribution():
    chunk = lane_stream(dict(datasets=three_datasets(), mixture={"web": 5, "code": 3, "math": 2}, chunk_size=10), max_chunks=1)[0]
    assert chunk.target_mixture is None and chunk.counts == {"web": 5, "code": 3, "math": 2}


def test_max_repeats_caps_passes():
    data = [Dataset.from_counts("a", [10]), Dataset.from_counts("b", [1000])]
    source = StaticMixtureWorkSource(data, {"a": 0.5, "b": 0.5}, chunk_size=4, exhausted_policy="repeat", max_repeats=2)
    chunks = collect(source.clone_for_lane(0, 1))
    assert sum(c.counts["a"] for c in chunks) == 30  # the first pass and two repeats
    assert chunks[-1].source_exhausted == ("a",)


@given(source_configs())
def test_step_is_pure(kwargs):
    config = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1).config
    state = initial_state(config)
    for _ in range(30):
        before = copy.deepcopy(state)
        first = step(state, config)
        assert step(state, config) == first and state == before
        if first[0] is None:
            break
        state = first[1]


def test_template_refuses_to_produce_and_clones_refuse_to_clone():
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=64)
    with pytest.raises(RuntimeError, match="clone_for_lane"):
        source.next_chunk()
    lane = source.clone_for_lane(0, 2)
    with pytest.raises(RuntimeError, match="already bound"):
        lane.clone_for_lane(1, 2)
    assert lane.datasets_by_id[0] is source.datasets_by_id[0]
    assert lane.config.datasets[0] is source.config.datasets[0]


@pytest.mark.parametrize("lane, replicas", [(-1, 2), (2, 2), (0, 0), (True, 2), (0, 1.0)])
def test_bad_lane_bindings_raise(lane, replicas):
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=64)
    with pytest.raises((ValueError, TypeError)):
        source.clone_for_lane(lane, replicas)


def test_component_vocabulary_and_hooks():
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=64)
    assert source.component_ids() == {"web": 0, "code": 1, "math": 2}
    assert source.chunk_size_hint() == 64 and not source.requires_token_priming
    assert source.continues_after_exhaustion() == frozenset()
    assert json.loads(json.dumps(source.state_dict()))["lane"] is None


def test_a_state_no_pass_can_serve_ends_under_drop_and_carries_on_under_carry():
    data = [Dataset.from_counts("a", [5]), Dataset.from_counts("b", [100])]
    kwargs = dict(datasets=data, mixture={"a": 0.5, "b": 0.5}, chunk_size=10, exhausted_policy="repeat")
    drop = StaticMixtureWorkSource(**kwargs, pass_tail="drop").clone_for_lane(0, 1).config
    inconsistent = SourceState(chunk_index=3, alloc=(0.9, -0.9), cursors=initial_state(drop).cursors)
    assert step(inconsistent, drop) == (None, inconsistent)  # a's quota 6 exceeds its whole pass of 5: no loop
    carry = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1).config
    chunk, after = step(inconsistent, carry)  # a's passes back to back: its whole pass, then one of the next
    assert chunk.counts == {"a": 6, "b": 4} and after.cursors[0] == CursorState(epoch=1, position=1)


def test_weights_are_normalised_in_the_mixture_order():
    from zephon.work import MixtureSpec

    data = [Dataset.from_counts(n, [1000]) for n in "abc"]
    mixture = {"c": 0.3, "b": 0.2, "a": 0.1}
    source = StaticMixtureWorkSource(data, mixture, chunk_size=10, exhausted_policy="redistribute")
    chunk = source.clone_for_lane(0, 1).next_chunk()
    assert chunk.target_mixture == {n: MixtureSpec(mixture).normalized[n] for n in "abc"}


def test_numpy_integers_are_ints():
    import numpy as np

    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2},
                                     chunk_size=np.int64(10), seed=np.uint32(7), max_repeats=np.int8(1),
                                     exhausted_policy="repeat")
    assert source.config.chunk_size == 10 and source.config.seed == 7
