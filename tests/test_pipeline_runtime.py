"""The runtime under the torch layer: reader streams, exact ledgers, states, checkpoint files (issue #5).

Torch-free. Checkpoints are tested Grain's way: take the ledger at many positions, restore
each into a *fresh* reader (after a JSON round trip) and compare the rest with the
uninterrupted run; elastic restores compare lane by lane.
"""
import json
import os
from collections import OrderedDict

import numpy as np
import pytest
from helpers import lane_streams
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.runtime import (
    LaneMux,
    Tracker,
    initial_entries,
    load_checkpoint,
    make_state,
    merge_states,
    parse_state,
    save_checkpoint,
    split_state,
    write,
)
from zephon.core.checkpoint import sealed
from zephon.runtime._lanes import rank_lanes
from zephon.runtime._stream import DELIVERED


def make_source(chunk_size=5, policy=None, seed=3):
    datasets = [Dataset.from_counts("a", [9, 4, 0, 12]), Dataset.from_counts("b", [7, 7]),
                Dataset.from_counts("c", [5])]
    kwargs = {} if policy is None else {"exhausted_policy": policy}
    return StaticMixtureWorkSource(datasets, {"a": 0.5, "b": 0.3, "c": 0.2}, chunk_size=chunk_size, seed=seed,
                                   **kwargs)


def roundtrip(entries):
    return {int(k): tuple(v) for k, v in json.loads(json.dumps({str(k): v for k, v in entries.items()})).items()}


def drain(mux, sizes, tracker=None, turns=None):
    """All samples of ``mux`` as ``(pointer, component id)`` pairs, taken in blocks of ``sizes``
    (whole turns); the position after each turn is appended to ``turns``."""
    out, k = [], 0
    while True:
        pointers, components, lengths = mux.take(sizes[k % len(sizes)])
        k += 1
        if tracker is not None:
            tracker.extend(*mux.drain())
        if not len(pointers):
            assert mux.exhausted
            return out
        if turns is not None:
            turns.extend((len(out) + lengths.cumsum()).tolist())
        out.extend(zip(map(tuple, pointers.tolist()), components.tolist()))


setup = st.fixed_dictionaries({
    "replicas": st.integers(1, 5),
    "chunk_size": st.integers(1, 7),
    "policy": st.sampled_from([None, "stop", "redistribute"]),
    "unit": st.integers(1, 6),
    "sizes": st.lists(st.integers(1, 3), min_size=1, max_size=3),  # turns a take asks for at most
})


def mux_of(source, lanes, replicas, entries, cfg):
    return LaneMux(source, lanes, replicas, entries, source.component_ids(), unit=cfg["unit"])


@settings(max_examples=40)
@given(setup, st.data())
def test_ledger_at_any_turn_restores_the_rest_exactly(cfg, data):
    source = make_source(cfg["chunk_size"], cfg["policy"])
    replicas, sizes = cfg["replicas"], [n * cfg["unit"] for n in cfg["sizes"]]
    lanes = sorted(data.draw(st.sets(st.integers(0, replicas - 1), min_size=1)))
    start = initial_entries(source, lanes, replicas)
    tracker, turns = Tracker(start, source, replicas), [0]
    stream = drain(mux_of(source, lanes, replicas, start, cfg), sizes, tracker, turns)
    cuts = sorted(data.draw(st.lists(st.sampled_from(turns), min_size=1, max_size=5)))
    folded = Tracker(start, source, replicas, fold_after=0)
    folded.extend(*mux_of(source, lanes, replicas, start, cfg).drain())
    replay = mux_of(source, lanes, replicas, start, cfg)
    replay.take(len(stream) + cfg["unit"])
    folded.extend(*replay.drain())
    for cut in cuts:
        entries = tracker.entries_at(cut)
        folded.fold(cut)
        assert folded.entries_at(cut) == entries
        restored = mux_of(make_source(cfg["chunk_size"], cfg["policy"]), lanes, replicas, roundtrip(entries), cfg)
        assert drain(restored, sizes[::-1]) == stream[cut:]


