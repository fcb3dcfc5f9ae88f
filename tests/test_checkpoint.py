"""Checkpoints: plain JSON, small, O(1), and refused before anything changes when they do not fit."""
import copy
import json

import pytest
from helpers import three_datasets
from hypothesis import given
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core import cache
from zephon.core.checkpoint import canonical, sealed
from zephon.testing import sources

MIX = {"web": 5, "code": 3, "math": 2}


def lane(lane_id=0, replicas=2, **overrides):
    kwargs = dict(datasets=three_datasets(), mixture=MIX, chunk_size=10, exhausted_policy="repeat")
    kwargs.update(overrides)
    return StaticMixtureWorkSource(**kwargs).clone_for_lane(lane_id, replicas)


def advanced(chunks, **overrides):
    source = lane(**overrides)
    for _ in range(chunks):
        source.next_chunk()
    return source


def test_state_is_plain_json_of_constant_size():
    sizes = []
    for chunks in (0, 10, 1000):
        state = advanced(chunks).state_dict()
        assert json.loads(json.dumps(state)) == state
        sizes.append(len(json.dumps(state)))
    assert max(sizes) - min(sizes) < 40 and max(sizes) < 1200


def test_restore_continues_exactly_and_is_keyed_by_name():
    source = advanced(37)
    state = json.loads(json.dumps(source.state_dict()))
    assert set(state["state"]["cursors"]) == {"web", "code", "math"}
    fresh = lane()
    fresh.load_state_dict(state)
    assert fresh.state == source.state
    assert [fresh.next_chunk() for _ in range(5)] == [source.next_chunk() for _ in range(5)]


@pytest.mark.parametrize("target, words", [
    (lambda: lane(1, 2), "lane 0 of 2"),
    (lambda: lane(0, 3), "lane 0 of 2"),
    (lambda: lane(seed=1), "seed: checkpoint has 0, this source has 1"),
    (lambda: lane(chunk_size=11), "chunk_size"),
    (lambda: lane(mixture={"web": 5, "code": 3, "math": 3}), "weights"),
    (lambda: lane(shuffle_within_shard=True), "shuffle_within_shard"),
    (lambda: lane(shuffle_block_size="auto"), "block_sizes"),
    (lambda: lane(datasets=three_datasets(2)), "datasets"),
    (lambda: lane(lane_assignment="modulo"), "lane_assignment"),
    (lambda: lane(allocation="fixed"), "allocation"),
])
def test_mismatched_sources_refuse_the_checkpoint(target, words):
    state = advanced(5).state_dict()
    source = target()
    before = source.state
    with pytest.raises(ValueError, match=words):
        source.load_state_dict(state)
    assert source.state == before


def _corrupt(path, value):
    """A state with one value changed and its digest recomputed (so the content checks run)."""
    state = copy.deepcopy(advanced(5).state_dict())
    node = state
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return sealed(state)


@pytest.mark.parametrize("state", [
    None, [], {},
    _corrupt(["version"], 99),
    _corrupt(["kind"], "other"),
    _corrupt(["fingerprint"], KeyError),
    _corrupt(["state", "chunk_index"], -1),
    _corrupt(["state", "chunk_index"], 1.0),
    _corrupt(["state", "chunk_index"], True),
    _corrupt(["state", "alloc"], [0.0]),
    _corrupt(["state", "alloc"], [0.0, "x", 0.0]),
    _corrupt(["state", "alloc"], [0.0, float("nan"), 0.0]),
    _corrupt(["state", "alloc"], [3.5, -3.5, 0.0]),
    _corrupt(["state", "alloc"], [1e20, 0.0, 0.0]),
    _corrupt(["state", "cursors", "web"], KeyError),
    _corrupt(["state", "cursors", "web", "position"], 10**6),
    _corrupt(["state", "cursors", "web", "epoch"], -2),
    _corrupt(["state", "cursors", "web", "extra"], 1),
    _corrupt(["state", "extra"], 1),
])
def test_malformed_checkpoints_are_refused(state):
    source = lane()
    before = source.state
    with pytest.raises(ValueError):
        source.load_state_dict(state)
    assert source.state == before


def test_template_checkpoint_restores_into_a_template():
    template = StaticMixtureWorkSource(three_datasets(), MIX, chunk_size=10)
    other = StaticMixtureWorkSource(three_datasets(), MIX, chunk_size=10)
    other.load_state_dict(template.state_dict())
    with pytest.raises(ValueError, match="lane None of None"):
        lane().load_state_dict(template.state_dict())


def test_a_checkpoint_taken_before_the_data_changed_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(3):
        pq.write_table(pa.table({"id": list(range(i * 100, i * 100 + 100))}), tmp_path / f"part-{i}.parquet")
    make = lambda: StaticMixtureWorkSource([Dataset.from_path("files", tmp_path)], {"files": 1},
                                           chunk_size=8).clone_for_lane(0, 1)
    source = make()
    source.next_chunk()
    state = source.state_dict()
    make().load_state_dict(state)  # unchanged data restores
    pq.write_table(pa.table({"id": list(range(1000, 1100))}), tmp_path / "part-1.parquet")
    with pytest.raises(ValueError, match="different configuration: datasets"):
        make().load_state_dict(state)


@given(st.lists(st.tuples(sources(), st.integers(1, 6), st.integers(0, 5)), min_size=1, max_size=4))
def test_the_fingerprint_text_kept_for_a_source_is_each_lanes_own(drawn):
    """The canonical JSON of a config's fingerprint is kept once for all lanes of a source; for
    any lanes of any sources asked in turn, it is the text of that lane's own fingerprint."""
    for template, replicas, lane in drawn:
        config = template.clone_for_lane(lane % replicas, replicas).config
        assert cache.fingerprint_json(config, canonical) == canonical(config.fingerprint())
