"""Hostile input: every limit of zephon.limits is refused with a message naming it, never a crash,
a hang or a silently different stream."""
import json
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from helpers import three_datasets

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.checkpoint import VERSION, sealed
from zephon.limits import MAX_CHUNK_INDEX, MAX_MESSAGE_VALUE, MAX_PASSES, MAX_REPLICAS, MAX_SAMPLES

MIX = {"web": 5, "code": 3, "math": 2}


def source(**overrides):
    kwargs = dict(datasets=three_datasets(), mixture=MIX, chunk_size=10)
    kwargs.update(overrides)
    return StaticMixtureWorkSource(**kwargs)


def two(*weights, **overrides):
    datasets = [Dataset.from_counts("a", [100] * 4), Dataset.from_counts("b", [100] * 4)]
    return StaticMixtureWorkSource(datasets, dict(zip("ab", weights)), chunk_size=16, **overrides)


@pytest.mark.parametrize("weights, words", [
    ((1e308, 1e308), "finite sum"),
    ((1.7e308, 1.0), "smallest share"),
    ((10**400, 1), "positive and finite"),
    ((1.0, float("inf")), "positive and finite"),
])
def test_weights_that_would_crash_or_never_end_are_refused(weights, words):
    with pytest.raises(ValueError, match=words):
        two(*weights)


def test_a_stream_too_long_to_index_says_so_at_once_naming_the_dataset():
    lane = two(1.0, 1e-12).clone_for_lane(0, 1)
    assert not lane.supports_indexing()
    with pytest.raises(ValueError, match="too long to index.*'b'"):
        len(lane)
    with pytest.raises(ValueError, match="'b'"):
        lane.remaining_samples()
    assert lane.next_chunk() is not None  # streaming still works


@pytest.mark.parametrize("kwargs, error, words", [
    ({"max_repeats": 2**63}, ValueError, f"max_repeats must be in \\[0, {MAX_PASSES}\\]"),
    ({"stop_after_passes": 2**63}, ValueError, f"stop_after_passes must be in \\[1, {MAX_PASSES}\\]"),
    ({"chunk_size": 2**40}, ValueError, "chunk_size must be in"),
    ({"chunk_size": 16.0}, TypeError, "chunk_size"),
    ({"shuffle_block_size": np.array([3, 3])}, TypeError, "shuffle_block_size"),
    ({"shuffle_block_size": 2.5}, TypeError, "shuffle_block_size"),
    ({"exhausted_policy": ["stop"]}, ValueError, "exhausted_policy"),
    ({"lane_assignment": ["modulo"]}, ValueError, "lane_assignment"),
    ({"seed": 1.0}, TypeError, "seed"),
])
def test_out_of_range_arguments_name_the_parameter_and_its_limit(kwargs, error, words):
    with pytest.raises(error, match=words):
        source(**kwargs)


@pytest.mark.parametrize("lane, replicas", [(0, 2**63), (2**63, 2**63 + 1), (0, MAX_REPLICAS + 1), (True, 2)])
def test_lane_bindings_beyond_the_limits_are_refused(lane, replicas):
    with pytest.raises((ValueError, TypeError), match="lane_id|canonical_replicas"):
        source().clone_for_lane(lane, replicas)


