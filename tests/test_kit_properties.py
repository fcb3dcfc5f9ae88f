"""The project's own properties, stated with the zephon.testing kit (the kit dogfooded).

Sources, states and topologies are drawn by the kit's strategies; each property is one of
its assertions, so a failure here reads the way it would in a downstream suite.
"""
import copy
import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.testing import (assert_elastic_resume_equivalent, assert_lanes_partition, assert_mixture_prefix_bound,
                            assert_passes_complete, assert_replay_equivalent, assert_same_stream_in_fresh_process,
                            collect, cut_points, loader_topologies, phased_sources, reachable_states, sources,
                            stream_digest)
from zephon.work import MixtureReadConfig, PhasedMixtureWorkSource, WorkChunk


@given(sources(canonical_replicas=st.integers(1, 3)) | phased_sources(canonical_replicas=st.integers(1, 3)),
       cut_points(max_chunks=30))
def test_every_checkpoint_replays_the_rest(source, cuts):
    assert_replay_equivalent(lambda: source, cuts, max_chunks=40)


@given(sources() | phased_sources(), st.integers(1, 4))
def test_lanes_partition_the_global_stream(source, replicas):
    assert_lanes_partition(lambda: source, replicas, max_chunks=60)


@given(st.data())
def test_a_reachable_state_restores_to_the_stream_from_there(data):
    source = data.draw(sources(canonical_replicas=st.integers(1, 3)))
    state = data.draw(reachable_states(source, max_chunks=20))
    uninterrupted = collect(copy.copy(source), 60)
    fresh = copy.copy(source)
    fresh.load_state_dict(state)
    rest = collect(fresh, 40)
    ended = len(rest) < 40
    assert any(uninterrupted[k:k + len(rest)] == rest and (not ended or k + len(rest) == len(uninterrupted))
               for k in range(21))  # the state lies at most 20 chunks in; a stream that ended must end there too


SHARED = st.shared(sources(), key="template")


@given(SHARED, reachable_states(SHARED, max_chunks=10))
def test_a_shared_template_and_its_state_agree(template, state):
    lane = template.clone_for_lane(0, 1)
    lane.load_state_dict(state)
    assert lane.state_dict() == state


@settings(max_examples=25)
@given(sources(), loader_topologies(), st.integers(0, 300), loader_topologies())
def test_an_elastic_resume_reads_every_lane_exactly(source, first, cut, second):
    assert_elastic_resume_equivalent(lambda: source, first, cut, second)


@given(sources(allocations="accumulator", policies=st.sampled_from(["repeat", "stop"])))
def test_every_prefix_keeps_the_mixture_within_two_samples(source):
    assert_mixture_prefix_bound(lambda: source, 2, max_chunks=60)


@given(sources())
def test_every_completed_pass_holds_each_sample_once(source):
    assert_passes_complete(lambda: source, max_chunks=200)


@given(st.from_type(StaticMixtureWorkSource), st.from_type(PhasedMixtureWorkSource), st.from_type(WorkChunk),
       st.from_type(MixtureReadConfig), st.from_type(Dataset))
def test_zephon_types_can_be_drawn_with_from_type(source, phased, chunk, read_config, dataset):
    assert source.lane_id is None and len(collect(source.clone_for_lane(0, 1), 3)) >= 1
    assert phased.lane_id is None and len(collect(phased.clone_for_lane(0, 1), 3)) >= 1
    assert WorkChunk.from_state(chunk.state_dict()) == chunk
    assert sorted(map(tuple, chunk.read_order(read_config)[0].tolist())) == sorted(
        tuple(p) for pointers in chunk.components.values() for p in pointers.tolist())
    assert dataset.total() == sum(dataset.counts())


def web_and_code(seed: int = 7) -> StaticMixtureWorkSource:
    data = [Dataset.from_counts("web", [90, 0, 45]), Dataset.from_counts("code", [30, 30])]
    return StaticMixtureWorkSource(data, {"web": 0.7, "code": 0.3}, chunk_size=16, seed=seed,
                                   shuffle_within_shard=True, exhausted_policy={"web": "stop", "code": "repeat"})


def test_the_stream_is_the_same_in_a_fresh_process():
    assert_same_stream_in_fresh_process(web_and_code)
    assert_same_stream_in_fresh_process(functools.partial(web_and_code, seed=8), max_chunks=5)
    assert stream_digest(web_and_code()) != stream_digest(web_and_code(seed=8))
