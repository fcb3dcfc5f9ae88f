"""Counting every lane's remaining samples in one walk of the global schedule: the kernel agrees
with its twin, and the counts equal a lane-by-lane walk, from any positions, on random configs."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.cache import scheduler
from zephon.core.checkpoint import sealed
from zephon.core.counting import count_lanes_reference
from zephon.core.schedule import initial_state, state_arrays
from zephon.runtime import count_ranks, countable, maybe_finite
from zephon.runtime._even import lane_remaining, lanes_remaining
from zephon.testing import source_configs
from test_schedule import _Fork


_REPEATING = {"datasets": [Dataset.from_counts("a", [5, 7])], "mixture": {"a": 1.0}, "chunk_size": 4}


@given(source_configs(), st.integers(1, 9), st.integers(0, 60), st.data())
def test_the_counting_kernel_matches_its_twin(kwargs, replicas, stop, data):
    template = StaticMixtureWorkSource(**kwargs)
    config = template.config
    kernel = scheduler(config)
    if kernel is None:
        return
    starts = data.draw(st.lists(st.integers(0, 40), min_size=replicas, max_size=replicas))
    expected = [0] * replicas
    state, ended = count_lanes_reference(config, initial_state(config), replicas, starts, expected, stop)
    arrays = state_arrays(initial_state(config), len(config.datasets))
    totals = np.zeros(replicas, dtype=np.int64)
    g, kernel_ended = kernel.count_lanes(0, *arrays, replicas, config.routing.code, config.lane_key,
                                         np.array(starts, dtype=np.int64), totals, stop)
    assert totals.tolist() == expected and (g, kernel_ended) == (state.chunk_index, ended)
    if not ended:  # after an end the kernel's arrays hold no meaningful state
        assert all(np.array_equal(a, b) for a, b in zip(arrays, state_arrays(state, len(config.datasets))))


@settings(max_examples=60, deadline=None)
@given(source_configs(), st.integers(1, 9), st.data())
def test_lane_counts_equal_a_lane_by_lane_walk(kwargs, replicas, data):
    template = StaticMixtureWorkSource(**kwargs)
    entries = {}
    for lane in range(replicas):
        source = template.clone_for_lane(lane, replicas)
        for _ in range(data.draw(st.integers(0, 6))):  # lanes at different positions, some ended
            source.next_chunk()
        chunk_start = source.state_dict()
        chunk = source.next_chunk()
        consumed = data.draw(st.integers(0, len(chunk))) if chunk is not None else 0
        entries[lane] = (chunk_start, consumed, 0)
    counted = lanes_remaining(template, replicas, entries)
    assert counted == {lane: lane_remaining(template, lane, replicas, entry) for lane, entry in entries.items()}
    assert lanes_remaining(template, replicas, entries, checked=True) == counted  # a loader's count
    states = {lane: entry[0] for lane, entry in entries.items()}
    assert template.remaining_by_lane(states, replicas) == {lane: counted[lane] + entries[lane][1] for lane in states}


def test_a_lane_off_the_walk_is_counted_from_its_own_state():
    """A lane state at its chunk but not where the schedule stands there (as a migrated stream's)
    is counted on its own, not given the walk's count."""
    template = StaticMixtureWorkSource([Dataset.from_counts("a", [5, 7]), Dataset.from_counts("b", [4, 6])],
                                       {"a": 0.5, "b": 0.5}, chunk_size=4, exhausted_policy="stop")
    lane = template.clone_for_lane(0, 2)
    lane.next_chunk()
    off = copy.deepcopy(lane.state_dict())
    off["state"]["cursors"]["a"]["position"] -= 1  # as many samples drawn, from elsewhere
    off["state"]["cursors"]["b"]["position"] += 1
    entries = {0: (sealed(off), 0, 0), 1: (template.clone_for_lane(1, 2).state_dict(), 0, 0)}
    counted = lanes_remaining(template, 2, entries)
    assert counted == {lane: lane_remaining(template, lane, 2, entry) for lane, entry in entries.items()}
    assert counted[0] != lanes_remaining(template, 2, {**entries, 0: (lane.state_dict(), 0, 0)})[0]


def test_remaining_by_lane_checks_states_unless_told_they_were():
    template = StaticMixtureWorkSource(**_REPEATING)
    states = {lane: template.clone_for_lane(lane, 2).state_dict() for lane in range(2)}
    tampered = {**states, 1: {**states[1], "digest": "0" * 32}}
    with pytest.raises(ValueError, match="digest"):
        template.remaining_by_lane(tampered, 2)
    assert template.remaining_by_lane(tampered, 2, checked=True) == template.remaining_by_lane(states, 2)
    swapped = {0: states[1], 1: states[0]}  # a lane's position is checked either way
    for checked in (False, True):
        with pytest.raises(ValueError, match="belongs to lane 1 of 2"):
            template.remaining_by_lane(swapped, 2, checked=checked)


def test_counting_checks_states_unless_the_caller_did():
    template = StaticMixtureWorkSource(**_REPEATING)
    other = StaticMixtureWorkSource(**{**_REPEATING, "seed": 2})  # another run's settings
    entries = {lane: (other.clone_for_lane(lane, 2).state_dict(), 0, 0) for lane in range(2)}
    with pytest.raises(ValueError, match="seed"):
        count_ranks(template, 2, entries, 1, "contiguous", 4, False)
    with pytest.raises(ValueError, match="seed"):
        lane_remaining(template, 0, 2, entries[0])


def test_a_loaders_count_takes_its_states_as_checked():
    template = StaticMixtureWorkSource(**_REPEATING)
    other = StaticMixtureWorkSource(**{**_REPEATING, "seed": 2})  # not checked again, so not refused
    entries = {lane: (other.clone_for_lane(lane, 2).state_dict(), 0, 0) for lane in range(2)}
    assert sorted(lanes_remaining(template, 2, entries, checked=True)) == [0, 1]


class _Counted(StaticMixtureWorkSource):
    def remaining_by_lane(self, states, replicas):  # an override of the signature before ``checked``
        return super().remaining_by_lane(states, replicas)


class _Unreadable(StaticMixtureWorkSource):
    """A ``remaining_by_lane`` whose signature cannot be read (it says it takes ``checked``)."""

    @property
    def remaining_by_lane(self):
        def count(states, replicas):
            return StaticMixtureWorkSource.remaining_by_lane(self, states, replicas)
        count.__signature__ = "(states, replicas, checked)"  # not a Signature: inspect raises TypeError
        return count


@pytest.mark.parametrize("kind", [_Counted, _Unreadable])
def test_a_sources_own_remaining_by_lane_need_not_take_checked(kind):
    template = kind(**_REPEATING)
    entries = {lane: (template.clone_for_lane(lane, 2).state_dict(), 0, 0) for lane in range(2)}
    assert lanes_remaining(template, 2, entries, checked=True) == lanes_remaining(template, 2, entries)


def test_a_stream_that_repeats_forever_has_no_count():
    template = StaticMixtureWorkSource(**{**_REPEATING, "exhausted_policy": "repeat"})
    entries = {lane: (template.clone_for_lane(lane, 2).state_dict(), 0, 0) for lane in range(2)}
    with pytest.raises(TypeError, match="repeats forever"):
        lanes_remaining(template, 2, entries)


def test_lanes_of_an_allocator_of_its_own_are_counted_one_by_one():
    template = StaticMixtureWorkSource(**_REPEATING, allocation=_Fork())
    entries = {lane: (template.clone_for_lane(lane, 3).state_dict(), 0, 0) for lane in range(3)}
    assert scheduler(template.config) is None
    assert lanes_remaining(template, 3, entries) == {lane: lane_remaining(template, lane, 3, entry)
                                                     for lane, entry in entries.items()}


def test_no_lanes_have_no_count():
    assert StaticMixtureWorkSource(**_REPEATING).remaining_by_lane({}, 3) == {}


class _Indexed:
    """A source of its own that says it has random access but cannot count a lane's samples."""

    def supports_indexing(self):
        return True


def test_only_a_source_that_counts_its_samples_is_countable():
    assert not countable(object()) and not countable(_Indexed())
    assert countable(StaticMixtureWorkSource(**_REPEATING))
    assert maybe_finite(object())  # a source without a mixture config may end
    assert not maybe_finite(StaticMixtureWorkSource(**{**_REPEATING, "exhausted_policy": "repeat"}))
