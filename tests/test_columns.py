"""Loader states store their lanes as columns: any per-lane values come back exactly (types and
float bits included), malformed columns are refused, and a lane costs a small constant."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.work import Phase, PhasedMixtureWorkSource
from zephon.core.checkpoint import canonical, sealed
from zephon.runtime import make_state, parse_state
from zephon.runtime._columns import assembled, decode, encode, encode_fields, getters, leaves, select, values
from zephon.runtime._state import dataset_fingerprints

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=4),
                    st.floats(allow_nan=False))  # infinities go in plain lists
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                           max_leaves=8)


@st.composite
def alike(draw: st.DrawFn) -> list:
    """Lanes' values of one shape (as lanes' source states are), leaves drawn per lane."""
    n = draw(st.integers(0, 6))
    keys = draw(st.lists(st.text(max_size=3), min_size=1, max_size=3, unique=True))
    leaf = draw(st.sampled_from([st.integers(0, 10), st.integers(-5, 5).map(lambda k: 3 + 2 * k),
                                 st.floats(allow_nan=False, allow_infinity=False), st.just(0.0),
                                 st.lists(st.floats(-1, 1), min_size=2, max_size=2), st.just("x"), scalars]))
    return [{key: draw(leaf) for key in keys} for _ in range(n)]


@given(st.one_of(st.lists(json_values, max_size=6), alike(), st.lists(st.integers(), max_size=5)))
def test_columns_give_back_exactly_what_went_in(values):
    column = encode(values)
    back = decode(json.loads(json.dumps(column)), len(values), "c")
    assert canonical(back) == canonical(values)  # 1, 1.0 and True differ here, as do 0.0 and -0.0


@given(st.one_of(st.lists(json_values, min_size=1, max_size=6), alike().filter(bool)), st.data())
def test_some_lanes_field_by_field_are_those_lanes_one_by_one(lanes, data):
    """``values`` and ``select`` read the lanes ``ks`` of a column at once: as ``assembled``
    reads them lane by lane (``select`` keeps the fields apart)."""
    tree = getters(json.loads(json.dumps(encode(lanes))), len(lanes), "c")
    ks = data.draw(st.lists(st.integers(0, len(lanes) - 1), max_size=8))
    one_by_one = [assembled(tree)(k) for k in ks]
    assert canonical(values(tree, ks)) == canonical(one_by_one)
    assert canonical(by_lane(select(tree, ks), len(ks))) == canonical(one_by_one)


@given(alike().filter(bool), st.booleans(), st.data())
def test_a_column_made_field_by_field_is_the_column_of_the_dicts(lanes, nested, data):
    """``encode_fields`` of the lanes' values field by field (dicts nested in them too) is
    ``encode`` of the lanes' dicts."""
    if nested:
        inner = st.fixed_dictionaries({"a": st.integers(0, 3), "b": st.floats(allow_nan=False)})
        lanes = [{**lane, "nested": x} for lane, x in zip(lanes, data.draw(st.lists(inner, min_size=len(lanes),
                                                                                        max_size=len(lanes))))]
    assert canonical(encode_fields(fields_of(lanes))) == canonical(encode(lanes))


def fields_of(lanes):
    """The lanes' dicts field by field, as deep as every lane has a dict of the same keys."""
    if lanes and all(type(lane) is dict for lane in lanes) and lanes[0] and \
            all(lane.keys() == lanes[0].keys() for lane in lanes):
        return {key: fields_of([lane[key] for lane in lanes]) for key in lanes[0]}
    return list(lanes)


def by_lane(fields, count):
    """``select``'s fields (a dict of fields, or the lanes' values) as the lanes' values."""
    if not isinstance(fields, dict):
        return fields
    columns = {key: by_lane(value, count) for key, value in fields.items()}
    return [{key: column[i] for key, column in columns.items()} for i in range(count)]


def test_alike_lanes_are_stored_by_field_and_step():
    values = [{"lane": k, "epoch": 0, "alloc": [0.1 * k, -0.0]} for k in range(4)]
    column = encode(values)
    assert column["fields"]["lane"] == {"start": 0, "step": 1} and column["fields"]["epoch"] == {"same": 0}
    assert set(column["fields"]["alloc"]) == {"float64", "width"}


