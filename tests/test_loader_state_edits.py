"""Every leaf of a loader checkpoint (plain, packed, strict ensure_mixture) edited and sealed
again: the restore refuses it naming the field, before anything changes, or the loader runs
on without a crash (a data-dependent check of a packed state may refuse it at the first batch,
naming the lane)."""
from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings, strategies as st

import zephon.torch as zt
from zephon import Pipeline
from zephon.core.checkpoint import sealed
from helpers import json_leaves
from test_packed_loader import pipeline, run

STRUCTURE = {"fields", "same", "start", "step", "float64", "width"}  # keys of the column encoding
HOSTILE = [-1, 0, 1, 2**63, "x", "", None, True, False, 1.5, [], {}, [0, 0, 0], {"a": 1}]


def _plain():
    return Pipeline(pipeline().source)


PIPELINES = {"plain": _plain, "pack": pipeline, "strict": lambda: pipeline(mode="strict")}
STATES = {kind: run(make(), cut=2)[1] for kind, make in PIPELINES.items()}


def edited(state, path, value):
    out = copy.deepcopy(state)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return sealed(out)


def names_the_field(message, path):
    keys = [key.rstrip("s") for key in path if isinstance(key, str) and key not in STRUCTURE]
    return any(key in message for key in keys) or "lane" in message


edits = st.sampled_from(sorted(PIPELINES)).flatmap(lambda kind: st.tuples(
    st.just(kind), st.sampled_from([p for p in json_leaves(STATES[kind]) if p != ("digest",)]), st.sampled_from(HOSTILE)))


@settings(max_examples=300, deadline=None)
@given(edits)
def test_an_edited_and_resealed_leaf_is_refused_naming_it_or_runs_on(edit):
    kind, path, value = edit
    loader = zt.DataLoader(PIPELINES[kind](), batch_size=3, canonical_replicas=4, even_batches=False)
    before = loader.state_dict()
    try:
        loader.load_state_dict(edited(STATES[kind], path, value))
    except ValueError as error:
        message = str(error)
        assert len(message) < 1000 and names_the_field(message, path), (path, value, message)
        assert loader.state_dict() == before
        return
    try:
        batches = list(loader)
    except ValueError as error:  # a packed state's documents are checked as they are read
        assert kind != "plain" and str(error).startswith("lane "), (path, value, error)
        return
    assert len(batches) < 100
    assert all(len(batch["input_ids" if kind != "plain" else "_sample_id"]) <= 3 for batch in batches)


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_every_leaf_given_another_type_is_refused_or_changes_nothing(kind):
    """A value of another JSON type is never taken for the one written (True is not 1)."""
    state = STATES[kind]
    for path in json_leaves(state):
        if path == ("digest",):
            continue
        node = state
        for key in path:
            node = node[key]
        other = "x" if not isinstance(node, str) else 7
        loader = zt.DataLoader(PIPELINES[kind](), batch_size=3, canonical_replicas=4, even_batches=False)
        with pytest.raises(ValueError):
            loader.load_state_dict(edited(state, path, other))
            list(loader)
