"""Random access (SPEC §8): exact length and the i-th sample of the mixed, shuffled stream."""
import json

import numpy as np
import pytest
from helpers import three_datasets
from hypothesis import given
from hypothesis import strategies as st
from test_schedule import _Fork

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.index import build_index, sample_at
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


def test_batched_lookups_survive_colliding_shape_keys(monkeypatch):
    import zephon.core.index as index_module

    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=7,
                                     exhausted_policy={"web": "repeat", "code": "redistribute", "math": "repeat"},
                                     max_repeats={"web": 1, "math": 3})
    indices = np.arange(len(source))
    expected = source.sample_ids_at(indices)
    monkeypatch.setattr(index_module, "_shape_keys", lambda quotas: np.zeros(len(quotas), dtype=np.int64))
    assert (source.sample_ids_at(indices) == expected).all()