@pytest.mark.parametrize("column,match", [
    ([1, 2], "2 values for 3 lanes"),
    ({"same": []}, "not a column"),
    ({"same": {"a": 1}}, "not a column"),
    ({"same": [1.0, float("inf")]}, "not a column"),
    ({"same": [type("Sub", (list,), {})([float("inf")])]}, "not a column"),  # a list subclass inside, in memory
    ({"start": 1.5, "step": 1}, "not a column"),
    ({"fields": {}}, "not a column"),
    ({"float64": "AAAA"}, "base64 of 3 float64"),
    ({"float64": encode([1.0, 2.0, 3.0])["float64"], "width": 0}, "width"),
    ({"float64": base64.b64encode(np.array([np.inf, 2.0, 3.0], "<f8").tobytes()).decode()}, "not finite"),
    ("abc", "a list or a dict"),
])
def test_malformed_columns_are_refused(column, match):
    with pytest.raises(ValueError, match=match):
        decode(column, 3, "c")


def test_a_lane_of_a_three_dataset_mixture_costs_under_120_bytes():
    datasets = [Dataset.from_counts(name, np.full(shards, rows, dtype=np.int64))
                for name, shards, rows in (("web", 100, 10**5), ("code", 50, 2 * 10**5), ("books", 20, 5 * 10**4))]
    template = StaticMixtureWorkSource(datasets, {"web": 0.6, "code": 0.3, "books": 0.1}, chunk_size=4096, seed=7,
                                       exhausted_policy="repeat")
    replicas, entries = 512, {}
    for lane in range(replicas):
        source = template.clone_for_lane(lane, replicas)
        for _ in range(lane % 3 + 1):  # lanes at different chunks, mid-chunk
            source.next_chunk()
        entries[lane] = (source.state_dict(), (lane * 7919) % 4096, lane % 2)
    state = make_state(replicas, entries, dataset_fingerprints(template.datasets_by_id), {})
    assert len(json.dumps(state)) / replicas <= 120
    assert dict(parse_state(json.loads(json.dumps(state))).entries) == entries


def _finite_json(value):
    return "Infinity" not in json.dumps(value) and "NaN" not in json.dumps(value)


@given(st.lists(json_values, min_size=1, max_size=4).filter(_finite_json), st.integers(1, 6))
def test_a_list_every_lane_has_is_kept_once(value, count):
    column = encode([json.loads(json.dumps(value)) for _ in range(count)])
    assert column == {"same": value}
    assert canonical(decode(json.loads(json.dumps(column)), count, "c")) == canonical([value] * count)


def test_a_lane_of_a_phased_mixture_costs_under_200_bytes():
    """A phased lane's state holds its phase's settings (a list per dataset): kept once."""
    datasets = [Dataset.from_counts(name, np.full(shards, rows, dtype=np.int64))
                for name, shards, rows in (("web", 100, 10**5), ("code", 50, 2 * 10**5), ("books", 20, 5 * 10**4))]
    weights = {"web": 0.6, "code": 0.3, "books": 0.1}
    template = PhasedMixtureWorkSource(datasets, [Phase(weights, until_chunk=2000), Phase({"web": 1, "code": 1})],
                                       chunk_size=4096, seed=7, exhausted_policy="repeat")
    replicas, entries = 512, {}
    for lane in range(replicas):
        source = template.clone_for_lane(lane, replicas)
        for _ in range(lane % 3 + 1):
            source.next_chunk()
        entries[lane] = (source.state_dict(), (lane * 7919) % 4096, lane % 2)
    state = make_state(replicas, entries, dataset_fingerprints(template.datasets_by_id), {})
    assert len(json.dumps(state)) / replicas <= 200
    assert dict(parse_state(json.loads(json.dumps(state))).entries) == entries


def test_a_list_that_decodes_to_more_values_than_a_state_holds_is_refused():
    state = make_state(2, {lane: ({"lane": lane, "x": 0}, 0, 0) for lane in range(2)}, [], {})
    state["lanes"].update(count=2**15, lane={"start": 0, "step": 1}, state={"fields": {"k": {"same": [0] * 1000}}})
    with pytest.raises(ValueError, match="more than a loader state holds"):
        parse_state(sealed(dict(state, canonical_replicas=2**15)))


def test_a_value_every_lane_has_counts_its_values_and_long_strings_per_lane():
    assert leaves({"same": [1, [2, 3], {"a": "x"}]}) == 7  # the list, 1, [2, 3], 2, 3, the dict, "x"
    assert leaves({"same": "x" * 6400}) == leaves({"same": ["x" * 6399]}) == 101


def test_a_state_that_decodes_to_more_values_than_a_state_holds_is_refused():
    state = make_state(2, {lane: ({"lane": lane, "x": 0}, 0, 0) for lane in range(2)}, [], {})
    state["lanes"].update(count=2**22, lane={"start": 0, "step": 1}, state={"fields": {f"k{k}": {"same": 0} for k in
                                                                                       range(8)}})
    with pytest.raises(ValueError, match="more than a loader state holds"):
        parse_state(sealed(dict(state, canonical_replicas=2**22)))
