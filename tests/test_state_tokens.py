"""State tokens: a reader records one per chunk, a ledger seals the few a checkpoint needs.

A token travels between processes by pickle; sealed by the ledger's clone of the lane (restored
to the lane's starting state), it must be exactly the ``state_dict()`` of its moment, whatever
the source's settings, phases, migration history or kept sample orders.
"""
import json
import pickle

import pytest
from helpers import three_datasets
from hypothesis import given
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.checkpoint import canonical, state_fields, state_to_json
from zephon.core.schedule import state_of_token
from zephon.runtime import LaneMux, Sealer, SealingLedger, initial_entries, make_state, parse_state
from zephon.runtime._book import SEALING_SOURCES
from zephon.runtime._state import dataset_fingerprints
from zephon.testing import phased_sources, sources
from zephon.torch import migrate_checkpoint
from zephon.work import Phase, PhasedMixtureWorkSource, migrate
from zephon.work.tokens import TokenEstimation


def _assert_tokens_seal_to_state_dicts(template, lane, replicas, start, chunks):
    source = template.clone_for_lane(lane, replicas)
    source.load_state_dict(start)
    sealer = Sealer(template, replicas, {lane: (start, 0, 0)})
    for _ in range(chunks):
        token = pickle.loads(pickle.dumps(source.state_token()))
        assert sealer(lane, token) == source.state_dict()
        if source.next_chunk() is None:
            break
    token = source.state_token()
    assert sealer(lane, token) is sealer(lane, token)  # a lane's last sealed token is remembered
    assert sealer(lane, start) is start  # a state dict passes through


@given(st.one_of(sources(), phased_sources()), st.integers(1, 4), st.integers(0, 40), st.data())
def test_every_chunks_token_seals_to_the_state_dict_of_its_moment(template, replicas, chunks, data):
    lane = data.draw(st.integers(0, replicas - 1))
    start = template.clone_for_lane(lane, replicas).state_dict()
    _assert_tokens_seal_to_state_dicts(template, lane, replicas, start, chunks)


@given(st.one_of(sources(), phased_sources()), st.integers(2, 4), st.integers(0, 12), st.data())
def test_a_checked_state_restores_as_load_state_dict_restores_it(template, replicas, chunks, data):
    """Readers restore their ledger's states without checking their settings again; the
    source continues exactly as after ``load_state_dict``, and a state of another lane is refused."""
    lane = data.draw(st.integers(0, replicas - 1))
    source = template.clone_for_lane(lane, replicas)
    for _ in range(chunks):
        source.next_chunk()
    state = json.loads(json.dumps(source.state_dict()))
    loaded, checked = template.clone_for_lane(lane, replicas), template.clone_for_lane(lane, replicas)
    loaded.load_state_dict(state)
    checked.restore_checked(state)
    for _ in range(3):
        assert checked.state_dict() == loaded.state_dict()
        a, b = loaded.next_chunk(), checked.next_chunk()
        assert (a is None) == (b is None)
        if a is not None:
            assert [x.tolist() for x in a.read_order()] == [x.tolist() for x in b.read_order()]
    with pytest.raises(ValueError, match="lane"):
        template.clone_for_lane((lane + 1) % replicas, replicas).restore_checked(state)


@pytest.mark.parametrize("phased", [False, True])
def test_a_subclass_that_restores_its_own_way_is_restored_through_it(phased):
    base = PhasedMixtureWorkSource if phased else StaticMixtureWorkSource

    class Counting(base):
        loads = 0

        def load_state_dict(self, state):
            Counting.loads += 1
            super().load_state_dict(state)

    data = three_datasets()
    weights = {"web": 2, "code": 1, "math": 1}
    template = Counting(data, [Phase(weights, until_chunk=2), Phase(weights)] if phased else weights, chunk_size=8,
                        seed=1)
    state = template.clone_for_lane(0, 2).state_dict()
    template.clone_for_lane(0, 2).restore_checked(state)
    assert Counting.loads == 1


