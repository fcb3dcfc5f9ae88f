"""The column-wise check of many lanes' checkpoints (``zephon.core.lane_checks``, and
``zephon.work.phased_mixture.all_restore`` for phased sources) against the check it stands for:
each lane's clone's ``load_state_dict``."""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.core.checkpoint import KEY_DIGEST, KEY_STATE, canonical, sealed
from zephon.core.lane_checks import all_restore, first_lane
from zephon.limits import MAX_CHUNK_INDEX
from zephon.runtime._book import SEALING_SOURCES, _all_restore
from zephon.runtime._state import dataset_fingerprints, make_state, merge_states, parse_state, split_state
from zephon.testing import phased_sources, sources
from zephon.work import Phase, PhasedMixtureWorkSource
from helpers import json_leaves, three_datasets

POLICIES = st.sampled_from(["repeat", "stop", "redistribute"])
HOSTILE = [-1, 0, 1, 2, 10**6, 2**62, 2**62 + 1, 2**63, "x", None, True, False, 0.0, 1.0, 5.0, 0.5, -0.0, 1.5,
           float("nan"), [], {}, [0.0, 0.0], {"a": 1}]


def lane_states(template, replicas, draw):
    """Each lane's checkpoint, a drawn number of chunks in."""
    states = {}
    for lane in range(replicas):
        clone = template.clone_for_lane(lane, replicas)
        for _ in range(draw(st.integers(0, 4))):
            clone.next_chunk()
        states[lane] = clone.state_dict()
    return states


def loader_state(template, replicas, states):
    """The global loader state of the lanes' ``states``, as JSON text gives it back."""
    entries = {lane: (state, 0, 0) for lane, state in states.items()}
    made = make_state(replicas, entries, dataset_fingerprints(template.datasets_by_id), {}, sealed_by_source=True,
                      nested=SEALING_SOURCES[type(template)])
    return json.loads(json.dumps(made))


def any_sources(policies=POLICIES):
    return st.one_of(sources(policies=policies), phased_sources(policies=policies))


def _template(kind):
    """A repeating source of ``kind`` over three datasets (phased: two phases, the first 6 chunks long)."""
    if kind is StaticMixtureWorkSource:
        return kind(three_datasets(), {"web": 3, "code": 2, "math": 1}, chunk_size=8, exhausted_policy="repeat")
    return kind(three_datasets(), [Phase({"web": 1, "code": 1}, until_chunk=6), Phase({"math": 1})], chunk_size=8,
                exhausted_policy="repeat")


@st.composite
def global_states(draw):
    """A template and the global loader state of its lanes, each a drawn number of chunks in."""
    template, replicas = draw(any_sources()), draw(st.integers(2, 6))
    return template, loader_state(template, replicas, lane_states(template, replicas, draw))


@st.composite
def edited_states(draw, policies=POLICIES):
    """A template and a global state of its lanes in which one or two leaves of some lanes'
    checkpoints (or of every lane's alike) were changed, or a key added or taken away; the loader
    state's own digest is made again, as an edit would make it. Positions and headers are edited
    more often than settings, and numbers are moved next to their bounds."""
    template, replicas = draw(any_sources(policies)), draw(st.integers(2, 6))
    states = lane_states(template, replicas, draw)
    body = ("inner", KEY_STATE) if type(template) is PhasedMixtureWorkSource else (KEY_STATE,)
    original = copy.deepcopy(states)
    near = [v for d in template.config.datasets for v in (d.total - 1, d.total, d.total + 1)]  # bounds of cursors
    for _ in range(draw(st.integers(1, 2))):
        first = draw(st.integers(0, replicas - 1))
        where = [p for p in json_leaves(original[first]) if p != ("digest",)]
        kind = draw(st.sampled_from([KEY_STATE, "header", "any", "keys"]))
        if kind == "keys":  # a key (an item) added to, or taken from, a dict (a list) of the state
            path = draw(st.sampled_from([p[:k] for p in where for k in range(len(p))]))
            node = at(original[first], path)
            key = draw(st.sampled_from(["x", *node] if isinstance(node, dict) else [None]))
        else:
            chosen = [p for p in where if (p[:len(body)] == body if kind == KEY_STATE else
                                           len(p) <= len(body) or kind == "any")]
            path = draw(st.sampled_from(chosen or where))
        old = at(original[first], path)
        shifted = [old + draw(st.integers(-3, 3)), *near] if type(old) in (int, float) else []
        value = draw(st.sampled_from(shifted + HOSTILE))
        for lane in range(replicas) if draw(st.booleans()) else [first]:
            if kind == "keys":
                node = at(states[lane], path)
                if isinstance(node, dict):
                    node.pop(key) if key in node else node.__setitem__(key, 0)
                elif isinstance(node, list):
                    node.pop() if node and draw(st.booleans()) else node.append(0.0)
                continue
            parent = at(states[lane], path[:-1])
            if has(parent, path[-1]):
                parent[path[-1]] = value
    return template, loader_state(template, replicas, states)


