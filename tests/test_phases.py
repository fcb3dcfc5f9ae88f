"""PhasedMixtureWorkSource: phases where configured on every lane, cursors carried, the static
source's guarantees per phase (partition, replay, len and random access, mixture bound)."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core import phases
from zephon.testing import assert_lanes_partition, assert_replay_equivalent, collect, phased_source_configs
from zephon.work import Phase, PhasedMixtureWorkSource, TokenEstimation

from helpers import three_datasets


def _read_order(chunks) -> np.ndarray:
    return np.concatenate([c.read_order()[0] for c in chunks]) if chunks else np.zeros((0, 3), dtype=np.int64)


@given(phased_source_configs(), st.integers(2, 4))
def test_lanes_partition_and_replay(kwargs, replicas):
    assert_lanes_partition(lambda: PhasedMixtureWorkSource(**kwargs), replicas, max_chunks=200)
    lane = replicas - 1
    assert_replay_equivalent(lambda: PhasedMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas),
                             [0, 1, 3, 7, 12], max_chunks=200)


@given(phased_source_configs(), st.integers(1, 3))
def test_len_and_random_access_match_the_stream(kwargs, replicas):
    template = PhasedMixtureWorkSource(**kwargs)
    for lane in range(replicas):
        clone = template.clone_for_lane(lane, replicas)
        streamed = _read_order(collect(PhasedMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas), 10**6))
        assert len(clone) == len(streamed)
        assert clone.remaining_samples() == len(streamed)
        assert np.array_equal(clone.sample_ids_at(np.arange(len(streamed))[::-1]), streamed[::-1])
        if len(streamed):
            assert clone.sample_id_at(len(streamed) - 1) == tuple(streamed[-1].tolist())


@given(phased_source_configs(), st.integers(1, 4))
def test_boundaries_fall_where_configured_on_every_lane(kwargs, replicas):
    """Every chunk holds only datasets of its phase, and each phase starts at its bound."""
    template = PhasedMixtureWorkSource(**kwargs)
    starts = template.phase_starts()
    single = collect(template.clone_for_lane(0, 1), 400)
    samples = np.cumsum([0] + [len(c) for c in single])
    for k, phase in enumerate(kwargs["phases"][:-1]):
        end = starts[k + 1]
        if end >= len(samples):
            continue
        kind, value = phase.bound()
        if phases.ended_early(template.config, k):  # it could not go on: the next phase starts there
            assert (end < value) if kind == "chunk" else (samples[end] < value)
        elif kind == "chunk":
            assert end == max(value, starts[k])
        else:
            assert samples[end] >= value and (end == starts[k] or samples[end - 1] < value)
    for lane in range(replicas):
        clone = template.clone_for_lane(lane, replicas)
        while (chunk := clone.next_chunk()) is not None:
            g = clone.state.chunk_index - 1  # the chunk just produced
            if g >= len(single):
                break
            weights = kwargs["phases"][template.phase_of_chunk(g)].weights([d.name for d in kwargs["datasets"]])
            assert set(chunk.components) <= set(weights)
            assert chunk == single[g]


@pytest.mark.parametrize("bound", [{"until_chunk": 5}, {"until_sample": 20}])
def test_a_phase_whose_datasets_run_out_hands_over_to_the_next(bound, caplog):
    """Only the last phase ends the stream: phase 0 reads all 10 samples of 'a' in 3 chunks of 4,
    short of its bound, and phase 1 then reads 'b' whole."""
    data = [Dataset.from_counts("a", [10]), Dataset.from_counts("b", [100])]
    source = PhasedMixtureWorkSource(data, [Phase({"a": 1}, **bound), Phase({"a": 1, "b": 1})], chunk_size=4,
                                     exhausted_policy="redistribute")
    with caplog.at_level("INFO", logger="zephon"):
        chunks = collect(source.clone_for_lane(0, 1), 100)
    read = Counter((name, *p[1:]) for c in chunks for p, name in c)
    assert sorted(read) == sorted([("a", 0, i) for i in range(10)] + [("b", 0, i) for i in range(100)])
    assert set(read.values()) == {1} and len(source) == 110 and source.phase_starts() == [0, 3]
    assert "phase 0 could not go on to its bound" in caplog.text


def test_a_first_phase_that_cannot_make_the_streams_first_chunk_is_an_error():
    data = [Dataset.from_counts("a", [2]), Dataset.from_counts("b", [40])]
    source = PhasedMixtureWorkSource(data, [Phase({"a": 1}, until_chunk=5), Phase({"b": 1})], chunk_size=4,
                                     exhausted_policy="stop")
    with pytest.raises(ValueError, match=r"phases\[0\]: global chunk 0 cannot be produced: dataset 'a'"):
        source.clone_for_lane(0, 1).next_chunk()


SMALL_WEIGHTS = st.floats(0.001, 1.0) | st.sampled_from([1.0, 0.1, 0.02, 0.005, 0.001]) | st.integers(1, 20).map(
    lambda k: k / 20)


@st.composite
def repeating_phased_configs(draw):
    """A repeating (endless) phased source of up to 8 datasets with weights down to 0.001 and
    small chunks, where the accumulator's corrections are the most frequent."""
    chunk_size = draw(st.integers(1, 12))
    names = [f"d{i}" for i in range(draw(st.integers(2, 8)))]
    data = [Dataset.from_counts(n, draw(st.lists(st.integers(chunk_size + 1, 60), min_size=1, max_size=3)))
            for n in names]
    phases, until = [], 0
    for k in range(draw(st.integers(1, 3))):
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
        mixture = {n: draw(SMALL_WEIGHTS) for n in chosen}
        until += draw(st.integers(1, 120))
        phases.append(Phase(mixture, until_chunk=until))
    phases[-1] = Phase(phases[-1].mixture)
    return dict(datasets=data, phases=phases, chunk_size=chunk_size, seed=draw(st.integers(0, 2**32)),
                exhausted_policy="repeat", allocation="accumulator")


