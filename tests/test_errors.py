"""Every invalid argument of SPEC §1 raises at construction, naming the parameter."""
import math
import warnings

import numpy as np
import pytest
from helpers import three_datasets

from zephon import Dataset, StaticMixtureWorkSource
from zephon.work import MixtureSpec

MIX = {"web": 5, "code": 3, "math": 2}


def build(**overrides):
    kwargs = dict(datasets=three_datasets(), mixture=MIX, chunk_size=10)
    kwargs.update(overrides)
    return StaticMixtureWorkSource(**kwargs)


@pytest.mark.parametrize("overrides, error, words", [
    ({"mixture": {"web": 5, "code": 3}}, ValueError, "missing \\['math'\\]"),
    ({"mixture": {**MIX, "extra": 1}}, ValueError, "unknown \\['extra'\\]"),
    ({"mixture": {**MIX, "web": 0}}, ValueError, "'web'"),
    ({"mixture": {**MIX, "web": -1}}, ValueError, "'web'"),
    ({"mixture": {**MIX, "web": math.nan}}, ValueError, "'web'"),
    ({"mixture": {**MIX, "web": math.inf}}, ValueError, "'web'"),
    ({"mixture": {**MIX, "web": True}}, TypeError, "'web'"),
    ({"mixture": {**MIX, "web": "1"}}, TypeError, "'web'"),
    ({"mixture": {}}, ValueError, "non-empty"),
    ({"mixture": [("web", 1)]}, TypeError, "mixture must be"),
    ({"chunk_size": 0}, ValueError, "chunk_size"),
    ({"chunk_size": True}, TypeError, "chunk_size"),
    ({"chunk_size": 10.0}, TypeError, "chunk_size"),
    ({"seed": True}, TypeError, "seed"),
    ({"seed": 1.5}, TypeError, "seed"),
    ({"shuffle_shards": 1}, TypeError, "shuffle_shards"),
    ({"shuffle_within_shard": None}, TypeError, "shuffle_within_shard"),
    ({"shuffle_block_size": 0}, ValueError, "shuffle_block_size"),
    ({"shuffle_block_size": "big"}, ValueError, "shuffle_block_size"),
    ({"shuffle_block_size": 2.5}, TypeError, "shuffle_block_size"),
    ({"exhausted_policy": "again"}, ValueError, "exhausted_policy"),
    ({"exhausted_policy": {"nope": "stop"}}, ValueError, "unknown datasets"),
    ({"reshuffle_on_repeat": "yes"}, TypeError, "reshuffle_on_repeat"),
    ({"max_repeats": -1}, ValueError, "max_repeats"),
    ({"max_repeats": True}, TypeError, "max_repeats"),
    ({"max_repeats": {"nope": 1}}, ValueError, "unknown datasets"),
    ({"stop_after_passes": 0}, ValueError, "stop_after_passes"),
    ({"stop_after_passes": 2, "exhausted_policy": "stop"}, ValueError, "stop_after_passes"),
    ({"stop_after_passes": 2, "max_repeats": 1}, ValueError, "max_repeats"),
    ({"lane_assignment": "random"}, ValueError, "lane_assignment"),
    ({"allocation": "greedy"}, ValueError, "allocation"),
    ({"allocation": object()}, TypeError, "allocation"),
    ({"allocation": "fixed", "mixture": {"web": 1000, "code": 1, "math": 1}}, ValueError, "fixed"),
    ({"datasets": []}, ValueError, "datasets"),
    ({"datasets": [1, 2]}, TypeError, "datasets"),
    ({"datasets": three_datasets() + [Dataset.from_counts("web", [5])]}, ValueError, "unique"),
    ({"chunk_size": 2000}, ValueError, "repeats but holds"),
])
def test_bad_arguments_raise_naming_the_parameter(overrides, error, words):
    with pytest.raises(error, match=words):
        build(**overrides)


def test_liveness_uses_ceil_plus_one_for_fractional_shares():
    data = [Dataset.from_counts("a", [1000]), Dataset.from_counts("b", [4])]
    StaticMixtureWorkSource(data, {"a": 2, "b": 1}, chunk_size=9)  # b: x = 3 exactly, 4 >= 3
    with pytest.raises(ValueError, match="'b'"):
        StaticMixtureWorkSource(data, {"a": 2, "b": 1}, chunk_size=10)  # x = 3.33: needs 5