def test_a_migrated_lane_seals_its_history_and_kept_orders():
    data = three_datasets()
    old = StaticMixtureWorkSource(data, {"web": 2, "code": 1, "math": 1}, chunk_size=12, seed=9,
                                  exhausted_policy="repeat").clone_for_lane(0, 1)
    for _ in range(3):
        old.next_chunk()
    new = StaticMixtureWorkSource([data[2], data[0]], {"math": 1, "web": 1}, chunk_size=5, seed=10,
                                  shuffle_within_shard=True, exhausted_policy="repeat")
    start = json.loads(json.dumps(migrate(old.state_dict(), new).state))
    assert {"orders", "migrations"} <= set(start)
    _assert_tokens_seal_to_state_dicts(new, 0, 1, start, 12)


def _primed_token_source():
    data = [Dataset.from_counts("a", [50] * 4, raw_bytes=[3000] * 4),
            Dataset.from_counts("b", [40, 60], raw_bytes=[9000, 30000])]
    template = StaticMixtureWorkSource(data, {"a": 0.6, "b": 0.4}, chunk_size=16, seed=5,
                                       token_estimation=TokenEstimation(primer={"a": 0.2, "b": 0.25}))
    template.prime()
    return template


def test_a_token_mode_lane_seals_its_ratios():
    template = _primed_token_source()
    start = template.clone_for_lane(1, 2).state_dict()
    assert "token_ratios" in start
    _assert_tokens_seal_to_state_dicts(template, 1, 2, start, 20)


def test_a_token_of_another_kind_is_refused():
    source = StaticMixtureWorkSource(three_datasets(), {"web": 1, "code": 1, "math": 1},
                                     chunk_size=4).clone_for_lane(0, 1)
    with pytest.raises(TypeError, match="what state_token"):
        source.state_from_token(source.state_dict())


def test_an_overridden_token_that_is_a_mapping_is_refused():
    class DictTokens(StaticMixtureWorkSource):
        def state_token(self):
            return {"chunk": self.state.chunk_index}

    template = DictTokens(three_datasets(), {"web": 1, "code": 1, "math": 1}, chunk_size=4)
    with pytest.raises(TypeError, match="must not be one"):
        LaneMux(template, [0], 1, initial_entries(template, [0], 1), template.component_ids())


@given(st.one_of(sources(), phased_sources()), st.integers(1, 4), st.integers(0, 30))
def test_a_tokens_chunk_index_is_its_states(template, replicas, chunks):
    source = template.clone_for_lane(replicas - 1, replicas)
    for _ in range(chunks):
        assert source.token_chunk_index(source.state_token()) == source.state.chunk_index
        if source.next_chunk() is None:
            break


def _lane_tokens(template, replicas, chunks):
    """Each lane's token after ``chunks[lane]`` chunks (fewer where it ends), and its start entries."""
    tokens, entries = {}, {}
    for lane in range(replicas):
        source = template.clone_for_lane(lane, replicas)
        entries[lane] = (source.state_dict(), 0, 0)
        for _ in range(chunks[lane]):
            if source.next_chunk() is None:
                break
        tokens[lane] = source.state_token()
    return tokens, entries


def _chunk_index(state):
    """The chunk index a sealed static or phased mixture state holds."""
    return (state["inner"] if "inner" in state else state)["state"]["chunk_index"]


@given(st.one_of(sources(), phased_sources()), st.integers(2, 6), st.data())
def test_the_furthest_lanes_state_is_the_one_sealed_of_several(template, replicas, data):
    chunks = data.draw(st.lists(st.integers(0, 8), min_size=replicas, max_size=replicas))
    tokens, entries = _lane_tokens(template, replicas, chunks)
    sealer = Sealer(template, replicas, entries)
    every = [sealer(lane, token) for lane, token in tokens.items()]
    first_furthest = max(every, key=_chunk_index)  # the first furthest: what the stats keep of them all
    assert sealer.furthest(tokens) == [first_furthest]
    assert sealer.furthest({}) == []