def has(node, key):
    return isinstance(node, dict) and key in node or isinstance(node, list) and type(key) is int and key < len(node)


def at(value, path):
    """The node at ``path`` of ``value``; None where an edit cut the path off."""
    for key in path:
        value = value[key] if has(value, key) else None
    return value


def shown(template, state, lanes):
    parsed = parse_state(state)
    return _all_restore(template, parsed.entries, parsed.canonical_replicas, lanes)


def each_restores(template, state, lanes):
    parsed = parse_state(state)
    try:
        for lane in lanes:
            template.clone_for_lane(lane, parsed.canonical_replicas).load_state_dict(parsed.entries[lane][0])
    except (ValueError, TypeError, KeyError):
        return False
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(global_states(), st.data())
def test_a_written_state_is_shown_to_restore(made, data):
    template, state = made
    lanes = sorted(data.draw(st.sets(st.integers(0, state["canonical_replicas"] - 1), min_size=1)))
    assert each_restores(template, state, lanes)
    one_phase = type(template) is StaticMixtureWorkSource or "phase" in state["source"]
    assert shown(template, state, lanes) == one_phase  # one where all lanes are alike included


@settings(max_examples=50, deadline=None)
@given(global_states(), st.data())
def test_a_ledger_gives_some_lanes_unsealed_as_it_gives_them_one_by_one(made, data):
    _, state = made
    ledger = parse_state(state).entries
    lanes = sorted(data.draw(st.sets(st.sampled_from(sorted(ledger)), min_size=1)))
    plain = ledger.plain(lanes)
    for lane in lanes:
        unsealed = {key: value for key, value in ledger[lane][0].items() if key != KEY_DIGEST}
        for key in ledger.seals:  # the states nested in it lose their seals too
            unsealed[key] = {k: v for k, v in unsealed[key].items() if k != KEY_DIGEST}
        assert canonical(plain[lane]) == canonical((unsealed, *ledger[lane][1:]))


def assert_shown_only_where_each_restores(made):
    template, state = made
    lanes = list(range(state["canonical_replicas"]))
    if shown(template, state, lanes):
        assert each_restores(template, state, lanes)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edited_states())
def test_an_edited_state_is_shown_to_restore_only_where_each_lane_restores(made):
    assert_shown_only_where_each_restores(made)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edited_states(policies=st.just("redistribute")))
def test_the_same_where_chunks_may_draw_less_and_only_the_bounds_refuse(made):
    """Redistributing datasets turn off the check that the chunk index agrees with what the
    cursors read, which refuses most edits of a position: each bound is then on its own."""
    assert_shown_only_where_each_restores(made)


@pytest.mark.parametrize("chunks", [0, 1])  # 0: every lane's state is its first, and they are all alike
def test_a_loader_checks_a_global_state_by_columns_not_lane_by_lane(monkeypatch, chunks):
    template, replicas = StaticMixtureWorkSource(three_datasets(), {"web": 3, "code": 2, "math": 1}, chunk_size=8,
                                                 seed=3), 32
    states = {}
    for lane in range(replicas):
        clone = template.clone_for_lane(lane, replicas)
        for _ in range(chunks):
            clone.next_chunk()
        states[lane] = clone.state_dict()
    state = loader_state(template, replicas, states)
    restored = []
    monkeypatch.setattr(StaticMixtureWorkSource, "load_state_dict", lambda self, s: restored.append(s))
    zt.DataLoader(Pipeline(template), batch_size=4, canonical_replicas=replicas).load_state_dict(state)
    assert restored == []
    edited = copy.deepcopy(states)
    edited[5]["state"]["chunk_index"] += 1
    zt.DataLoader(Pipeline(template), batch_size=4, canonical_replicas=replicas).load_state_dict(
        loader_state(template, replicas, edited))
    assert len(restored) == replicas  # not shown: every lane is checked on its own, which names the fault