@settings(max_examples=60)
@given(setup, st.integers(1, 12), st.data())
def test_folding_anywhere_keeps_the_ledger_of_every_later_position(cfg, replicas, data):
    """A fold updates only the lanes that moved since the last one (a reader of thousands of
    lanes folds once a bundle), folding as a loader does: after each take, at a position that
    lags behind it. The ledger after the folds is the unfolded one at every later position."""
    source = make_source(cfg["chunk_size"], cfg["policy"])
    lanes = sorted(data.draw(st.sets(st.integers(0, replicas - 1), min_size=1)))
    start = initial_entries(source, lanes, replicas)
    whole, folded = Tracker(start, source, replicas), Tracker(start, source, replicas, fold_after=0)
    mux, taken, cut = mux_of(source, lanes, replicas, start, cfg), 0, 0
    while not mux.exhausted:
        taken += len(mux.take(cfg["unit"] * data.draw(st.integers(1, 3)))[0])
        facts = mux.drain()
        whole.extend(*facts)
        folded.extend(*facts)
        cut = data.draw(st.integers(cut, taken))
        folded.fold(cut)
        for position in {cut, (cut + taken) // 2, taken}:
            assert folded.entries_at(position) == whole.entries_at(position)
    with pytest.raises(ValueError, match="folded"):
        folded.fold(cut - 1)


@settings(max_examples=40)
@given(setup, st.data())
def test_turns_are_windows_of_one_lane_and_lanes_take_turns(cfg, data):
    source = make_source(cfg["chunk_size"], "stop")  # no sample repeats: a pointer names its lane
    replicas, unit = cfg["replicas"], cfg["unit"]
    reference = lane_streams(source, replicas)
    lanes = sorted(data.draw(st.sets(st.integers(0, replicas - 1), min_size=1)))
    turns = [0]
    stream = [p for p, _ in drain(mux_of(source, lanes, replicas, initial_entries(source, lanes, replicas), cfg),
                                  [n * unit for n in cfg["sizes"]], turns=turns)]
    queues = {lane: [reference[lane][a:a + unit] for a in range(0, len(reference[lane]), unit)] for lane in lanes}
    expected = []
    while any(queues.values()):
        expected += [queues[lane].pop(0) for lane in lanes if queues[lane]]
    assert [stream[a:b] for a, b in zip(turns[:-1], turns[1:])] == expected


@settings(max_examples=40)
@given(setup, st.data())
def test_ledger_restores_every_lane_on_any_grouping(cfg, data):
    """Elastic: the lanes of one reader, resumed by other readers, continue lane by lane, from
    any position (a turn's middle included)."""
    source = make_source(cfg["chunk_size"], "stop")  # no sample repeats: a pointer names its lane
    replicas = cfg["replicas"]
    reference = lane_streams(source, replicas)
    owner = {p: lane for lane, pointers in reference.items() for p in pointers}
    start = initial_entries(source, range(replicas), replicas)
    tracker = Tracker(start, source, replicas)
    stream = drain(mux_of(source, range(replicas), replicas, start, cfg), [n * cfg["unit"] for n in cfg["sizes"]],
                   tracker)
    cut = data.draw(st.integers(0, len(stream)))
    entries = roundtrip(tracker.entries_at(cut))
    groups = data.draw(st.lists(st.integers(0, 2), min_size=replicas, max_size=replicas))
    seen = {lane: [] for lane in range(replicas)}
    for pointer, _ in stream[:cut]:
        seen[owner[pointer]].append(pointer)
    for g in set(groups):
        lanes = [lane for lane in range(replicas) if groups[lane] == g]
        for pointer, _ in drain(LaneMux(source, lanes, replicas, entries, source.component_ids()), [4]):
            seen[owner[pointer]].append(pointer)
    assert seen == reference

@given(st.integers(0, 300), st.integers(1, 64), st.sampled_from(["contiguous", "interleaved"]))
def test_ranks_share_the_lanes_once_each_and_evenly(replicas, world, mapping):
    parts = [rank_lanes(replicas, rank, world, mapping) for rank in range(world)]
    assert sorted(lane for part in parts for lane in part) == list(range(replicas))
    assert all(part == sorted(part) for part in parts)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    if mapping == "contiguous":  # rank r holds the lanes i with i * world // replicas == r
        assert parts == [[i for i in range(replicas) if i * world // replicas == r] for r in range(world)]
    else:
        assert parts == [list(range(r, replicas, world)) for r in range(world)]
    with pytest.raises(ValueError, match="does not exist"):
        rank_lanes(replicas, world, world, mapping)


def test_round_robin_order_and_turn_flags():
    source = make_source(chunk_size=3)
    start = initial_entries(source, [0, 1, 2], 3)
    mux = LaneMux(source, [0, 1, 2], 3, start, source.component_ids())
    tracker = Tracker(start, source, 3)
    pointers, _, _ = mux.take(7)
    tracker.extend(*mux.drain())
    ref = lane_streams(source, 3)
    expected = [ref[0][0], ref[1][0], ref[2][0], ref[0][1], ref[1][1], ref[2][1], ref[0][2]]
    assert list(map(tuple, pointers.tolist())) == expected
    entries = tracker.entries_at(7)
    assert [entries[lane][2] & DELIVERED for lane in range(3)] == [DELIVERED, 0, 0]
    assert [entries[lane][1] for lane in range(3)] == [3, 2, 2]
    assert tracker.entries_at(6)[0][2] == 0  # a full round: nobody has delivered yet


def test_a_turn_of_two_runs_on_into_the_lanes_next_chunk():
    source = make_source(chunk_size=3)
    start = initial_entries(source, [0, 1], 2)
    mux = LaneMux(source, [0, 1], 2, start, source.component_ids(), unit=2)
    tracker = Tracker(start, source, 2)
    pointers, _, turns = mux.take(8)
    tracker.extend(*mux.drain())
    ref = lane_streams(source, 2)
    assert turns.tolist() == [2, 2, 2, 2]
    assert list(map(tuple, pointers.tolist())) == ref[0][:2] + ref[1][:2] + ref[0][2:4] + ref[1][2:4]
    entries = tracker.entries_at(6)  # lane 0 gave its second turn: one sample of its chunk, one of the next
    assert [entries[lane][2] & DELIVERED for lane in range(2)] == [DELIVERED, 0]
    assert [entries[lane][1] for lane in range(2)] == [1, 2]


def test_restore_refuses_a_position_beyond_the_chunk():
    source = make_source()
    entries = initial_entries(source, [0], 1)
    with pytest.raises(ValueError, match="corrupted"):
        LaneMux(source, [0], 1, {0: (entries[0][0], 99, 0)}, source.component_ids())


# -- states -----------------------------------------------------------------------------------


def state_of(lanes, replicas=4, consumed=1):
    source = make_source()
    entries = {lane: (source.clone_for_lane(lane, replicas).state_dict(), consumed, 0) for lane in lanes}
    return make_state(replicas, entries, [{"id": 0, "name": "a", "fingerprint": None}],
                      {"world_size": 2, "ranks": [lanes[0] // 2], "mapping": "contiguous", "num_workers": 0})


def test_state_is_factored_json_and_parses_back():
    state = state_of([0, 1, 2, 3])
    assert json.loads(json.dumps(state)) == state
    assert "fingerprint" in state["source"] and "fingerprint" not in json.dumps(state["lanes"])
    parsed = parse_state(state)
    source = make_source()
    assert parsed.entries[2] == (source.clone_for_lane(2, 4).state_dict(), 1, 0)


def test_state_size_depends_on_lanes_only():
    small, large = state_of([0], consumed=1), state_of([0], consumed=10**9)
    assert abs(len(json.dumps(small)) - len(json.dumps(large))) <= 9


def test_merge_states_unions_lanes_and_refuses_conflicts():
    merged = merge_states([state_of([0, 1]), state_of([2, 3])])
    assert sorted(parse_state(merged).entries) == [0, 1, 2, 3]
    assert merged["topology"]["ranks"] == [0, 1]
    assert merge_states([merged, state_of([0, 1])]) == merged  # identical duplicates are fine
    with pytest.raises(ValueError, match="lane 0"):
        merge_states([state_of([0, 1]), state_of([0], consumed=2)])
    with pytest.raises(ValueError, match="canonical_replicas"):
        merge_states([state_of([0]), state_of([1], replicas=2)])
    with pytest.raises(ValueError, match="at least one"):
        merge_states([])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=8, max_size=8), st.integers(0, 7))
def test_merging_any_split_of_the_lanes_gives_the_state_of_them_all(owner, consumed):
    """Rank states merge by their columns into the state made of every lane at once; every
    lane parses back to its entry."""
    source, replicas = make_source(), 8
    entries = {lane: (source.clone_for_lane(lane, replicas).state_dict(), (lane * consumed) % 5, lane % 2)
               for lane in range(replicas)}
    datasets = [{"id": 0, "name": "a", "fingerprint": None}]
    topology = {"world_size": 4, "ranks": [0], "mapping": "contiguous", "num_workers": 0}
    parts = [make_state(replicas, {lane: entries[lane] for lane in range(replicas) if owner[lane] == rank},
                        datasets, {**topology, "ranks": [rank]}) for rank in sorted(set(owner))]
    merged = merge_states(json.loads(json.dumps(parts)))
    whole = make_state(replicas, entries, datasets, {**topology, "ranks": sorted(set(owner))})
    assert merged == whole
    parsed = parse_state(merged)
    assert {lane: parsed.entries[lane] for lane in range(replicas)} == entries


def test_a_parsed_state_does_not_follow_later_edits_of_its_input():
    state = json.loads(json.dumps(state_of([0, 1, 2, 3])))
    parsed = parse_state(state)
    before = parse_state(json.loads(json.dumps(state))).entries[3]
    for column in state["lanes"]["state"]["fields"].values():
        if type(column) is list:
            column[3] = "edited"
    state["source"]["kind"] = "edited"
    assert parsed.entries[3] == before


class _Tagged(StaticMixtureWorkSource):
    """A subclass whose states carry a key of its own: its seals are not the parent's."""

    def state_dict(self):
        return {**super().state_dict(), "note": "mine"}

    def load_state_dict(self, state):
        super().load_state_dict({k: v for k, v in state.items() if k != "note"})


def test_a_subclassed_sources_states_restore_through_the_loader():
    import zephon.torch as zt
    from zephon import Pipeline

    def loader():
        source = make_source(policy="repeat")
        tagged = _Tagged(list(source.datasets_by_id.values()), {"a": 0.5, "b": 0.3, "c": 0.2}, chunk_size=5, seed=3,
                         exhausted_policy="repeat")
        return zt.DataLoader(Pipeline(tagged), batch_size=2, canonical_replicas=2, even_batches=False)

    first = loader()
    it = iter(first)
    next(it), next(it)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["lanes"]["sealed"] is False
    resumed = loader()
    resumed.load_state_dict(state)
    assert [b["_sample_id"].tolist() for b, _ in zip(resumed, range(4))] == [next(it)["_sample_id"].tolist()
                                                                           for _ in range(4)]


def _column(state, key, value):
    state["lanes"][key] = value


@pytest.mark.parametrize("mutate,match", [
    (lambda s: s.update(kind="x"), "kind"),
    (lambda s: s.update(version=99), "version"),
    (lambda s: s.pop("lanes"), "missing"),
    (lambda s: s.update(canonical_replicas=0), "canonical_replicas"),
    (lambda s: s.update(run="xyz"), "run"),
    (lambda s: _column(s, "lane", [7, 8]), "outside"),
    (lambda s: _column(s, "lane", [1, 0]), "ascending"),
    (lambda s: _column(s, "lane", [0, 0]), "twice"),
    (lambda s: _column(s, "lane", {"bogus": 1}), "not a column"),
    (lambda s: _column(s, "consumed", [-1, 1]), "consumed"),
    (lambda s: _column(s, "turn", [9, 0]), "turn"),
    (lambda s: _column(s, "count", -1), "count=-1"),
    (lambda s: _column(s, "state", [{}, 5]), r"\[lane, consumed, turn, state\]"),
    (lambda s: _column(s, "state", {"float64": "!!"}), "float64"),
    (lambda s: s.update(operators={"pack": [1]}), "1 values for 2 lanes"),
])
def test_parse_state_refuses_malformed_states(mutate, match):
    state = state_of([0, 1])
    mutate(state)
    with pytest.raises(ValueError, match=match):
        parse_state(sealed(state))  # sealed again: the form is checked, not only the digest


@pytest.mark.parametrize("mutate", [
    lambda s: _column(s, "consumed", [2, 1]),  # what the loop received is covered as well
    lambda s: s["source"].update(lane=3),
    lambda s: s.update(topology={}),
])
def test_parse_state_refuses_any_edit_by_its_digest(mutate):
    state = state_of([0, 1])
    mutate(state)
    with pytest.raises(ValueError, match="digest does not match"):
        parse_state(state)


@pytest.mark.parametrize("kind", [dict, OrderedDict])  # its shared part read as OrderedDicts, say
def test_a_parsed_state_keeps_its_lanes_whatever_its_input_becomes(kind):
    state = state_of([0, 1])
    state["source"] = json.loads(json.dumps(state["source"]), object_pairs_hook=kind)
    parsed, before = parse_state(state), parse_state(json.loads(json.dumps(state))).entries
    for value in state["source"].values():  # every shared dict and list of the input, edited in place
        if isinstance(value, dict):
            value.clear()
        elif isinstance(value, list):
            value.append(0)
    assert [parsed.entries[lane] for lane in (0, 1)] == [before[lane] for lane in (0, 1)]


def test_a_version_1_state_still_loads():
    state = state_of([0, 1, 2, 3], consumed=3)
    entries = dict(parse_state(state).entries)
    states = [entries[lane][0] for lane in sorted(entries)]
    common = {k: v for k, v in states[0].items() if all(s[k] == v for s in states)}
    old = {"kind": state["kind"], "version": 1, "canonical_replicas": 4, "datasets": state["datasets"],
           "source": common, "topology": state["topology"],
           "lanes": [[lane, consumed, turn, {k: v for k, v in source_state.items() if k not in common}]
                     for lane, (source_state, consumed, turn) in sorted(entries.items())]}
    assert dict(parse_state(old).entries) == entries


@pytest.mark.parametrize("version", [2, 3, 4])
def test_versions_2_to_4_still_load(version):
    """Version 3 only added a column form (a list every lane has, kept once), version 4 the
    ``nested`` seals (none for a static source) and version 5 ``in_epoch``: a state of any of
    them reads as it did, its count of batches in the epoch unknown (None)."""
    state = state_of([0, 1, 2, 3], consumed=3)
    assert state["version"] == 5 and state["lanes"]["nested"] == [] and state["in_epoch"] == 0
    lanes = state["lanes"] if version == 4 else {k: v for k, v in state["lanes"].items() if k != "nested"}
    old = sealed({**{k: v for k, v in state.items() if k not in ("digest", "in_epoch")}, "version": version,
                  "lanes": lanes})
    assert dict(parse_state(old).entries) == dict(parse_state(state).entries)
    assert parse_state(old).in_epoch is None and parse_state(state).in_epoch == 0
    with pytest.raises(ValueError, match="missing \\['in_epoch'\\]"):
        parse_state(sealed({**old, "version": 5}))
    if version < 4:
        with pytest.raises(ValueError, match="'lanes' must be a dict of"):
            parse_state(sealed({**old, "version": 4}))


def test_in_epoch_is_checked_and_merged_as_the_furthest():
    state = state_of([0, 1, 2, 3])
    for bad in (-1, 1.0, True, None, 2**48 + 1):
        with pytest.raises(ValueError, match="in_epoch="):
            parse_state(sealed({**{k: v for k, v in state.items() if k != "digest"}, "in_epoch": bad}))
    parts = split_state(sealed({**{k: v for k, v in state.items() if k != "digest"}, "in_epoch": 7}))
    assert {parse_state(part).in_epoch for part in parts.values()} == {7}
    behind = sealed({**{k: v for k, v in parts[0].items() if k != "digest"}, "in_epoch": 6})
    assert merge_states([behind, *list(parts.values())[1:]])["in_epoch"] == 7


def test_version_4_refuses_nested_seals_it_cannot_use():
    state = state_of([0, 1])
    for nested, sealed_flag in ((["inner", "inner"], True), ([1], True), ("inner", True), (["inner"], False)):
        bad = sealed({**state, "lanes": {**state["lanes"], "nested": nested, "sealed": sealed_flag}})
        with pytest.raises(ValueError, match="nested="):
            parse_state(bad)


# -- checkpoint files -----------------------------------------------------------------------


def test_checkpoint_roundtrip_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "ckpt.json"
    state = state_of([0, 1, 2, 3])
    save_checkpoint(path, state)
    save_checkpoint(path, state)  # overwrite
    assert load_checkpoint(path) == state
    assert os.listdir(tmp_path) == ["ckpt.json"]


@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:len(b) // 2], "truncated"),
    (lambda b: b[:20], "header"),
    (lambda b: b.replace(b'"consumed', b'"consumeX').replace(b"[0,1,0", b"[0,2,0"), "checksum"),
    (lambda b: b"garbage\n" + b, "header"),
    (lambda b: b.replace(b"zephon-checkpoint 1", b"zephon-checkpoint 7", 1), "file version 7"),
    (lambda b: b"", "header"),
])
def test_damaged_checkpoints_are_refused_clearly(tmp_path, damage, match):
    path = tmp_path / "ckpt"
    save_checkpoint(path, state_of([0, 1]))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=match):
        load_checkpoint(path)


def test_save_checkpoint_refuses_what_would_not_load(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        save_checkpoint(tmp_path / "x", {"kind": "other"})
    state = state_of([0])
    state["topology"]["bad"] = float("nan")
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(tmp_path / "x", state)
    assert os.listdir(tmp_path) == []


def _arrays(layout, n, ids):
    """``take_into`` arrays of ``n`` samples in ``layout``, filled with -1."""
    pointers = {"C": lambda: np.full((n, 3), -1, dtype=np.int64),
                "Fortran": lambda: np.asfortranarray(np.full((n, 3), -1, dtype=np.int64)),
                "int32": lambda: np.full((n, 3), -1, dtype=np.int32),
                "columns of a wider array": lambda: np.full((n, 4), -1, dtype=np.int64)[:, :3]}[layout]()
    components = np.full(2 * n, -1, dtype=ids)[::2] if layout == "columns of a wider array" else np.full(n, -1, ids)
    return pointers, components


@settings(max_examples=80)
@given(setup, st.integers(1, 40), st.data())
def test_take_into_writes_what_take_gives(cfg, chunk_size, data):
    """``take_into`` (several lanes' rounds made in place in the caller's arrays, a lone lane's
    whole chunks read there) writes the samples and turns of ``take``, whatever the requests,
    the vocabulary, the arrays' layout and dtypes, and whether the caller writes over its
    arrays as soon as a take returns (nothing left to take later may view them)."""
    datasets = [Dataset.from_counts("a", [40, 17, 0, 33]), Dataset.from_counts("b", [25, 25]),
                Dataset.from_counts("c", [30])]
    source = StaticMixtureWorkSource(datasets, {"a": 0.5, "b": 0.3, "c": 0.2}, chunk_size=chunk_size, seed=3,
                                     exhausted_policy=data.draw(st.sampled_from(["repeat", "stop"])))
    replicas, unit = cfg["replicas"], cfg["unit"]
    lanes = sorted(data.draw(st.sets(st.integers(0, replicas - 1), min_size=1)))
    start = initial_entries(source, lanes, replicas)
    vocabulary = dict(zip("abc", data.draw(st.sampled_from([(0, 1, 2), (2, 0, 1), (5, 3, 100000)]))))
    taking = LaneMux(source, lanes, replicas, start, vocabulary, unit=unit)
    writing = LaneMux(source, lanes, replicas, start, vocabulary, unit=unit)
    layout = data.draw(st.sampled_from(["C", "C", "Fortran", "int32", "columns of a wider array"]))
    ids, reuse = data.draw(st.sampled_from([np.int32, np.int64])), data.draw(st.booleans())
    into = _arrays(layout, 640, ids)
    at = data.draw(st.integers(0, 5))
    while at < 540:
        n = data.draw(st.integers(1, 16)) * unit
        pointers, components, turns = taking.take(n)
        k, written = writing.take_into(into, at, n)
        assert k == len(pointers) and written.tolist() == turns.tolist()
        assert into[0][at:at + k].tolist() == pointers.tolist() and into[1][at:at + k].tolist() == components.tolist()
        if not k:
            return
        if reuse:
            into[0][...], into[1][...] = -7, -7
        else:
            at += k


def test_what_a_take_into_leaves_over_does_not_view_the_callers_arrays():
    """When one of two lanes ends on a short turn, the other's turns no longer end with the
    arrays: a chunk read in place there can have a last turn that does not fit, which the next
    take hands out. It must be a copy: the caller may write over its arrays at once."""
    datasets = [Dataset.from_counts("a", [40, 17, 0, 33]), Dataset.from_counts("b", [25, 25]),
                Dataset.from_counts("c", [30])]
    source = StaticMixtureWorkSource(datasets, {"a": 0.5, "b": 0.3, "c": 0.2}, chunk_size=1, seed=3,
                                     exhausted_policy="stop")
    start = initial_entries(source, [0, 2], 3)
    taking, writing = (LaneMux(source, [0, 2], 3, start, source.component_ids(), unit=4) for _ in range(2))
    short = False
    for _ in range(8):
        pointers, _, _ = taking.take(20)
        into = np.full((20, 3), -1, dtype=np.int64), np.full(20, -1, dtype=np.int64)
        k, _ = writing.take_into(into, 0, 20)
        assert into[0][:k].tolist() == pointers.tolist()
        assert not any(np.shares_memory(p, into[0]) for p, _ in writing._carry)
        short |= 0 < k < 20 and writing._pending > 0
        into[0][...] = -7
    assert short  # the case arose: a take that left samples over


def test_a_lone_lanes_chunks_are_read_where_take_into_writes_them():
    """A lane read alone has each chunk that fits in ``take_into``'s arrays read there (its
    samples are not copied again), and what it writes is the lane's stream."""
    source = make_source(chunk_size=6)
    lanes = initial_entries(source, [0], 1)
    taking, writing = LaneMux(source, [0], 1, lanes, source.component_ids()), LaneMux(source, [0], 1, lanes,
                                                                                     source.component_ids())
    into = np.full((36, 3), -1, dtype=np.int64), np.full(36, -1, dtype=np.int64)  # six whole chunks
    k, _ = writing.take_into(into, 0, 36)
    pointers, components, _ = taking.take(36)
    assert k == 36 and into[0].tolist() == pointers.tolist() and into[1].tolist() == components.tolist()
    lane = writing._active[0]
    assert np.shares_memory(lane.pointers, into[0]) and np.shares_memory(lane.components, into[1])


@given(st.data())
def test_write_copies_every_piece_but_one_that_lies_in_its_place(data):
    """``write`` leaves a piece whose two arrays are its place's very memory, and copies any
    other: a fresh one, or a view that starts where its place does but differs in its rows
    (a stride), its dtype, or its component ids' memory."""
    n = data.draw(st.integers(1, 12))
    into = np.arange(3 * n, dtype=np.int64).reshape(n, 3), np.arange(n, dtype=np.int32) * 10
    want = into[0].copy(), into[1].copy()
    pieces, at = [], 0
    while at < n:
        k = data.draw(st.integers(1, n - at))
        kind = data.draw(st.sampled_from(["fresh", "in place", "rows apart", "ids elsewhere", "other dtype"]))
        fresh = np.full((k, 3), -at - 1, dtype=np.int64), np.full(k, -at - 1, dtype=np.int32)
        place = into[0][at:at + k], into[1][at:at + k]
        piece = {"fresh": fresh, "in place": place, "ids elsewhere": (place[0], fresh[1]),
                 "rows apart": (into[0][at:at + 2 * k:2], place[1]) if at + 2 * k <= n else fresh,
                 "other dtype": (place[0], into[1].view(np.uint32)[at:at + k])}[kind]
        want[0][at:at + k], want[1][at:at + k] = piece
        pieces.append(piece)
        at += k
    assert write(into, 0, pieces) == n
    assert into[0].tolist() == want[0].tolist() and into[1].tolist() == want[1].tolist()