def test_states_already_sealed_are_all_passed_on():
    template = StaticMixtureWorkSource(three_datasets(), {"web": 1, "code": 1, "math": 1}, chunk_size=4)
    tokens, entries = _lane_tokens(template, 2, [3, 1])
    sealer = Sealer(template, 2, entries)
    mixed = {0: tokens[0], 1: entries[1][0]}
    assert sealer.furthest(mixed) == [sealer(0, tokens[0]), entries[1][0]]


def test_a_subclass_with_its_own_tokens_has_every_lane_state_sealed():
    class Reversed(StaticMixtureWorkSource):
        def state_token(self):
            return tuple(reversed(super().state_token()))

        def state_from_token(self, token):
            return super().state_from_token(tuple(reversed(token)))

    template = Reversed(three_datasets(), {"web": 1, "code": 1, "math": 1}, chunk_size=4)
    tokens, entries = _lane_tokens(template, 3, [2, 5, 1])
    sealer = Sealer(template, 3, entries)
    assert sealer.furthest(tokens) == [sealer(lane, token) for lane, token in tokens.items()]


@given(sources(), st.integers(1, 5), st.data())
def test_state_fields_are_the_states_of_the_tokens_field_by_field(template, replicas, data):
    """``state_fields`` is ``state_to_json``'s ``state`` of each token, one list per field."""
    chunks = data.draw(st.lists(st.integers(0, 8), min_size=replicas, max_size=replicas))
    tokens, _ = _lane_tokens(template, replicas, chunks)
    states = [state_to_json(state_of_token(token), template.config)["state"] for token in tokens.values()]
    fields = state_fields(list(tokens.values()), template.config)
    alike = all(state.keys() == states[0].keys() for state in states)
    assert (fields is not None) == alike
    if alike:
        assert canonical(fields) == canonical(_fields_of(states))


def _fields_of(states):
    """Dicts of the same keys field by field, to the leaves."""
    if type(states[0]) is dict:
        return {key: _fields_of([state[key] for state in states]) for key in states[0]}
    return states


def _moved_lanes(template, replicas, starts, chunks):
    """Each lane's start entry (after ``starts[lane]`` chunks, through JSON as a loaded state
    is) and its token ``chunks[lane]`` chunks later (fewer where it ends)."""
    tokens, entries = {}, {}
    for lane in range(replicas):
        source = template.clone_for_lane(lane, replicas)
        for _ in range(starts[lane]):
            source.next_chunk()
        entries[lane] = (json.loads(json.dumps(source.state_dict())), 0, 0)
        for _ in range(chunks[lane]):
            if source.next_chunk() is None:
                break
        tokens[lane] = source.state_token()
    return tokens, entries


def _ledger(template, replicas, readers, tokens, entries, consumed):
    """The lanes' tokens in a :class:`SealingLedger`, read by ``readers`` readers (a Sealer each)."""
    ledger = SealingLedger()
    for reader in range(readers):
        lanes = range(reader, replicas, readers)
        ledger.add({lane: (tokens[lane], consumed[lane], lane % 4) for lane in lanes},
                   Sealer(template, replicas, {lane: entries[lane] for lane in lanes}))
    return ledger


def _state(replicas, entries, nested=()):
    return make_state(replicas, entries, [], {"world_size": 1}, run="0" * 32, sealed_by_source=True, nested=nested)