class _Strict:
    """An allocator of its own that refuses every checkpoint state."""

    name = "strict"

    def init(self, n):
        return [0.0] * n

    def allocate(self, state, weights, chunk_size):
        quotas = [chunk_size if c == 0 else 0 for c in range(len(weights))]
        return tuple(quotas), state

    def state_from_json(self, value, n):
        raise ValueError("strict: no state of mine")


@pytest.mark.parametrize("case", ["allocator of its own", "dataset name of 4.5 M characters"])
def test_what_the_column_check_does_not_know_is_left_to_each_lane(case):
    name = "d" * (64 * 70_000) if case.startswith("dataset") else "d"
    allocation = _Strict() if case.startswith("allocator") else "accumulator"
    template = StaticMixtureWorkSource([Dataset.from_counts(name, [50] * 4)], {name: 1.0}, chunk_size=4,
                                       exhausted_policy="repeat", allocation=allocation)
    state = loader_state(template, 4, lane_states(template, 4, lambda _: 1))  # a chunk each: the lanes differ
    assert "state" in state["lanes"]["state"]["fields"] and not each_restores(template, state, [0, 1, 2, 3])
    assert not shown(template, state, [0, 1, 2, 3])


@pytest.mark.parametrize("edit", ["chunk index past the largest", "an accumulator short, on every lane"])
def test_edits_that_only_one_bound_refuses_are_not_shown(edit):
    template = StaticMixtureWorkSource(three_datasets(), {"web": 3, "code": 2, "math": 1}, chunk_size=8,
                                       exhausted_policy="redistribute")  # no check that the cursors agree
    states = lane_states(template, 2, lambda _: 1)
    if edit.startswith("chunk"):
        states[1]["state"]["chunk_index"] = MAX_CHUNK_INDEX + 1
    else:
        for lane_state in states.values():
            lane_state["state"]["alloc"].pop()
    state = loader_state(template, 2, states)
    assert not each_restores(template, state, [0, 1]) and not shown(template, state, [0, 1])


@pytest.mark.parametrize("edit", ["a chunk index less", "an allocator state more", "a shared state beside the lanes' own"])
def test_columns_that_do_not_match_the_lanes_are_not_shown_to_restore(edit):
    template, replicas = StaticMixtureWorkSource(three_datasets(), {"web": 3, "code": 2, "math": 1}, chunk_size=8), 2
    state = loader_state(template, replicas, lane_states(template, replicas, lambda _: 1))  # a chunk each
    ledger = parse_state(state).entries
    fields, common = ledger.fields([0, 1]), dict(ledger.common)
    assert all_restore(template.config, common, fields, [0, 1], replicas)
    if edit == "a chunk index less":
        fields["state"]["chunk_index"] = fields["state"]["chunk_index"][:1]
    elif edit == "an allocator state more":
        fields["state"]["alloc"].append(fields["state"]["alloc"][0])
    else:
        common["state"] = first_lane(fields["state"])
    assert not all_restore(template.config, common, fields, [0, 1], replicas)


@pytest.mark.parametrize("policy, edit", [("repeat", None), ("repeat", "a cursor one on"),
                                          ("repeat", "a chunk before its phase"),
                                          ("redistribute", None), ("redistribute", "a chunk past its phase")])
