"""A downstream determinism suite, written only against zephon's public testing kit."""
from hypothesis import given, settings
from hypothesis import strategies as st
from user_pipeline import build_pipeline, build_source

from zephon.testing import (assert_elastic_resume_equivalent, assert_replay_equivalent,
                            assert_same_stream_in_fresh_process, cut_points, loader_topologies, stream_digest)


@given(cut_points(max_chunks=140))  # the stream has 133 chunks: cuts reach past its end
def test_any_checkpoint_replays_the_rest_exactly(cuts):
    assert_replay_equivalent(build_source, cuts)


@settings(max_examples=15)
@given(loader_topologies(), st.integers(0, 2300), loader_topologies())  # 2,200 samples: cuts reach past the end
def test_a_job_resumed_on_another_topology_reads_every_lane_exactly(first, cut, second):
    assert_elastic_resume_equivalent(build_pipeline, first, cut, second)


def test_a_fresh_interpreter_reads_the_same_items():
    assert_same_stream_in_fresh_process(build_pipeline)


def test_the_data_order_is_pinned(zephon_golden):
    digest = zephon_golden("user_pipeline", build_pipeline())
    assert digest == stream_digest(build_pipeline()) != stream_digest(build_source())  # the items count too