@given(st.one_of(sources(), phased_sources()), st.integers(1, 6), st.integers(1, 3), st.data())
def test_a_state_made_field_by_field_is_the_one_of_its_lanes_sealed_one_by_one(template, replicas, readers, data):
    """A loader state of a ledger's tokens, made from them field by field where it can, is exactly
    the state of the lanes' states sealed one by one (a phased state's inner seal left out as
    well), and loads them as they were sealed."""
    lane_ints = st.lists(st.integers(0, 6), min_size=replicas, max_size=replicas)
    starts, chunks, consumed = data.draw(lane_ints), data.draw(lane_ints), data.draw(lane_ints)
    tokens, entries = _moved_lanes(template, replicas, starts, chunks)
    ledger = _ledger(template, replicas, readers, tokens, entries, consumed)
    nested = SEALING_SOURCES[type(template)]
    state = _state(replicas, ledger, nested)
    assert canonical(state) == canonical(_state(replicas, dict(ledger), nested))
    assert state["lanes"]["nested"] == list(nested)
    loaded = parse_state(json.loads(json.dumps(state))).entries
    assert all(canonical(loaded[lane]) == canonical(ledger[lane]) for lane in range(replicas))
    phased = type(template) is PhasedMixtureWorkSource
    chunks = {t[1][0] if phased else t[0] for t in tokens.values()}
    one_phase = not phased or len({t[0] for t in tokens.values()}) == 1
    assert (ledger.fields(nested) is not None) == (len(chunks) > 1 and one_phase)
    if phased:  # a phased state whose inner seals are kept is sealed one by one
        assert ledger.fields() is None
        assert canonical(_state(replicas, ledger)) == canonical(_state(replicas, dict(ledger)))


@given(sources(), st.integers(2, 5))
def test_lanes_at_one_chunk_are_sealed_one_by_one(template, replicas):
    """Lanes that all stand at the start of the stream have the same state: a loader state keeps
    it once, in the shared part, so their states are not made field by field."""
    tokens, entries = _moved_lanes(template, replicas, [0] * replicas, [0] * replicas)
    chunk, alloc, cursors, requeue = tokens[1]
    if isinstance(alloc, tuple):  # another token of the same state (a custom allocator's restored list)
        tokens[1] = (chunk, list(alloc), cursors, requeue)
    ledger = _ledger(template, replicas, 2, tokens, entries, [0] * replicas)
    assert ledger.fields() is None
    state = _state(replicas, ledger)
    assert "state" in state["source"] and canonical(state) == canonical(_state(replicas, dict(ledger)))


def test_lanes_of_other_lane_counts_are_sealed_one_by_one():
    template = StaticMixtureWorkSource(three_datasets(), {"web": 2, "code": 1, "math": 1}, chunk_size=12, seed=9)
    two, two_entries = _moved_lanes(template, 2, [0, 0], [1, 2])
    eight, eight_entries = _moved_lanes(template, 8, [0] * 8, [1] * 8)
    ledger = _ledger(template, 2, 1, two, two_entries, [0, 0])
    ledger.add({5: (eight[5], 0, 0)}, Sealer(template, 8, {5: eight_entries[5]}))
    assert ledger.fields() is None
    assert canonical(_state(8, ledger)) == canonical(_state(8, dict(ledger)))


@pytest.mark.parametrize("requeue, step, by_fields", [(False, 1, True), (True, 1, True), (True, 2, False)])
def test_migrated_lanes_are_made_field_by_field_where_they_agree_on_their_settings(requeue, step, by_fields):
    """Lanes restored from a migrated checkpoint keep its history and sample orders: made field
    by field when all of them do and all or none still have requeued samples to serve (lane k
    is ``step * k`` chunks on), and sealed one by one beside a lane restored without them."""
    data = three_datasets()
    old = StaticMixtureWorkSource(data, {"web": 2, "code": 1, "math": 1}, chunk_size=12, seed=9,
                                  exhausted_policy="repeat")
    lanes = [old.clone_for_lane(lane, 3) for lane in range(3)]
    for lane in lanes:
        for _ in range(lane.lane_id + 1):
            lane.next_chunk()
    checkpoint = make_state(3, {lane.lane_id: (lane.state_dict(), 2, 0) for lane in lanes},
                            dataset_fingerprints(old.datasets_by_id), {})
    new = StaticMixtureWorkSource([data[2], data[0]], {"math": 1, "web": 1}, chunk_size=5, seed=10,
                                  exhausted_policy="repeat")
    loaded = parse_state(json.loads(json.dumps(migrate_checkpoint(checkpoint, new, requeue=requeue).state)))
    starts = {lane: (loaded.entries[lane][0], 0, 0) for lane in range(3)}
    tokens = {}
    for lane, (start, _, _) in starts.items():
        source = new.clone_for_lane(lane, 3)
        source.load_state_dict(start)
        for _ in range(step * lane):
            source.next_chunk()
        tokens[lane] = source.state_token()
    migrated = _ledger(new, 3, 2, tokens, starts, [1, 2, 3])
    assert (migrated.fields() is not None) == by_fields
    assert canonical(_state(3, migrated)) == canonical(_state(3, dict(migrated)))
    fresh = new.clone_for_lane(2, 3)
    fresh.next_chunk()
    mixed = _ledger(new, 3, 1, {**tokens, 2: fresh.state_token()}, {**starts, 2: (fresh.state_dict(), 0, 0)},
                    [1, 2, 3])
    assert mixed.fields() is None
    assert canonical(_state(3, mixed)) == canonical(_state(3, dict(mixed)))


