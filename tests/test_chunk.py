"""WorkChunk: storage, read orders through every accessor, JSON state and validation."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.core.chunk import WorkChunk
from zephon.core.chunk_state import WorkChunkStateDict
from zephon.core.read_config import ComponentOrder, MixtureReadConfig, MixtureReadMode

ids = st.tuples(st.integers(0, 5), st.integers(0, 2**40), st.integers(0, 2**62))
names = st.text("abcxyz", min_size=1, max_size=3)
read_configs = st.builds(
    MixtureReadConfig,
    mode=st.sampled_from(MixtureReadMode),
    seed=st.none() | st.integers(-(2**64), 2**64),
    precompute=st.booleans(),
    within_component=st.sampled_from(ComponentOrder),
)


@st.composite
def chunks(draw: st.DrawFn) -> WorkChunk:
    """Chunks of up to 4 components (some empty); shrinks toward one empty component."""
    components = draw(st.dictionaries(names, st.lists(ids, max_size=12), min_size=1,
                                      max_size=4))
    as_array = draw(st.booleans())
    if as_array:
        components = {k: np.array(v, dtype=np.int64).reshape(-1, 3)
                      for k, v in components.items()}
    target = draw(st.none() | st.dictionaries(names, st.floats(0.1, 10), min_size=1))
    return WorkChunk(components, seed=draw(st.none() | st.integers(0, 2**64)),
                     target_mixture=target,
                     source_exhausted=draw(st.lists(names, unique=True, max_size=3)))


def small_chunk(**kwargs) -> WorkChunk:
    components = {
        "A": [(0, 0, i) for i in range(5)],
        "B": np.array([[1, 2, i] for i in range(3)], dtype=np.uint32),
        "empty": [],
        "C": [(2, 1, 0), (2, 1, 1)],
    }
    return WorkChunk(components, **kwargs)


# -- storage --------------------------------------------------------------------------


def test_components_keep_order_and_are_read_only_int64_views():
    chunk = small_chunk()
    assert chunk.component_names == ("A", "B", "empty", "C")
    assert list(chunk.components) == ["A", "B", "empty", "C"]
    assert chunk.counts == {"A": 5, "B": 3, "empty": 0, "C": 2}
    assert len(chunk) == 10
    view = chunk.components["B"]
    assert view.dtype == np.int64 and view.shape == (3, 3)
    assert view.tolist() == [[1, 2, 0], [1, 2, 1], [1, 2, 2]]
    assert chunk.components["empty"].shape == (0, 3)
    with pytest.raises(ValueError):
        view[0, 0] = 7
    with pytest.raises(TypeError):
        chunk.components["D"] = view


def test_constructor_copies_its_input():
    array = np.array([[0, 0, 0], [0, 0, 1]])
    chunk = WorkChunk({"a": array})
    array[0, 0] = 9
    assert chunk.components["a"][0, 0] == 0


def test_from_buffer_wraps_without_copying():
    buffer = np.arange(18, dtype=np.int64).reshape(6, 3)
    chunk = WorkChunk.from_buffer(["a", "b", "c"], buffer, np.array([2, 0, 4]), seed=3)
    assert np.shares_memory(chunk.components["c"], buffer)
    assert not chunk.components["a"].flags.writeable
    assert chunk == WorkChunk({"a": buffer[:2], "b": [], "c": buffer[2:]}, seed=3)


def test_mixture_is_the_count_share_of_non_empty_components():
    assert small_chunk().mixture == {"A": 0.5, "B": 0.3, "C": 0.2}
    assert WorkChunk({"a": []}).mixture == {}


def test_target_mixture_is_normalised_in_the_given_order():
    chunk = small_chunk(target_mixture={"C": 3, "A": 1.0, "Z": 0})
    assert chunk.target_mixture == {"C": 0.75, "A": 0.25, "Z": 0.0}
    assert list(chunk.target_mixture) == ["C", "A", "Z"]
    assert small_chunk().target_mixture is None


@settings(max_examples=100, deadline=None)
@given(weights=st.dictionaries(names, st.floats(0, 1e6), min_size=1).filter(
    lambda w: sum(w.values()) > 0))
def test_normalising_a_target_twice_changes_nothing(weights):
    once = WorkChunk({}, target_mixture=weights).target_mixture
    assert math.isclose(sum(once.values()), 1.0)
    assert WorkChunk({}, target_mixture=once).target_mixture == once


def test_source_exhausted_is_stored_sorted():
    assert small_chunk(source_exhausted=["web", "code"]).source_exhausted == ("code", "web")


def test_equality_and_repr():
    assert small_chunk(seed=1) == small_chunk(seed=1)
    assert small_chunk(seed=1) != small_chunk(seed=2)
    assert small_chunk() != WorkChunk({"A": [(0, 0, i) for i in range(5)]})
    assert small_chunk() != "chunk"
    assert repr(small_chunk(seed=4)) == (
        "WorkChunk(counts={'A': 5, 'B': 3, 'empty': 0, 'C': 2}, seed=4, "
        "target_mixture=None, source_exhausted=())"
    )


# -- read order -----------------------------------------------------------------------


def test_default_order_is_weighted_round_robin_as_is():
    order = small_chunk().materialize_order()
    assert "".join(name for _, name in order) == "ABCABACABA"
    assert [sample_id for sample_id, name in order if name == "A"] == [
        (0, 0, i) for i in range(5)
    ]


@settings(max_examples=100, deadline=None)
@given(chunk=chunks(), config=read_configs)
def test_every_accessor_gives_the_same_order(chunk, config):
    pointers, component = chunk.read_order(config)
    from_arrays = [(tuple(p), chunk.component_names[k])
                   for p, k in zip(pointers.tolist(), component.tolist())]
    assert list(chunk.iter_samples(config)) == from_arrays
    assert chunk.materialize_order(config) == from_arrays
    assert [chunk.sample_at(i, config) for i in range(len(chunk))] == from_arrays
    sample_ids = sorted(sample_id for sample_id, _ in from_arrays)
    assert sample_ids == sorted(map(tuple, np.concatenate(
        [np.empty((0, 3), np.int64), *chunk.components.values()]).tolist()))


@settings(max_examples=30, deadline=None)
@given(chunk=chunks())
def test_iteration_uses_the_default_config(chunk):
    assert list(chunk) == chunk.materialize_order(MixtureReadConfig())


def test_samples_are_plain_python_ints():
    (sample_id, name), *_ = small_chunk()
    assert type(sample_id) is tuple and {type(v) for v in sample_id} == {int}
    assert type(name) is str
    sample_id, _ = small_chunk().sample_at(3)
    assert {type(v) for v in sample_id} == {int}


def test_pairs_kept_while_iterating_keep_their_values():
    chunk = WorkChunk({"a": [(0, 7, i) for i in range(300, 320)],
                       "b": [(1, 9, i) for i in range(1000, 1013)]}, seed=3)
    for config in (MixtureReadConfig(), MixtureReadConfig(MixtureReadMode.WEIGHTED_RANDOM)):
        expected = chunk.materialize_order(config)
        assert [pair for i, pair in enumerate(chunk.iter_samples(config)) if i % 3] == [
            pair for i, pair in enumerate(expected) if i % 3]
        assert [sample_id for sample_id, _ in chunk.iter_samples(config)] == [
            sample_id for sample_id, _ in expected]
        assert [pair[0] for pair in chunk.iter_samples(config)] == [
            sample_id for sample_id, _ in expected]


def test_config_seed_defaults_to_the_chunk_seed_then_zero():
    shuffle = dict(mode=MixtureReadMode.WEIGHTED_RANDOM,
                   within_component=ComponentOrder.SHUFFLE)
    chunk = small_chunk(seed=5)
    assert (chunk.materialize_order(MixtureReadConfig(**shuffle))
            == chunk.materialize_order(MixtureReadConfig(seed=5, **shuffle)))
    assert (small_chunk().materialize_order(MixtureReadConfig(**shuffle))
            == chunk.materialize_order(MixtureReadConfig(seed=0, **shuffle)))


def test_random_orders_depend_on_the_seed():
    chunk = WorkChunk({"a": [(0, 0, i) for i in range(30)], "b": [(1, 0, i) for i in range(30)]})
    for mode, within in [(MixtureReadMode.WEIGHTED_RANDOM, ComponentOrder.AS_IS),
                         (MixtureReadMode.WEIGHTED_ROUND_ROBIN, ComponentOrder.SHUFFLE)]:
        orders = {tuple(chunk.materialize_order(MixtureReadConfig(mode, seed, False, within)))
                  for seed in range(10)}
        assert len(orders) == 10


@settings(max_examples=60, deadline=None)
@given(chunk=chunks(), config=read_configs, cached=st.booleans())
def test_read_order_into_writes_the_read_order(chunk, config, cached):
    """``read_order_into`` writes what ``read_order`` gives, whether the chunk cached it or not
    (and caches nothing itself)."""
    if cached:
        chunk.read_order(config)
    pointers, component = np.full((len(chunk), 3), -1, dtype=np.int64), np.full(len(chunk), -1, dtype=np.int64)
    chunk.read_order_into(pointers, component, config)
    assert cached or not chunk._orders
    want = chunk.read_order(config)
    assert pointers.tolist() == want[0].tolist() and component.tolist() == want[1].tolist()


@pytest.mark.parametrize("cached", [False, True])
def test_read_order_into_refuses_arrays_it_cannot_write_whole(cached):
    chunk = small_chunk()
    if cached:
        chunk.read_order()
    frozen = np.zeros((10, 3), dtype=np.int64)
    frozen.flags.writeable = False
    bad = [(np.zeros((9, 3), dtype=np.int64), "pointers"), (np.zeros((10, 3), dtype=np.int32), "pointers"),
           (np.asfortranarray(np.zeros((10, 3), dtype=np.int64)), "pointers"), (frozen, "pointers")]
    for pointers, name in bad:
        with pytest.raises(ValueError, match=f"{name}=array.*writable C-contiguous int64"):
            chunk.read_order_into(pointers, np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="component=array"):
        chunk.read_order_into(np.zeros((10, 3), dtype=np.int64), np.zeros(10, dtype=np.int32))


def test_read_order_is_cached_and_read_only():
    chunk = small_chunk()
    pointers, component = chunk.read_order()
    again = chunk.read_order(MixtureReadConfig(seed=9))  # the seed is unused here
    assert again[0] is pointers and again[1] is component
    assert pointers.shape == (10, 3) and pointers.dtype == component.dtype == np.int64
    with pytest.raises(ValueError):
        component[0] = 1


def test_precompute_keeps_the_pairs_and_hands_out_copies():
    chunk = small_chunk()
    config = MixtureReadConfig(precompute=True)
    order = chunk.materialize_order(config)
    order.clear()
    assert chunk.materialize_order(config) == chunk.materialize_order()


@pytest.mark.parametrize("i", [-1, 10, 11])
def test_sample_at_outside_the_chunk_raises_index_error(i):
    with pytest.raises(IndexError, match="sample_at"):
        small_chunk().sample_at(i)


# -- JSON state -----------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(chunk=chunks())
def test_state_round_trips_through_json(chunk):
    state = json.loads(json.dumps(chunk.state_dict()))
    assert list(state) == list(WorkChunkStateDict.__annotations__)
    restored = WorkChunk.from_state(state)
    assert restored == chunk
    assert restored.state_dict() == state
    assert restored.materialize_order() == chunk.materialize_order()


def test_state_dict_layout():
    state = small_chunk(seed=2, source_exhausted=["z"]).state_dict()
    assert state == {
        "kind": "zephon.WorkChunk",
        "version": 1,
        "components": {"A": [[0, 0, i] for i in range(5)],
                       "B": [[1, 2, i] for i in range(3)],
                       "empty": [],
                       "C": [[2, 1, 0], [2, 1, 1]]},
        "counts": {"A": 5, "B": 3, "empty": 0, "C": 2},
        "seed": 2,
        "target_mixture": None,
        "source_exhausted": ["z"],
    }


def _state(**changes) -> dict:
    state = small_chunk().state_dict()
    state.update(changes)
    return state


def _without(key: str) -> dict:
    state = _state()
    del state[key]
    return state


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ([], "must be a dict"),
        (_without("counts"), "lacks fields"),
        (_state(kind="other"), "kind"),
        (_state(version=2), "version"),
        (_state(version="1"), "version"),
        (_state(components=[]), "must be dicts"),
        (_state(components={"A": [[0, 0]]}, counts={"A": 1}), "components"),
        (_state(components={"A": [[0, 0, -1]]}, counts={"A": 1}), "components"),
        (_state(components={"A": [[0, True, 1]]}, counts={"A": 1}), "components"),
        (_state(components={"A": [[0, 0, 1.0]]}, counts={"A": 1}), "components"),
        (_state(components={"A": [[0, 0, 2**63]]}, counts={"A": 1}), "components"),
        (_state(components={"A": "0,0,0"}, counts={"A": 1}), "components"),
        (_state(counts={"A": 4, "B": 3, "empty": 0, "C": 2}), "does not match"),
        (_state(counts={"A": 5}), "does not match"),
        (_state(seed="3"), "seed"),
        (_state(target_mixture={"A": -1}), "target_mixture"),
        (_state(source_exhausted=["a", "a"]), "source_exhausted"),
    ],
)
def test_from_state_refuses_bad_states(state, match):
    with pytest.raises(ValueError, match=match):
        WorkChunk.from_state(state)


# -- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(components=[("a", [])]), TypeError, "components"),
        (dict(components={"": []}), TypeError, "component name"),
        (dict(components={3: []}), TypeError, "component name"),
        (dict(components={"a": [(0, 0)]}), ValueError, r"\(n, 3\)"),
        (dict(components={"a": [(0, 0, 1), (0, 1)]}), ValueError, "ragged"),
        (dict(components={"a": [(0, 0, 1.5)]}), TypeError, "not integer"),
        (dict(components={"a": np.zeros((2, 3), dtype=bool)}), TypeError, "not integer"),
        (dict(components={"a": "abc"}), TypeError, "not integer"),
        (dict(components={"a": [(0, -1, 0)]}), ValueError, "non-negative"),
        (dict(components={"a": np.full((1, 3), 2**63, dtype=np.uint64)}), ValueError,
         "non-negative"),
        (dict(components={}, seed=True), TypeError, "seed"),
        (dict(components={}, seed=1.0), TypeError, "seed"),
        (dict(components={}, target_mixture=[("a", 1)]), TypeError, "target_mixture"),
        (dict(components={}, target_mixture={"": 1}), TypeError, "target_mixture"),
        (dict(components={}, target_mixture={"a": True}), ValueError, "target_mixture"),
        (dict(components={}, target_mixture={"a": math.inf}), ValueError, "finite"),
        (dict(components={}, target_mixture={"a": math.nan}), ValueError, "finite"),
        (dict(components={}, target_mixture={"a": -0.5, "b": 1}), ValueError, ">= 0"),
        (dict(components={}, target_mixture={"a": "1"}), ValueError, "target_mixture"),
        (dict(components={}, target_mixture={"a": 0}), ValueError, "positive sum"),
        (dict(components={}, target_mixture={}), ValueError, "positive sum"),
        (dict(components={}, source_exhausted="web"), TypeError, "single string"),
        (dict(components={}, source_exhausted=3), TypeError, "source_exhausted"),
        (dict(components={}, source_exhausted=[""]), ValueError, "non-empty"),
        (dict(components={}, source_exhausted=["a", "a"]), ValueError, "repeats"),
    ],
)
def test_constructor_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        WorkChunk(**kwargs)


BUFFER = np.zeros((4, 3), dtype=np.int64)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((["a"], BUFFER.tolist(), [4]), TypeError, "C-contiguous"),
        ((["a"], BUFFER.astype(np.int32), [4]), TypeError, "int64"),
        ((["a"], BUFFER.T, [3]), TypeError, r"\(N, 3\)"),
        ((["a"], BUFFER[::2], [2]), TypeError, "C-contiguous"),
        ((["a"], np.zeros((4, 3, 1), np.int64), [4]), TypeError, r"\(N, 3\)"),
        (("ab", BUFFER, [2, 2]), TypeError, "not a str"),
        ((["a", "b"], BUFFER, [4]), ValueError, "one non-negative int per name"),
        ((["a", "b"], BUFFER, [5, -1]), ValueError, "non-negative"),
        ((["a", "b"], BUFFER, [2, 1]), ValueError, "summing to the 4"),
        ((["a", "b"], BUFFER, [2.0, 2]), ValueError, "int"),
        ((["a", "a"], BUFFER, [2, 2]), ValueError, "unique"),
        ((["a", ""], BUFFER, [2, 2]), TypeError, "non-empty"),
    ],
)
def test_from_buffer_refuses_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        WorkChunk.from_buffer(*args)


def test_from_buffer_validates_the_other_fields():
    with pytest.raises(TypeError, match="seed"):
        WorkChunk.from_buffer(["a"], BUFFER, [4], seed="1")
    with pytest.raises(ValueError, match="positive sum"):
        WorkChunk.from_buffer(["a"], BUFFER, [4], target_mixture={"a": 0})


@pytest.mark.parametrize("bad", ["weighted_random", 1, MixtureReadMode.WEIGHTED_RANDOM])
def test_accessors_refuse_a_config_of_the_wrong_type(bad):
    with pytest.raises(TypeError, match="MixtureReadConfig"):
        small_chunk().read_order(bad)


@pytest.mark.parametrize("i", [1.0, True, "1"])
def test_sample_at_refuses_a_non_int_position(i):
    with pytest.raises(TypeError, match="sample_at"):
        small_chunk().sample_at(i)
