"""The cursor kernel against its definition, and what a pass must be."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.cursor import pointer_reference, take
from zephon.testing import datasets

layouts = st.fixed_dictionaries({
    "dataset": datasets(max_shards=8, max_count=50).filter(lambda d: d.total() > 0),
    "seed": st.integers(-(2**70), 2**70),
    "shuffle_shards": st.booleans(),
    "shuffle_within_shard": st.booleans(),
    "shuffle_block_size": st.none() | st.integers(1, 120) | st.sampled_from(["auto", "global"]),
    "reshuffle_on_repeat": st.booleans(),
})


def _config(layout):
    return StaticMixtureWorkSource(
        [layout["dataset"]], {layout["dataset"].name: 1.0}, chunk_size=1, seed=layout["seed"],
        shuffle_shards=layout["shuffle_shards"], shuffle_within_shard=layout["shuffle_within_shard"],
        shuffle_block_size=layout["shuffle_block_size"], reshuffle_on_repeat=layout["reshuffle_on_repeat"],
        stop_after_passes=1,
    ).config


def _pass(config, epoch, start=0, count=None):
    total = config.datasets[0].total
    count = total - start if count is None else count
    out = np.full((count, 3), -1, dtype=np.int64)
    take(out, 0, config, 0, epoch, start, count)
    return out


@given(layouts, st.integers(0, 3), st.data())
def test_kernel_matches_reference(layout, epoch, data):
    config = _config(layout)
    total = config.datasets[0].total
    start = data.draw(st.integers(0, total - 1))
    count = data.draw(st.integers(1, total - start))
    expected = [pointer_reference(config, 0, epoch, p) for p in range(start, start + count)]
    assert list(map(tuple, _pass(config, epoch, start, count).tolist())) == expected


@given(layouts, st.integers(0, 3))
def test_every_pass_emits_each_sample_once(layout, epoch):
    config = _config(layout)
    plan = config.datasets[0]
    emitted = sorted(map(tuple, _pass(config, epoch).tolist()))
    expected = sorted((0, int(s), o) for s, n in zip(plan.shard_ids, plan.shard_counts) for o in range(n))
    assert emitted == expected


@given(layouts, st.integers(1, 4))
def test_reshuffle_off_repeats_pass_zero(layout, epoch):
    layout = dict(layout, reshuffle_on_repeat=False)
    config = _config(layout)
    assert (_pass(config, epoch) == _pass(config, 0)).all()


@given(layouts, st.integers(0, 3), st.data())
def test_reading_in_pieces_equals_reading_at_once(layout, epoch, data):
    config = _config(layout)
    total = config.datasets[0].total
    cut = data.draw(st.integers(0, total))
    pieces = np.concatenate([_pass(config, epoch, 0, cut), _pass(config, epoch, cut)])
    assert (pieces == _pass(config, epoch)).all()


def test_reshuffle_on_gives_new_orders():
    layout = {"dataset": Dataset.from_counts("d", [50] * 6), "seed": 1, "shuffle_shards": True,
              "shuffle_within_shard": True, "shuffle_block_size": "auto", "reshuffle_on_repeat": True}
    config = _config(layout)
    passes = [_pass(config, e) for e in range(4)]
    for a in range(4):
        for b in range(a + 1, 4):
            assert (passes[a] != passes[b]).any(axis=1).mean() > 0.9


def test_datasets_with_identical_layouts_get_different_orders():
    data = [Dataset.from_counts(n, [30] * 8) for n in ("a", "b")]
    config = StaticMixtureWorkSource(data, {"a": 1, "b": 1}, chunk_size=2, seed=3, shuffle_within_shard=True).config
    out = [np.empty((240, 3), dtype=np.int64) for _ in range(2)]
    for d in range(2):
        take(out[d], 0, config, d, 0, 0, 240)
    assert (out[0][:, 1:] != out[1][:, 1:]).any(axis=1).mean() > 0.9


@pytest.mark.parametrize("block", [None, 1000, "auto", "global"])
def test_kernel_matches_reference_on_shards_with_thousands_of_rows(block):
    # Hypothesis layouts stay below the 64-element floor; here the batched lanes, the rare
    # cycle walks, the branchless search and empty and one-row shards all take part.
    counts = [5000, 0, 1, 3000, 7919, 64, 65, 2000] * 3
    layout = {"dataset": Dataset.from_counts("d", counts), "seed": 11, "shuffle_shards": True,
              "shuffle_within_shard": True, "shuffle_block_size": block, "reshuffle_on_repeat": True}
    config = _config(layout)
    total = config.datasets[0].total
    for start, count in ((0, 700), (total // 2 - 333, 1500), (total - 257, 257)):
        expected = [pointer_reference(config, 0, 1, p) for p in range(start, start + count)]
        assert list(map(tuple, _pass(config, 1, start, count).tolist())) == expected


def test_global_shuffle_of_a_billion_samples_needs_no_materialisation():
    big = Dataset.from_counts("big", np.full(100_000, 10_000))
    config = StaticMixtureWorkSource([big], {"big": 1}, chunk_size=4, shuffle_block_size="global",
                                     shuffle_within_shard=True).config
    assert config.datasets[0].block_size == 10**9
    out = np.empty((1000, 3), dtype=np.int64)
    take(out, 0, config, 0, 0, 10**9 - 1000, 1000)
    expected = [pointer_reference(config, 0, 0, p) for p in (10**9 - 1000, 10**9 - 1)]
    assert [tuple(out[0]), tuple(out[-1])] == expected