def test_a_token_mode_ledger_is_made_field_by_field_with_its_ratios():
    template = _primed_token_source()
    tokens, entries = _moved_lanes(template, 3, [0, 1, 2], [3, 1, 2])
    ledger = _ledger(template, 3, 2, tokens, entries, [0, 5, 9])
    assert "token_ratios" in ledger.fields()[0]
    assert canonical(_state(3, ledger)) == canonical(_state(3, dict(ledger)))


@pytest.mark.parametrize("chunks", [[1, 4, 5], [4, 5, 6]])  # lanes in phases 0 and 1; all in phase 1
def test_phased_lanes_in_other_phases_are_sealed_one_by_one(chunks):
    """Lanes of a phased source in different phases have different headers (phase, inner
    settings): their state is made lane by lane (lanes all in one phase, the control, field by
    field), and holds each one as its lane sealed it."""
    template = PhasedMixtureWorkSource(three_datasets(), [Phase({"web": 1, "code": 1}, until_chunk=9),
                                                          Phase({"math": 1, "web": 1})], chunk_size=4,
                                       exhausted_policy="repeat")
    tokens, entries = _moved_lanes(template, 3, [0, 0, 0], chunks)
    ledger = _ledger(template, 3, 1, tokens, entries, [0, 0, 0])
    one_phase = len({token[0] for token in tokens.values()}) == 1
    assert one_phase == (chunks[0] == 4)
    assert (ledger.fields(SEALING_SOURCES[PhasedMixtureWorkSource]) is not None) == one_phase
    state = _state(3, ledger, SEALING_SOURCES[PhasedMixtureWorkSource])
    loaded = parse_state(json.loads(json.dumps(state))).entries
    assert all(canonical(loaded[lane]) == canonical(ledger[lane]) for lane in range(3))


def test_lanes_of_another_source_are_sealed_one_by_one():
    """A ledger's lanes sealed by sources of other settings (another seed) share no header."""
    template = StaticMixtureWorkSource(three_datasets(), {"web": 2, "code": 1, "math": 1}, chunk_size=12, seed=9)
    other = StaticMixtureWorkSource(three_datasets(), {"web": 2, "code": 1, "math": 1}, chunk_size=12, seed=10)
    mine, my_entries = _moved_lanes(template, 2, [0, 0], [1, 2])
    theirs, their_entries = _moved_lanes(other, 2, [0, 0], [1, 2])
    ledger = SealingLedger()
    ledger.add({0: (mine[0], 0, 0)}, Sealer(template, 2, {0: my_entries[0]}))
    ledger.add({1: (theirs[1], 0, 0)}, Sealer(other, 2, {1: their_entries[1]}))
    assert ledger.fields() is None
    assert canonical(_state(2, ledger)) == canonical(_state(2, dict(ledger)))