@given(phased_source_configs(num_datasets=st.integers(1, 6)) | repeating_phased_configs())
@example(dict(datasets=[Dataset.from_counts(f"d{i}", [2000]) for i in range(5)], chunk_size=1,
              phases=[Phase({"d0": 1, "d1": 0.1, "d2": 1, "d3": 1, "d4": 0.02})], exhausted_policy="repeat"))
def test_per_phase_mixture_within_the_static_prefix_bound(kwargs):
    """Inside a phase the accumulator starts from zero: after every chunk of the phase, each
    dataset has drawn at most one sample more than its weight's share of the phase's samples
    and less than two fewer (full chunks, repeating datasets)."""
    assume(kwargs.get("stop_after_passes") is not None or kwargs.get("exhausted_policy") == "repeat")
    assume(kwargs.get("allocation", "accumulator") == "accumulator")
    template = PhasedMixtureWorkSource(**kwargs)
    names = [d.name for d in kwargs["datasets"]]
    chunks = collect(template.clone_for_lane(0, 1), 300)
    counts, phase_of = Counter(), None
    for g, chunk in enumerate(chunks):
        p = template.phase_of_chunk(g)
        if p != phase_of:
            phase_of, counts, drawn = p, Counter(), 0
            weights = kwargs["phases"][p].weights(names)
            total = sum(weights.values())
        counts.update({n: len(a) for n, a in chunk.components.items()})
        drawn += len(chunk)
        for n in names:
            ahead = counts[n] - drawn * weights.get(n, 0.0) / total
            assert -2.0 < ahead <= 1.0 + 1e-9, (n, g, ahead)


def test_cursors_continue_across_phases_and_paused_datasets_wait():
    data = three_datasets()
    phases = [Phase({"web": 1, "code": 1}, until_chunk=4), Phase({"math": 1, "code": 1}, until_sample=128),
              Phase({"web": 1, "code": 1, "math": 1})]
    template = PhasedMixtureWorkSource(data, phases, chunk_size=16, seed=5, exhausted_policy="stop")
    chunks = collect(template.clone_for_lane(0, 1), 10**4)
    assert template.phase_starts() == [0, 4, 8]
    assert [set(c.components) for c in chunks[:8]] == [{"web", "code"}] * 4 + [{"math", "code"}] * 4
    pointers = [tuple(p) for c in chunks for a in c.components.values() for p in a.tolist()]
    assert len(pointers) == len(set(pointers))  # one pass each: nothing repeated, nothing skipped
    static = StaticMixtureWorkSource(data[:2], {"web": 1, "code": 1}, chunk_size=16, seed=5, exhausted_policy="stop")
    assert collect(static.clone_for_lane(0, 1), 4) == chunks[:4]  # the same keys: phase 0 is the static stream


def test_checkpoint_is_small_json_and_strict():
    data = three_datasets()
    phases = [Phase({"web": 1}, until_chunk=3), Phase({"web": 1, "math": 2})]
    source = PhasedMixtureWorkSource(data, phases, chunk_size=8, stop_after_passes=None,
                                     exhausted_policy="repeat").clone_for_lane(1, 2)
    for _ in range(5):
        source.next_chunk()
    state = json.loads(json.dumps(source.state_dict()))
    assert state["phase"] == 1 and len(json.dumps(state)) < 4096
    other = PhasedMixtureWorkSource(data, [Phase({"web": 1}, until_chunk=4), phases[1]], chunk_size=8,
                                    stop_after_passes=None, exhausted_policy="repeat").clone_for_lane(1, 2)
    with pytest.raises(ValueError, match="other phases"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="lane"):
        PhasedMixtureWorkSource(data, phases, chunk_size=8, stop_after_passes=None,
                                exhausted_policy="repeat").clone_for_lane(0, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="digest"):
        source.load_state_dict({**state, "phase": 7})