def test_empty_datasets():
    empty = Dataset.from_counts("empty", [0, 0])
    full = Dataset.from_counts("full", [100])
    with pytest.raises(ValueError, match="every dataset is empty"):
        StaticMixtureWorkSource([empty], {"empty": 1}, exhausted_policy="redistribute")
    with pytest.raises(ValueError, match="'empty' is empty"):
        StaticMixtureWorkSource([empty, full], {"empty": 1, "full": 1}, chunk_size=2, exhausted_policy="stop")
    with pytest.raises(ValueError, match="every shard is empty"):
        StaticMixtureWorkSource([empty], {"empty": 1}, shuffle_block_size="auto", exhausted_policy="redistribute")


def test_policy_defaults_follow_the_seed_table():
    assert build().config.stop_after_passes == 1 and {d.policy for d in build().config.datasets} == {"repeat"}
    assert build(exhausted_policy="repeat").config.stop_after_passes is None
    stop = build(exhausted_policy="stop").config
    assert stop.stop_after_passes is None and {d.policy for d in stop.datasets} == {"stop"}
    assert build(stop_after_passes=3).config.stop_after_passes == 3
    mixed = build(exhausted_policy={"web": "redistribute"}).config
    assert [d.policy for d in mixed.datasets] == ["redistribute", "stop", "stop"]


def test_settings_without_effect_warn():
    with pytest.warns(RuntimeWarning, match="max_repeats"):
        build(exhausted_policy="stop", max_repeats=2)
    with pytest.warns(RuntimeWarning, match="reshuffle_on_repeat"):
        build(exhausted_policy="stop", reshuffle_on_repeat=False)
    with pytest.warns(RuntimeWarning, match="never repeats"):
        build(exhausted_policy="repeat", max_repeats=0, reshuffle_on_repeat=False)
    with pytest.warns(RuntimeWarning, match="no shuffle"):
        build(exhausted_policy="repeat", shuffle_shards=False, shuffle_block_size=1, reshuffle_on_repeat=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(exhausted_policy="repeat", max_repeats=2, reshuffle_on_repeat=False)


def test_block_sizes_are_resolved_per_dataset():
    sizes = lambda value: [d.block_size for d in build(shuffle_block_size=value).config.datasets]
    totals = [d.total() for d in three_datasets()]
    assert sizes("global") == totals
    assert sizes("auto") == [min(800, t) for t in totals]
    assert sizes(300) == [min(300, t) for t in totals]


@pytest.mark.parametrize("make, error", [
    (lambda: Dataset.from_counts("d", [1, -1]), ValueError),
    (lambda: Dataset.from_counts("d", [1, 2], shard_ids=[3, 3]), ValueError),
    (lambda: Dataset.from_counts("d", [1, 2], shard_ids=[3]), ValueError),
    (lambda: Dataset.from_counts("d", [1.5]), TypeError),
    (lambda: Dataset.from_counts("", [1]), ValueError),
    (lambda: MixtureSpec({"a": 0}), ValueError),
])
def test_bad_datasets_raise(make, error):
    with pytest.raises(error):
        make()


def test_datasets_sort_shards_by_id_and_report_sizes():
    d = Dataset.from_counts("d", [5, 7, 0], shard_ids=[9, 2, 4])
    assert d.ids().tolist() == [2, 4, 9] and d.counts().tolist() == [7, 0, 5]
    assert (d.total(), d.max_count(), d.shard_count(), len(d)) == (12, 7, 3, 12)
    assert not d.ids().flags.writeable
    records = Dataset.from_records("r", [["a", "b"], ["c"]])
    assert records.read(0, [1, 0]) == ["b", "a"] and records.read(1, [0]) == ["c"]
    with pytest.raises(IndexError):
        records.read(1, [1])
    with pytest.raises(TypeError, match="count-only"):
        d.read(2, [0])


def test_a_million_shards_construct_quickly():
    big = Dataset.from_counts("big", np.full(10**6, 3))
    source = StaticMixtureWorkSource([big], {"big": 1}, chunk_size=1024)
    assert source.clone_for_lane(0, 1).next_chunk() is not None