def test_lanes_in_a_later_phase_are_checked_from_its_start(policy, edit):
    """Lanes in phase 1 of a phased source: their cursors have read a chunk's samples a chunk since
    the phase's start, and their chunks lie in it (with redistributing datasets, only that bound
    refuses a chunk index moved past the phase's end)."""
    phases = [Phase({"web": 1, "code": 1}, until_chunk=6), Phase({"web": 1, "math": 2}, until_chunk=40),
              Phase({"code": 1})]
    template = PhasedMixtureWorkSource(three_datasets(), phases, chunk_size=8, exhausted_policy=policy)
    states = lane_states(template, 4, lambda _: 4)
    assert {state["phase"] for state in states.values()} == {1}
    inner = states[2]["inner"]["state"]
    if edit == "a cursor one on":
        inner["cursors"]["web"]["position"] += 1
    elif edit is not None:
        inner["chunk_index"] = 5 if edit == "a chunk before its phase" else 41
    state = loader_state(template, 4, states)
    assert each_restores(template, state, [0, 1, 2, 3]) == (edit is None)
    assert shown(template, state, [0, 1, 2, 3]) == (edit is None)


def test_phased_lanes_that_keep_their_inner_seals_are_checked_one_by_one():
    """A state that left out only the lanes' own seals (as versions 2 and 3 did) keeps each inner
    state's seal, which only a lane's own check verifies."""
    template = PhasedMixtureWorkSource(three_datasets(), [Phase({"web": 1, "code": 1}, until_chunk=6),
                                                          Phase({"math": 1})], chunk_size=8, exhausted_policy="repeat")
    states = lane_states(template, 3, lambda _: 1)
    entries = {lane: (state, 0, 0) for lane, state in states.items()}
    state = make_state(3, entries, dataset_fingerprints(template.datasets_by_id), {}, sealed_by_source=True)
    assert state["lanes"]["nested"] == [] and "digest" in state["lanes"]["state"]["fields"]["inner"]["fields"]
    assert each_restores(template, state, [0, 1, 2]) and not shown(template, state, [0, 1, 2])
    assert shown(template, loader_state(template, 3, states), [0, 1, 2])


@pytest.mark.parametrize("kind", [StaticMixtureWorkSource, PhasedMixtureWorkSource])
@pytest.mark.parametrize("ids", [[0, 1.0, 2, 3], [False, True, 2, 3]])
def test_lane_ids_that_equal_the_lanes_but_are_no_ints_are_not_shown(kind, ids):
    """A lane's own check compares the types of its lane binding: ``1.0`` and ``True`` are not
    lane 1 (the column of the lanes' ids is ``{"start": 0, "step": 1}`` as written)."""
    template = _template(kind)
    state = loader_state(template, 4, lane_states(template, 4, lambda _: 1))
    state["lanes"]["state"]["fields"]["lane"] = ids
    state = sealed({k: v for k, v in state.items() if k != KEY_DIGEST})
    assert not each_restores(template, state, [0, 1, 2, 3]) and not shown(template, state, [0, 1, 2, 3])


def test_phased_states_merged_or_of_one_lane_leave_their_inner_seals_out_and_load_as_sealed():
    """Ranks whose lanes stand in other phases share less (their states merge lane by lane), and a
    state of one lane keeps its whole inner state in the shared part: both leave the inner seals
    out, as do the parts a state is split into, and every lane loads as its source sealed it."""
    template = PhasedMixtureWorkSource(three_datasets(), [Phase({"web": 1, "code": 1}, until_chunk=5),
                                                          Phase({"math": 1, "web": 1})], chunk_size=8,
                                       exhausted_policy="repeat")
    chunks = iter([1, 1, 3, 3])
    states = lane_states(template, 4, lambda _: next(chunks))
    assert [states[lane]["phase"] for lane in range(4)] == [0, 0, 1, 1]
    parts = [loader_state(template, 4, {lane: states[lane] for lane in pair}) for pair in ((0, 1), (2, 3))]
    merged = merge_states(parts)
    one = loader_state(template, 4, {2: states[2]})
    assert merged["lanes"]["nested"] == one["lanes"]["nested"] == ["inner"] and "digest" not in one["source"]["inner"]
    split = split_state(merged)  # as torch.distributed.checkpoint saves a state: a part a lane
    assert [part["lanes"]["nested"] for part in split.values()] == [["inner"]] * 4
    for state, lanes in ((merged, [0, 1, 2, 3]), (one, [2]), *((part, [lane]) for lane, part in split.items())):
        entries = parse_state(json.loads(json.dumps(state))).entries
        assert all(canonical(entries[lane][0]) == canonical(states[lane]) for lane in lanes)
        assert each_restores(template, state, lanes)