def test_token_mode_phases_end_at_their_token_bound():
    data = [Dataset.from_records(n, [[{"text": "x" * (k + 1) * size} for k in range(20)] for _ in range(3)])
            for n, size in (("short", 2), ("long", 9))]
    estimation = TokenEstimation(primer=0.5)
    phases = [Phase({"short": 1}, until_token=300), Phase({"short": 1, "long": 1})]
    template = PhasedMixtureWorkSource(data, phases, chunk_size=8, token_estimation=estimation,
                                       stop_after_passes=2)
    template.prime()
    starts = template.phase_starts()
    chunks = collect(template.clone_for_lane(0, 1), 10**4)
    assert starts[1] is not None and 0 < starts[1] < len(chunks)
    assert all(set(c.components) == {"short"} for c in chunks[:starts[1]])
    assert len(template.clone_for_lane(0, 1)) == sum(len(c) for c in chunks)
    assert_lanes_partition(lambda: _primed(data, phases, estimation), 3)
    assert_replay_equivalent(lambda: _primed(data, phases, estimation).clone_for_lane(1, 2), [0, 2, 5, 9])


def _primed(data, phases, estimation):
    template = PhasedMixtureWorkSource(data, phases, chunk_size=8, token_estimation=estimation, stop_after_passes=2)
    template.prime()
    return template


@pytest.mark.parametrize("phases, match", [
    ([], "non-empty list"),
    ([Phase({"web": 1}, until_chunk=3)], "last phase is open-ended"),
    ([Phase({"web": 1}), Phase({"web": 1})], "needs until_chunk"),
    ([Phase({"web": 1}, until_chunk=5), Phase({"web": 1}, until_chunk=3), Phase({"web": 1})], "must increase"),
    ([Phase({"nope": 1})], "unknown datasets"),
    ([Phase({"web": 0})], "positive weight"),
    ([Phase({"web": 1}, until_token=5), Phase({"web": 1})], "needs token_estimation"),
    ([Phase({"web": 1}, until_chunk=2), Phase({"web": 1})], "stop_after_passes"),
])
def test_bad_phases_raise_naming_the_problem(phases, match):
    with pytest.raises(ValueError, match=match):
        PhasedMixtureWorkSource(three_datasets(), phases, chunk_size=8)


def test_phase_arguments_are_checked():
    with pytest.raises(ValueError, match="one bound"):
        Phase({"web": 1}, until_chunk=2, until_sample=4)
    with pytest.raises(ValueError, match="until_chunk"):
        Phase({"web": 1}, until_chunk=0)
    with pytest.raises(TypeError, match="mixture"):
        Phase(["web"])


def test_per_phase_liveness_is_checked_at_construction():
    tiny = [Dataset.from_counts("big", [100]), Dataset.from_counts("tiny", [2])]
    phases = [Phase({"big": 1}, until_chunk=2), Phase({"tiny": 1})]
    with pytest.raises(ValueError, match="phase 1: dataset 'tiny'"):
        PhasedMixtureWorkSource(tiny, phases, chunk_size=16, exhausted_policy="repeat")


@pytest.mark.parametrize("bound", [{"until_chunk": 2**63}, {"until_chunk": 10**12}, {"until_sample": 2**62}])
def test_a_phase_bound_beyond_any_walk_is_refused_at_once(bound):
    with pytest.raises(ValueError, match=f"Phase {next(iter(bound))}=.* lies beyond .*zephon.limits"):
        Phase({"web": 1}, **bound)


@pytest.mark.parametrize("token_mode", [False, True])
def test_a_phase_end_the_stream_does_not_reach_soon_is_an_error_not_a_hang(monkeypatch, token_mode):
    from zephon.core import phases as core_phases

    monkeypatch.setattr(core_phases, "MAX_PHASE_WALK", 5_000)
    monkeypatch.setattr(core_phases, "MAX_TOKEN_PHASE_WALK", 500)
    data = [Dataset.from_records(n, [[{"text": "x" * (k + 1) * size} for k in range(20)] for _ in range(3)])
            for n, size in (("short", 2), ("long", 9))]
    bound = {"until_token": 10**15} if token_mode else {"until_sample": 10**12}
    extra = {"token_estimation": TokenEstimation(primer=0.5)} if token_mode else {}
    source = PhasedMixtureWorkSource(data, [Phase({"short": 1}, **bound), Phase({"short": 1, "long": 1})],
                                     chunk_size=8, stop_after_passes=None, exhausted_policy="repeat", **extra)
    if token_mode:
        source.prime()
    limit = "MAX_TOKEN_PHASE_WALK" if token_mode else "MAX_PHASE_WALK"
    with pytest.raises(ValueError, match=rf"phases\[0\] ends at {next(iter(bound))}=.* within .* chunks.*{limit}"):
        source.clone_for_lane(0, 1).next_chunk()