@pytest.mark.parametrize("counts, words", [
    ([2**62, 2**62], "must be <= 281474976710656"),
    ([2**63], "must be <= 281474976710656"),
    ([2**70], "must be <= 281474976710656"),
    ([MAX_SAMPLES // 2 + 1, MAX_SAMPLES // 2 + 1], "add up"),
])
def test_overflowing_datasets_are_refused(counts, words):
    with pytest.raises(ValueError, match=words):
        Dataset.from_counts("a", counts)


def test_many_datasets_together_may_not_pass_the_stream_limit():
    datasets = [Dataset.from_counts(f"d{i}", [MAX_SAMPLES]) for i in range(17)]
    with pytest.raises(ValueError, match="2\\*\\*52"):
        StaticMixtureWorkSource(datasets, {d.name: 1 for d in datasets})


def test_error_messages_are_bounded():
    with pytest.raises(TypeError) as error:
        source(chunk_size=list(range(10**6)))
    assert len(str(error.value)) < 400
    with pytest.raises(ValueError) as error:
        source(mixture={"web": 1, "code": 1, "math": 1, "x" * 10**6: 1})
    assert len(str(error.value)) < 4 * MAX_MESSAGE_VALUE + 200


def _lane(replicas=1, lane=0, **overrides):
    return source(exhausted_policy="repeat", **overrides).clone_for_lane(lane, replicas)


def _edited(state, path, value):
    node = state
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return state


@pytest.mark.parametrize("path, value", [
    (["state", "chunk_index"], 6),
    (["state", "chunk_index"], 4),
    (["state", "chunk_index"], 10**18),
    (["state", "chunk_index"], 2**63 - 1),
    (["state", "cursors", "web", "epoch"], 1),
    (["state", "cursors", "web", "position"], 1),
    (["lane", ], True),
    (["canonical_replicas"], 1.0),
    (["version"], float(VERSION)),
    (["fingerprint", "chunk_size"], 10.0),
    (["fingerprint", "shuffle_shards"], 1),
    (["extra"], 1),
])
def test_hand_edited_states_are_refused_by_the_digest(path, value):
    lane = _lane()
    for _ in range(5):
        lane.next_chunk()
    state = _edited(json.loads(json.dumps(lane.state_dict())), path, value)
    fresh = _lane()
    with pytest.raises(ValueError, match="digest mismatch|version|unknown keys"):
        fresh.load_state_dict(state)
    assert fresh.state.chunk_index == 0


@pytest.mark.parametrize("path, value, words", [
    (["state", "chunk_index"], MAX_CHUNK_INDEX + 1, "chunk_index must be an int in"),
    (["state", "cursors", "web", "epoch"], MAX_CHUNK_INDEX + 1, "epoch must be an int in"),
    (["lane"], True, "lane"),
    (["canonical_replicas"], 1.0, "lane"),
    (["version"], float(VERSION), "version"),
    (["fingerprint", "chunk_size"], 10.0, "chunk_size"),
    (["fingerprint", "shuffle_shards"], 1, "shuffle_shards"),
    (["fingerprint", "extra"], 1, "unknown keys"),
    (["extra"], 1, "unknown keys"),
])
def test_resealed_states_are_still_checked_with_exact_types(path, value, words):
    state = _edited(json.loads(json.dumps(_lane().state_dict())), path, value)
    with pytest.raises(ValueError, match=words):
        _lane().load_state_dict(sealed(state))


def _moved_on(state, chunks, chunk_size=10):
    """``state`` with ``chunks`` more chunks' samples read, all from the first dataset (a state
    the stream never reaches in order, but one that agrees with its chunk index)."""
    first = three_datasets()[0]
    total = int(first.counts().sum())
    cursor = state["state"]["cursors"][first.name]
    read = cursor["epoch"] * total + cursor["position"] + chunks * chunk_size
    cursor["epoch"], cursor["position"] = (read - 1) // total, (read - 1) % total + 1
    state["state"]["chunk_index"] += chunks
    return state


@given(steps=st.integers(0, 20), shift=st.integers(-20, 20).filter(bool), replicas=st.integers(1, 3),
       tail=st.sampled_from(["carry", "drop"]))
def test_a_resealed_state_whose_chunk_disagrees_with_its_cursors_is_refused(steps, shift, replicas, tail):
    lane = _lane(replicas, replicas - 1, pass_tail=tail)
    for _ in range(steps):
        lane.next_chunk()
    state = json.loads(json.dumps(lane.state_dict()))
    assume(state["state"]["chunk_index"] + shift >= 0)
    state["state"]["chunk_index"] += shift
    fresh = _lane(replicas, replicas - 1, pass_tail=tail)
    before = fresh.state
    with pytest.raises(ValueError, match=r"checkpoint is at chunk \d+, but its cursors have read .*corrupted"):
        fresh.load_state_dict(sealed(state))
    assert fresh.state == before


def test_counters_near_the_limit_restore_and_continue_without_overflow():
    for replicas, lane in ((1, 0), (3, 1)):
        state = _moved_on(json.loads(json.dumps(_lane(replicas, lane).state_dict())), MAX_CHUNK_INDEX - 100)
        restored = _lane(replicas, lane)
        restored.load_state_dict(sealed(state))
        for _ in range(3):
            assert restored.next_chunk() is not None
        restored.load_state_dict(restored.state_dict())


def test_older_versions_are_refused_by_number():
    state = _lane().state_dict()
    state["version"] = 2
    with pytest.raises(ValueError, match="version 2 is not supported"):
        _lane().load_state_dict(sealed(state))


@pytest.mark.parametrize("where", ["top", "alloc"])
def test_deep_and_huge_states_are_refused_without_recursion(where):
    state = json.loads(json.dumps(_lane().state_dict()))
    if where == "top":
        deep = []
        for _ in range(100_000):
            deep = [deep]
        state["state"]["alloc"] = deep
        words = "nested deeper"
    else:
        state["state"]["alloc"] = [0.0] * 10**6
        words = "larger than"
    with pytest.raises(ValueError, match=words) as error:
        _lane().load_state_dict(sealed(state) if where == "alloc" else state)
    assert len(str(error.value)) < 400


def test_the_fingerprint_compares_what_determines_the_stream():
    datasets = lambda: [Dataset.from_counts("web", [50] * 4), Dataset.from_counts("code", [50] * 4)]
    first = StaticMixtureWorkSource(datasets(), {"web": 70, "code": 30}, chunk_size=10).clone_for_lane(0, 1)
    second = StaticMixtureWorkSource(datasets(), {"code": 0.3, "web": 0.7}, chunk_size=10).clone_for_lane(0, 1)
    for _ in range(3):
        first.next_chunk()
    second.load_state_dict(first.state_dict())
    assert [second.next_chunk() for _ in range(5)] == [first.next_chunk() for _ in range(5)]


def assert_interrupted(code: str, what: str) -> None:
    """Run ``code`` in a child, SIGINT it once it prints "ready", and require a KeyboardInterrupt."""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    child.send_signal(signal.SIGINT)
    try:
        _, stderr = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        raise AssertionError(f"{what} ignored Ctrl-C")
    assert child.returncode != 0 and "KeyboardInterrupt" in stderr


def test_a_long_walk_answers_ctrl_c():
    """remaining_samples() on a stream of about 2.5e8 chunks (minutes of walking) stops on SIGINT."""
    code = textwrap.dedent("""
        from zephon import Dataset, StaticMixtureWorkSource
        datasets = [Dataset.from_counts("a", [10**6]), Dataset.from_counts("b", [250])]
        lane = StaticMixtureWorkSource(datasets, {"a": 1.0, "b": 1e-6}, chunk_size=1).clone_for_lane(0, 1)
        print("ready", flush=True)
        lane.remaining_samples()
    """)
    assert_interrupted(code, "the walk")


def test_odd_random_access_indices_get_short_messages():
    lane = source().clone_for_lane(0, 1)
    for index, error in ((10**5000, IndexError), (-(10**5000), IndexError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error) as raised:
            lane.sample_id_at(index)
        assert len(str(raised.value)) < 300
    with pytest.raises(TypeError) as raised:
        lane.sample_ids_at([10**5000] * 10**5)
    assert len(str(raised.value)) < 300


def test_a_deep_payload_in_a_well_formed_checkpoint_file_is_refused(tmp_path):
    import hashlib

    from zephon.runtime import load_checkpoint

    payload = b"[" * 100_000 + b"]" * 100_000
    header = f"zephon-checkpoint 1 sha256={hashlib.sha256(payload).hexdigest()} bytes={len(payload)}\n"
    (tmp_path / "deep").write_bytes(header.encode() + payload)
    with pytest.raises(ValueError, match="malformed JSON|nested deeper"):
        load_checkpoint(tmp_path / "deep")


@pytest.mark.parametrize("shards", [[1, 2], "ab", 5, [["a"], None]])
def test_in_memory_shards_must_be_sequences_of_records(shards):
    with pytest.raises(TypeError, match="shards must be a sequence of sequences"):
        Dataset.from_records("a", shards)


def test_skipping_other_lanes_chunks_answers_ctrl_c():
    """The last of 2**24 lanes over 2,000 datasets skips about 1.7e7 chunks to its first one, one
    by one: shares of half a sample have no closed form to skip them in blocks."""
    code = textwrap.dedent("""
        from zephon import Dataset, StaticMixtureWorkSource
        datasets = [Dataset.from_counts(f"d{i}", [10**6]) for i in range(2000)]
        source = StaticMixtureWorkSource(datasets, {d.name: 1 for d in datasets}, chunk_size=1000,
                                         exhausted_policy="repeat", lane_assignment="modulo")
        lane = source.clone_for_lane(2**24 - 1, 2**24)
        print("ready", flush=True)
        lane.next_chunk()
    """)
    assert_interrupted(code, "skipping other lanes' chunks")
