"""The cursor and pass layout kernels against their definition, and what a pass must be."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon._ext import cursor as kernel
from zephon._ext.layout import ShardTable
from zephon.core.cursor import _detect_shape, epoch_layout, pointer_reference, shard_runs, take, take_at
from zephon.core.keys import DOMAIN_BLOCK, DOMAIN_SHARD_ORDER, DOMAIN_WITHIN_SHARD, purpose_key
from zephon.testing import datasets

BLOCK_SIZES = st.none() | st.integers(1, 120) | st.sampled_from(["auto", "global"])


@st.composite
def uniform_datasets(draw, max_shards=40, max_count=30):
    """Every shard has u > 0 rows except at most one, of any count (0, fewer, more)."""
    shards, u = draw(st.integers(1, max_shards)), draw(st.integers(1, max_count))
    counts = [u] * shards
    odd = draw(st.none() | st.integers(0, shards - 1))
    if odd is not None:
        counts[odd] = draw(st.integers(0, 3 * max_count))
    ids = draw(st.lists(st.integers(0, 10**6), min_size=shards, max_size=shards, unique=True))
    return Dataset.from_counts("u", counts, shard_ids=sorted(ids))


def _layouts(dataset):
    return st.fixed_dictionaries({
        "dataset": dataset.filter(lambda d: d.total() > 0),
        "seed": st.integers(-(2**70), 2**70),
        "shuffle_shards": st.booleans(),
        "shuffle_within_shard": st.booleans(),
        "shuffle_block_size": BLOCK_SIZES,
        "reshuffle_on_repeat": st.booleans(),
    })


layouts = _layouts(datasets(max_shards=8, max_count=50))
uniform_layouts = _layouts(uniform_datasets())


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


@given(layouts | uniform_layouts, st.integers(0, 3))
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


# -- uniform shards (O(1) layouts) and take_at ---------------------------------------------


@pytest.mark.parametrize("counts, shape", [
    ([5], (5, -1, 0)), ([5, 5, 5], (5, -1, 0)), ([0, 5], (5, 0, 0)), ([5, 0], (5, 1, 0)),
    ([3, 5, 5], (5, 0, 3)), ([5, 3, 5], (5, 1, 3)), ([5, 5, 9], (5, 2, 9)), ([3, 5], (3, 1, 5)),
    ([0], (0, -1, 0)), ([0, 0, 0], (0, -1, 0)), ([1, 2, 3], (0, -1, 0)), ([1, 2, 2, 1], (0, -1, 0)),
])
def test_uniform_shapes_are_detected(counts, shape):
    assert _detect_shape(np.array(counts, dtype=np.int64)) == shape


@given(uniform_layouts, st.integers(0, 3), st.booleans(), st.data())
def test_uniform_kernel_matches_reference(layout, epoch, materialise, data):
    config = _config(layout)
    assert epoch_layout(config, 0, epoch).uniform
    if materialise:
        epoch_layout(config, 0, epoch).materialise()
    total = config.datasets[0].total
    start = data.draw(st.integers(0, total - 1))
    count = data.draw(st.integers(1, min(total - start, 8)) | st.integers(1, total - start))
    expected = [pointer_reference(config, 0, epoch, p) for p in range(start, start + count)]
    assert list(map(tuple, _pass(config, epoch, start, count).tolist())) == expected




@given(st.one_of(layouts, uniform_layouts), st.integers(0, 3), st.data())
def test_take_at_matches_reference(layout, epoch, data):
    config = _config(layout)
    total = config.datasets[0].total
    positions = data.draw(st.lists(st.integers(0, total - 1), max_size=20))  # any order, repeats
    expected = [pointer_reference(config, 0, epoch, p) for p in positions]
    got = take_at(config, 0, epoch, np.array(positions, dtype=np.int64))
    assert got.shape == (len(positions), 3) and list(map(tuple, got.tolist())) == expected


def _kernel_layouts(config, epoch):
    """Fresh kernel layouts of one pass: uniform (arithmetic), uniform materialised, general tables."""
    plan, e = config.datasets[0], epoch if config.datasets[0].reshuffle_on_repeat else 0
    prefixes = [purpose_key(config.seed, d, 0) for d in (DOMAIN_SHARD_ORDER, DOMAIN_WITHIN_SHARD, DOMAIN_BLOCK)]
    flags = (config.shuffle_shards, config.shuffle_within_shard)
    shape = _detect_shape(plan.shard_counts)
    uniform = ShardTable(plan.shard_ids, plan.shard_counts, *shape, *flags, *prefixes, plan.block_size)
    general = ShardTable(plan.shard_ids, plan.shard_counts, 0, -1, 0, *flags, *prefixes, plan.block_size)
    materialised = uniform.layout(e)
    materialised.materialise()
    return uniform.layout(e), materialised, general.layout(e)


@given(st.one_of(layouts, uniform_layouts), st.integers(0, 3), st.data())
def test_every_layout_of_a_pass_matches_reference(layout, epoch, data):
    # The layout kernel's three forms of one pass (arithmetic, materialised, general tables),
    # each read at any positions and over a range.
    config = _config(layout)
    total = config.datasets[0].total
    positions = data.draw(st.lists(st.integers(0, total - 1), max_size=20))
    start = data.draw(st.integers(0, total - 1))
    count = data.draw(st.integers(1, total - start))
    forms = _kernel_layouts(config, epoch)
    assert forms[1].materialised and forms[2].materialised and not forms[2].uniform
    for form in forms:
        picked, read = np.empty((len(positions), 3), dtype=np.int64), np.empty((count, 3), dtype=np.int64)
        assert kernel.take_at(picked, 0, form, np.array(positions, dtype=np.int64)) == -1
        kernel.take(read, 0, 0, form, start, count)
        assert list(map(tuple, picked.tolist())) == [pointer_reference(config, 0, epoch, p) for p in positions]
        assert list(map(tuple, read.tolist())) == [pointer_reference(config, 0, epoch, p)
                                                   for p in range(start, start + count)]


@pytest.mark.parametrize("odd, odd_count", [(None, 0), (0, 0), (137, 5), (299, 80), (137, 0), (299, 7)])
@pytest.mark.parametrize("block", [None, 50, "auto", "global"])
@pytest.mark.parametrize("shuffle_shards, within", [(False, False), (True, False), (False, True), (True, True)])
def test_uniform_layouts_agree_with_tables_on_many_shards(odd, odd_count, block, shuffle_shards, within):
    # 300 shards: small reads stay arithmetic (no tables); the kernel's materialised tables and
    # the general tables must give the same pass, and a few positions the reference.
    counts = [7] * 300
    if odd is not None:
        counts[odd] = odd_count
    data = Dataset.from_counts("d", counts, shard_ids=np.arange(300) * 3 + 1000)
    layout = {"dataset": data, "seed": 5, "shuffle_shards": shuffle_shards, "shuffle_within_shard": within,
              "shuffle_block_size": block, "reshuffle_on_repeat": True}
    config = _config(layout)
    total = config.datasets[0].total
    arithmetic, materialised, general = _kernel_layouts(config, 2)
    assert arithmetic.uniform and materialised.materialised and not general.uniform
    passes = [np.empty((total, 3), dtype=np.int64) for _ in range(3)]
    for start in range(0, total, 40):  # 40 positions: too few to materialise 300 shards
        kernel.take(passes[0], start, 0, arithmetic, start, min(40, total - start))
    kernel.take(passes[1], 0, 0, materialised, 0, total)
    kernel.take(passes[2], 0, 0, general, 0, total)
    assert not arithmetic.materialised
    assert (passes[0] == passes[2]).all() and (passes[1] == passes[2]).all()
    positions = np.random.default_rng(odd_count).permutation(np.repeat(np.arange(total), 2))
    picked = np.empty((len(positions), 3), dtype=np.int64)
    for at in range(0, len(positions), 50):
        assert kernel.take_at(picked[at:at + 50], 0, arithmetic, positions[at:at + 50]) == -1
    assert not arithmetic.materialised and (picked == passes[2][positions]).all()
    assert (take_at(config, 0, 2, positions) == passes[2][positions]).all()
    for p in (0, total - 1):
        assert tuple(passes[2][p]) == pointer_reference(config, 0, 2, p)


def test_uniform_layouts_are_constant_size():
    big = Dataset.from_counts("big", np.full(100_000, 10_000))
    config = StaticMixtureWorkSource([big], {"big": 1}, chunk_size=4, shuffle_within_shard=True,
                                     stop_after_passes=1).config
    out = np.empty((1000, 3), dtype=np.int64)
    for epoch in range(50):
        take(out, 0, config, 0, epoch, 10**9 - 1000, 1000)
        layout = epoch_layout(config, 0, epoch)
        assert layout.uniform and not layout.materialised  # no block mosaic: never any table
    assert tuple(out[-1]) == pointer_reference(config, 0, 49, 10**9 - 1)


@given(st.one_of(layouts, uniform_layouts), st.integers(0, 3), st.data())
def test_shard_runs_encode_the_reference_shards(layout, epoch, data):
    config = _config(layout)
    total = config.datasets[0].total
    position = data.draw(st.integers(0, total))
    count = data.draw(st.integers(0, total - position))
    ends, ids = shard_runs(config, 0, epoch, position, count)
    shards = [pointer_reference(config, 0, epoch, p)[1] for p in range(position, position + count)]
    expected_ends = [j + 1 for j in range(count) if j + 1 == count or shards[j + 1] != shards[j]]
    assert ends.tolist() == expected_ends and ids.tolist() == [shards[e - 1] for e in expected_ends]


def test_take_at_checks_its_arguments():
    config = _config({"dataset": Dataset.from_counts("d", [4, 4, 4]), "seed": 1, "shuffle_shards": True,
                      "shuffle_within_shard": True, "shuffle_block_size": None, "reshuffle_on_repeat": True})
    out = np.full((2, 3), -1, dtype=np.int64)
    assert take_at(config, 0, 0, [11, 0], out=out) is out
    assert list(map(tuple, out.tolist())) == [pointer_reference(config, 0, 0, p) for p in (11, 0)]
    assert take_at(config, 0, 0, []).shape == (0, 3)
    for bad in ([12], [0, -1]):
        with pytest.raises(ValueError, match="outside pass"):
            take_at(config, 0, 0, bad, out=np.empty((len(bad), 3), dtype=np.int64))
    with pytest.raises(ValueError, match="shape"):
        take_at(config, 0, 0, [1, 2], out=np.empty((3, 3), dtype=np.int64))


def test_layouts_survive_pickling():
    import pickle

    config = _config({"dataset": Dataset.from_counts("d", [9] * 20 + [3]), "seed": 2, "shuffle_shards": True,
                      "shuffle_within_shard": True, "shuffle_block_size": 30, "reshuffle_on_repeat": True})
    layout = epoch_layout(config, 0, 1)
    copy = pickle.loads(pickle.dumps(layout))
    a, b = np.empty((183, 3), dtype=np.int64), np.empty((183, 3), dtype=np.int64)
    kernel.take(a, 0, 0, layout, 0, 183)
    kernel.take(b, 0, 0, copy, 0, 183)
    assert (a == b).all()
