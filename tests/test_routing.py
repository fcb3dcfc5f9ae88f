"""Each lane routing's inverse (what the kernel runs) agrees with its forward rule."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from zephon.core.routing import ROUTINGS

keys = st.integers(0, 2**64 - 1)
replicas = st.integers(1, 40)


@given(st.sampled_from(sorted(ROUTINGS)), keys, replicas, st.integers(0, 10**6), st.data())
def test_next_own_is_the_first_chunk_the_forward_rule_gives_the_lane(name, key, r, g, data):
    routing = ROUTINGS[name]
    lane = data.draw(st.integers(0, r - 1))
    own = routing.next_own(key, g, lane, r)
    assert own >= g and routing.lane_of(key, own, r) == lane
    assert all(routing.lane_of(key, h, r) != lane for h in range(g, own))


@given(st.sampled_from(sorted(ROUTINGS)), keys, replicas, st.integers(0, 10**4))
def test_every_block_of_r_chunks_visits_every_lane_once(name, key, r, block):
    routing = ROUTINGS[name]
    assert sorted(routing.lane_of(key, block * r + i, r) for i in range(r)) == list(range(r))


def test_codes_are_distinct_and_named():
    assert sorted(r.code for r in ROUTINGS.values()) == list(range(len(ROUTINGS)))
    assert all(name == r.name for name, r in ROUTINGS.items())