def test_a_resealed_state_whose_chunk_lies_past_its_phase_is_refused():
    from zephon.core.checkpoint import sealed

    data = three_datasets()
    phases = [Phase({"web": 1}, until_chunk=3), Phase({"web": 1, "math": 2})]
    make = lambda: PhasedMixtureWorkSource(data, phases, chunk_size=8, stop_after_passes=None,  # noqa: E731
                                           exhausted_policy="repeat").clone_for_lane(0, 1)
    lane = make()
    lane.next_chunk()
    state = json.loads(json.dumps(lane.state_dict()))
    assert state["phase"] == 0
    inner = state["inner"]
    forged = sealed({**state, "inner": sealed({**inner, "state": {**inner["state"], "chunk_index": 40}})})
    with pytest.raises(ValueError, match=r"phase 0 at chunk 40, but phase 0 ends at chunk 3; .*corrupted"):
        make().load_state_dict(forged)
    make().load_state_dict(state)  # the real one restores


@given(steps=st.integers(1, 12), back=st.integers(1, 12), replicas=st.integers(1, 3), token_mode=st.booleans())
def test_a_resealed_state_moved_back_is_refused(steps, back, replicas, token_mode):
    from zephon.core.checkpoint import sealed

    data = [Dataset.from_records(n, [[{"text": "x" * (k + 1) * size} for k in range(20)] for _ in range(3)])
            for n, size in (("web", 2), ("math", 9))]
    extra = {"token_estimation": TokenEstimation(primer=0.5)} if token_mode else {}
    template = PhasedMixtureWorkSource(data, [Phase({"web": 1}, until_chunk=3), Phase({"web": 1, "math": 2})],
                                       chunk_size=8, stop_after_passes=None, exhausted_policy="repeat", **extra)
    template.prime()
    lane = template.clone_for_lane(replicas - 1, replicas)
    for _ in range(steps):
        lane.next_chunk()
    state = json.loads(json.dumps(lane.state_dict()))
    inner = state["inner"]
    g = inner["state"]["chunk_index"]
    assume(g - back >= 0 and (not token_mode or g - back < template.phase_starts()[state["phase"]]))
    moved = {**inner["state"], "chunk_index": g - back}
    forged = sealed({**state, "inner": sealed({**inner, "state": moved})})
    with pytest.raises(ValueError, match=r"checkpoint is (in phase \d+ )?at chunk .*corrupted"):
        template.clone_for_lane(replicas - 1, replicas).load_state_dict(forged)
    template.clone_for_lane(replicas - 1, replicas).load_state_dict(state)  # the real one restores


def test_a_phase_that_ends_exactly_at_the_walk_limit_still_resolves(monkeypatch):
    from zephon.core import phases as core_phases

    monkeypatch.setattr(core_phases, "MAX_PHASE_WALK", 4096)
    data = three_datasets()
    source = PhasedMixtureWorkSource(data, [Phase({"web": 1}, until_chunk=4096), Phase({"web": 1, "math": 1})],
                                     chunk_size=8, stop_after_passes=None, exhausted_policy="repeat")
    assert source.phase_starts()[1] == 4096


def test_token_mode_loads_reuse_the_resolved_phase_starts(monkeypatch):
    from zephon.core import phases as core_phases

    data = [Dataset.from_records(n, [[{"text": "x" * (k + 1) * size} for k in range(20)] for _ in range(3)])
            for n, size in (("short", 2), ("long", 9))]
    template = _primed(data, [Phase({"short": 1}, until_token=300), Phase({"short": 1, "long": 1})],
                       TokenEstimation(primer=0.5))
    lane = template.clone_for_lane(0, 1)
    for _ in range(30):
        lane.next_chunk()
    state = lane.state_dict()
    assert state["phase"] == 1
    walks = []
    real = core_phases._resolve_next
    monkeypatch.setattr(core_phases, "_resolve_next", lambda *a: walks.append(1) or real(*a))
    for _ in range(3):
        template.clone_for_lane(0, 1).load_state_dict(state)
    assert walks == []  # resolved once on the template, shared by its clones
