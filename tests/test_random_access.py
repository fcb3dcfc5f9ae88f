"""Random access (SPEC §8): exact length and the i-th sample of the mixed, shuffled stream."""
import gc
import json
import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers import three_datasets
from hypothesis import given
from hypothesis import strategies as st
from test_schedule import _Fork

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core import cache
from zephon.core.index import build_index, sample_at, sample_at_reference, samples_at
from zephon.testing import collect, source_configs
from zephon.work import PointerSequence


def stream_of(source):
    return [pointer for chunk in collect(source, 10**6) for pointer, _ in chunk]


@given(source_configs(), st.integers(1, 4), st.data())
def test_every_index_agrees_with_iteration(kwargs, replicas, data):
    lane = data.draw(st.integers(0, replicas - 1))
    source = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas)
    expected = stream_of(StaticMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas))
    assert source.supports_indexing() and len(source) == len(expected)
    assert [source.sample_id_at(i) for i in range(len(source))] == expected
    assert list(map(tuple, source.sample_ids_at(np.arange(len(source))).tolist())) == expected


@given(source_configs(), st.integers(1, 5))
def test_snapshot_spacing_does_not_change_answers(kwargs, every):
    config = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1).config
    dense, sparse = build_index(config, every=1), build_index(config, every=every)
    assert dense.length == sparse.length and dense.chunks == sparse.chunks
    assert all(sample_at(dense, config, i) == sample_at(sparse, config, i) for i in range(0, dense.length, 7))


@given(source_configs(), st.integers(1, 3), st.data())
def test_template_length_is_the_whole_stream(kwargs, replicas, data):
    template = StaticMixtureWorkSource(**kwargs)
    lanes = [template.clone_for_lane(lane, replicas) for lane in range(replicas)]
    assert len(template) == sum(len(lane) for lane in lanes) == len(template.clone_for_lane(0, 1))


@given(source_configs(), st.integers(0, 40))
def test_remaining_samples_after_a_restore(kwargs, cut):
    source = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1)
    consumed = sum(len(chunk) for chunk in collect(source, cut))
    restored = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1)
    restored.load_state_dict(json.loads(json.dumps(source.state_dict())))
    assert restored.remaining_samples() == len(source) - consumed
    assert restored.remaining_samples() == sum(len(chunk) for chunk in collect(restored, 10**6))


def test_infinite_sources_are_not_indexable_but_capped_ones_are():
    infinite = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10,
                                       exhausted_policy="repeat")
    assert not infinite.supports_indexing()
    with pytest.raises(TypeError, match="repeats forever"):
        len(infinite)
    with pytest.raises(TypeError):
        PointerSequence(infinite)
    capped = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10,
                                     exhausted_policy="repeat", max_repeats={"web": 1})
    assert capped.supports_indexing() and len(capped) > 0


def test_out_of_range_and_bad_indices():
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10)
    n = len(source)
    for bad in (-1, n, n + 5):
        with pytest.raises(IndexError):
            source.sample_id_at(bad)
    with pytest.raises(IndexError):
        source.sample_ids_at([0, n])
    with pytest.raises(TypeError):
        source.sample_id_at(1.0)
    with pytest.raises(TypeError):
        source.sample_ids_at([[1, 2]])


def test_pointer_sequence_is_a_map_style_view():
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10)
    view = PointerSequence(source)
    stream = stream_of(StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2},
                                               chunk_size=10).clone_for_lane(0, 1))
    assert len(view) == len(stream) and view[0] == stream[0] and view[-1] == stream[-1]
    assert list(map(tuple, view[5:25:3].tolist())) == stream[5:25:3]
    assert list(map(tuple, view[[3, 1, 3]].tolist())) == [stream[3], stream[1], stream[3]]


def test_index_memory_is_small_per_chunk():
    big = [Dataset.from_counts("a", [10_000] * 1000), Dataset.from_counts("b", [20_000] * 500)]
    source = StaticMixtureWorkSource(big, {"a": 0.5, "b": 0.5}, chunk_size=1024)
    index = build_index(source.config)
    assert index.chunks > 10_000 and index.nbytes / index.chunks <= 16


def test_no_indices_give_no_samples():
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10)
    assert source.sample_ids_at([]).shape == (0, 3)
    assert PointerSequence(source)[5:5].shape == (0, 3)