def test_lanes_before_a_chunk_bound_are_checked_without_finding_where_their_phase_ends():
    """The bound says that a chunk before it lies in the phase: where the phase ends (a walk of
    the schedule up to it) is left to the first chunk read."""
    def source():
        return PhasedMixtureWorkSource(three_datasets(), [Phase({"web": 1, "code": 1}, until_chunk=50),
                                                          Phase({"math": 1})], chunk_size=8, exhausted_policy="repeat")
    state = loader_state(source(), 4, lane_states(source(), 4, lambda _: 1))
    template = source()  # its phases' starts not found yet (a template's clones share them)
    assert shown(template, state, [0, 1, 2, 3])
    assert len(template.config.starts.known[None]) == 1  # phase 0's start only
    assert each_restores(template, state, [0, 1, 2, 3]) and len(template.config.starts.known[None]) == 2


def _edited_lanes(kind, edit, chunks=1):
    """The global state of four lanes ``chunks`` chunks in, with ``edit(lane, state)`` applied to each lane's state."""
    template = _template(kind)
    states = lane_states(template, 4, lambda _: chunks)
    for lane, state in states.items():
        edit(lane, state)
    return template, loader_state(template, 4, states)


def _inner(state):
    return state.get("inner", state)


WEB_TOTAL = next(d.total() for d in three_datasets() if d.name == "web")


def _a_pass_on(lane, state):
    if lane == 1:  # the same samples read, as one pass more and a position below the pass's start
        cursor = _inner(state)["state"]["cursors"]["web"]
        cursor["epoch"], cursor["position"] = cursor["epoch"] + 1, cursor["position"] - WEB_TOTAL


EDITS = {
    "version as a float": lambda lane, state: state.__setitem__("version", float(state["version"])),
    "lane count as a float": lambda lane, state: state.__setitem__("canonical_replicas", 4.0),
    "a key more": lambda lane, state: state.__setitem__("x", 0),
    "a key more in the state": lambda lane, state: _inner(state)["state"].__setitem__("x", 0),
    "a pass on, a position below its start": _a_pass_on,
}


@pytest.mark.parametrize("kind", [StaticMixtureWorkSource, PhasedMixtureWorkSource])
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_edits_that_each_lane_refuses_are_not_shown(kind, edit):
    template, state = _edited_lanes(kind, EDITS[edit])
    assert not each_restores(template, state, [0, 1, 2, 3]) and not shown(template, state, [0, 1, 2, 3])


@pytest.mark.parametrize("edit", ["phase -1", "inner version as a float", "inner lane count as a float"])
def test_edits_of_a_phased_header_that_each_lane_refuses_are_not_shown(edit):
    def change(lane, state):
        if edit == "phase -1":
            state["phase"] = -1
        else:
            key = "version" if "version" in edit else "canonical_replicas"
            state["inner"][key] = float(state["inner"][key])
    template, state = _edited_lanes(PhasedMixtureWorkSource, change, chunks=4)  # in the last phase
    assert not each_restores(template, state, [0, 1, 2, 3]) and not shown(template, state, [0, 1, 2, 3])


def test_a_chunk_past_a_sample_bounded_phase_is_not_shown():
    """A bound of samples is no chunk number: a lane's chunk moved past where its phase ends, but
    not past the bound's number, is refused (with redistributing datasets only that bound does)."""
    template = PhasedMixtureWorkSource(three_datasets(), [Phase({"web": 1, "code": 1}, until_sample=200),
                                                          Phase({"math": 1})], chunk_size=8,
                                       exhausted_policy="redistribute")
    states = lane_states(template, 4, lambda _: 1)
    assert {state["phase"] for state in states.values()} == {0}
    states[2]["inner"]["state"]["chunk_index"] = 100  # the phase ends at chunk 25
    state = loader_state(template, 4, states)
    assert not each_restores(template, state, [0, 1, 2, 3]) and not shown(template, state, [0, 1, 2, 3])