@given(source_configs(allocations="accumulator"))
def test_a_forked_allocator_is_indexable_too(kwargs):
    forked = StaticMixtureWorkSource(**dict(kwargs, allocation=_Fork())).clone_for_lane(0, 1)
    expected = stream_of(StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1))
    assert forked.supports_indexing() and len(forked) == len(expected)
    picks = list(range(0, len(expected), 5))
    assert [forked.sample_id_at(i) for i in picks] == [expected[i] for i in picks]
    assert list(map(tuple, forked.sample_ids_at(picks).tolist())) == [expected[i] for i in picks]


@given(source_configs(), st.integers(1, 3), st.integers(1, 5), st.data())
def test_the_lookup_kernel_matches_its_twin(kwargs, replicas, every, data):
    """Random index sets (unsorted, with repeats), one at a time and batched, any snapshot spacing."""
    lane = data.draw(st.integers(0, replicas - 1))
    config = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas).config
    index = build_index(config, every=every)
    picks = data.draw(st.lists(st.integers(0, index.length - 1), max_size=30)) if index.length else []
    expected = [sample_at_reference(config, i) for i in picks]
    assert [sample_at(index, config, i) for i in picks] == expected
    assert list(map(tuple, samples_at(index, config, np.array(picks, dtype=np.int64)).tolist())) == expected


@given(source_configs(), st.data())
def test_lookups_survive_a_tiny_shape_cache(kwargs, data):
    """One cached shape and no byte budget: every new quota vector evicts the last one."""
    import zephon.core.index as index_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(index_module, "MAX_SHAPES", 1)
        patch.setattr(index_module, "SHAPE_BUDGET", 0)
        source = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1)
        picks = data.draw(st.lists(st.integers(0, len(source) - 1), min_size=1, max_size=60))
        expected = [sample_at_reference(source.config, i) for i in picks]
        assert list(map(tuple, source.sample_ids_at(picks).tolist())) == expected
        assert [source.sample_id_at(i) for i in picks] == expected
        assert index_module.lookup(source._stream_index(), source.config).shapes_cached == 1


def test_a_long_stream_with_short_chunks_agrees_with_iteration():
    """Thousands of snapshots (a two-pass radix sort), a drained dataset's short chunk (the
    snapshots stop being arithmetic), a block mosaic and within-shard shuffles."""
    def make():
        data = [Dataset.from_counts("a", [300] * 40), Dataset.from_counts("b", [7, 500, 90] * 10),
                Dataset.from_counts("c", [50] * 11)]
        return StaticMixtureWorkSource(data, {"a": 0.4, "b": 0.4, "c": 0.2}, chunk_size=7, shuffle_within_shard=True,
                                       shuffle_block_size=64, max_repeats={"a": 2, "c": 30},
                                       exhausted_policy={"a": "repeat", "b": "redistribute", "c": "repeat"})
    source, expected = make(), stream_of(make().clone_for_lane(0, 1))
    index = source._stream_index()
    assert len(source) == len(expected) and index.ints.shape[0] > 1000 and len(source) < 7 * index.chunks
    order = np.random.default_rng(0).permutation(len(source))
    assert list(map(tuple, source.sample_ids_at(order).tolist())) == [expected[i] for i in order]
    assert [source.sample_id_at(int(i)) for i in order[:2000]] == [expected[i] for i in order[:2000]]


def test_a_pickled_source_rebuilds_its_lookup():
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10)
    picks = np.random.default_rng(1).integers(0, len(source), 50)
    expected = source.sample_ids_at(picks)
    copy = pickle.loads(pickle.dumps(source))
    cache.clear()  # as in a fresh worker process
    assert (copy.sample_ids_at(picks) == expected).all()


def test_threads_share_one_lookup():
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10)
    batches = [np.random.default_rng(seed).integers(0, len(source), 200) for seed in range(16)]
    expected = [source.sample_ids_at(batch) for batch in batches]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(source.sample_ids_at, batches))
    assert all((a == b).all() for a, b in zip(got, expected))


def test_a_lookup_in_a_collected_cycle_is_freed_safely():
    """The garbage collector must not clear a Lookup's scheduler before it is deallocated."""
    import zephon.core.index as index_module

    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10)
    index = source._stream_index()
    kernel = index_module.lookup(index, source.config)
    expected = kernel.sample_at(0)
    cache.clear()
    cycle = [kernel]
    cycle.append(cycle)
    del kernel, cycle
    gc.collect()
    assert source.sample_id_at(0) == expected
