"""pass_tail (SPEC §4): "carry" reads every pass the stream moves past completely, exactly once,
and ends by what was read; "drop" skips the tail (zephon 0.2.0); both have the same quotas on
every chunk both produce. The stopping rules themselves: test_stopping_rules.py."""
import json

import numpy as np
import pytest
from helpers import three_datasets
from hypothesis import example, given
from hypothesis import strategies as st
from test_tokens import pinned_source

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.checkpoint import sealed
from zephon.core.cursor import pointer_reference, take
from zephon.core.schedule import initial_state, plan_next, plan_next_reference
from zephon.testing import assert_replay_equivalent, collect, source_configs

MIX = {"web": 5, "code": 3, "math": 2}


def with_tails(kwargs, data):
    """``kwargs`` with a pass_tail: one value, or a per-dataset mapping (some omitted)."""
    names = [d.name for d in kwargs["datasets"]]
    tails = st.sampled_from(["carry", "drop"])
    value = data.draw(tails | st.dictionaries(st.sampled_from(names), tails))
    return dict(kwargs, pass_tail=value)


def merged_stream(kwargs, replicas):
    """Every lane's chunks merged in global chunk order (the lanes together), and a single lane
    that has read the whole stream."""
    merged = {}
    for lane_id in range(replicas):
        lane = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane_id, replicas)
        while (chunk := lane.next_chunk()) is not None:
            merged[lane.state.chunk_index - 1] = chunk
    whole = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1)
    collect(whole, 10**6)
    return [merged[g] for g in sorted(merged)], whole


@given(source_configs(), st.integers(1, 3), st.data())
def test_carry_reads_the_passes_back_to_back_with_the_quotas_of_drop(kwargs, replicas, data):
    kwargs = with_tails(kwargs, data)
    chunks, lane = merged_stream(kwargs, replicas)
    dropped, _ = merged_stream(dict(kwargs, pass_tail="drop"), replicas)
    both = min(len(chunks), len(dropped))
    assert len(chunks) >= len(dropped)  # "carry" ends by what was read: never before "drop"
    assert [c.counts for c in chunks[:both]] == [c.counts for c in dropped[:both]]
    assert [c.target_mixture for c in chunks[:both]] == [c.target_mixture for c in dropped[:both]]
    config, coverage = lane.config, lane.coverage()
    for c, d in enumerate(config.datasets):
        drawn = np.concatenate([chunk.components[d.name] for chunk in chunks if d.name in chunk.components]
                               or [np.zeros((0, 3), np.int64)])
        seen = coverage[d.name]
        if d.pass_tail == "carry":
            # the dataset's stream is its passes back to back: the twin says which sample is where
            assert [tuple(p) for p in drawn.tolist()] == [pointer_reference(config, c, 0, k) for k in range(len(drawn))]
            assert seen["never_read"] == 0
        assert seen["pass_length"] == d.total
        assert seen["passes_completed"] * d.total + seen["position"] - seen["never_read"] == len(drawn)


@given(source_configs(), st.integers(1, 4), st.data())
def test_kernel_matches_reference_under_either_tail(kwargs, replicas, data):
    kwargs = with_tails(kwargs, data)
    lane = data.draw(st.integers(0, replicas - 1))
    config = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas).config
    state = initial_state(config)
    for _ in range(200):
        planned = plan_next(state, config)
        assert planned == plan_next_reference(state, config)
        if not hasattr(planned, "state"):
            break
        state = planned.state


@given(source_configs(), st.integers(1, 3), st.lists(st.integers(0, 40), min_size=1, max_size=3), st.data())
def test_replay_and_random_access_under_either_tail(kwargs, replicas, cuts, data):
    kwargs = with_tails(kwargs, data)
    lane_id = data.draw(st.integers(0, replicas - 1))
    assert_replay_equivalent(lambda: StaticMixtureWorkSource(**kwargs).clone_for_lane(lane_id, replicas), cuts,
                             max_chunks=200)
    lane = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane_id, replicas)
    expected = [p for chunk in collect(StaticMixtureWorkSource(**kwargs).clone_for_lane(lane_id, replicas), 10**6)
                for p, _ in chunk]
    assert len(lane) == len(expected)
    assert list(map(tuple, lane.sample_ids_at(np.arange(len(lane))).tolist())) == expected
    for cut in cuts:
        restored = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane_id, replicas)
        read = sum(len(c) for c in collect(restored, cut))
        assert restored.remaining_samples() == len(expected) - read


def said_to_be_the_same():
    """What the ``pass_tail`` docstring says "carry" and "drop" share (its sentences saying "same")."""
    doc = " ".join(StaticMixtureWorkSource.__doc__.split())
    section = doc[doc.index("pass_tail :"):]
    return " ".join(sentence for sentence in section.split(". ") if "same" in sentence)


@given(source_configs(), st.data())
@example({"datasets": [Dataset.from_counts("big", [10]), Dataset.from_counts("small", [7])],
          "mixture": {"big": 0.5, "small": 0.5}, "chunk_size": 4, "exhausted_policy": "repeat", "max_repeats": 1},
         None)
def test_the_pass_tail_docstring_calls_the_same_only_what_is(kwargs, data):
    if data is not None:
        kwargs = with_tails(kwargs, data)
    carry = collect(StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1), 10**6)
    drop = collect(StaticMixtureWorkSource(**dict(kwargs, pass_tail="drop")).clone_for_lane(0, 1), 10**6)
    both = min(len(carry), len(drop))
    differ = {"quotas": [c.counts for c in carry[:both]] != [c.counts for c in drop[:both]],
              "target_mixture": [c.target_mixture for c in carry[:both]] != [c.target_mixture for c in drop[:both]],
              "number of chunks": len(carry) != len(drop), "end of the stream": len(carry) != len(drop),
              "source_exhausted": [c.source_exhausted for c in carry] != [c.source_exhausted for c in drop]}
    claimed = said_to_be_the_same()
    assert not [what for what, differs in differ.items() if differs and what in claimed], claimed


@given(st.integers(1, 40), st.integers(0, 3), st.data())
def test_take_across_a_pass_boundary_matches_the_twin(count, epoch, data):
    kwargs = dict(datasets=three_datasets(), mixture=MIX, chunk_size=10, seed=3, shuffle_within_shard=True,
                  shuffle_block_size=data.draw(st.sampled_from([None, 7, "global"])), stop_after_passes=2)
    config = StaticMixtureWorkSource(**kwargs).config
    c = data.draw(st.integers(0, 2))
    total = config.datasets[c].total
    position = data.draw(st.integers(max(0, total - count), total))
    out = np.empty((count, 3), dtype=np.int64)
    take(out, 0, config, c, epoch, position, count)
    assert [tuple(p) for p in out.tolist()] == [pointer_reference(config, c, epoch, position + k) for k in range(count)]


def one_dataset(pass_tail, **overrides):
    kwargs = dict(datasets=[Dataset.from_counts("a", [40, 35, 25])], mixture={"a": 1}, chunk_size=30,
                  stop_after_passes=3, pass_tail=pass_tail)
    return StaticMixtureWorkSource(**dict(kwargs, **overrides)).clone_for_lane(0, 1)


def test_three_passes_of_one_dataset():
    carry, drop = one_dataset("carry"), one_dataset("drop")
    carried, dropped = collect(carry), collect(drop)
    assert [len(c) for c in carried] == [30] * 10  # three passes of 100 read: 300 samples
    assert [len(c) for c in dropped] == [30] * 9  # three chunks a pass, the tail of 10 skipped
    assert carry.coverage() == {"a": {"passes_completed": 3, "position": 0, "pass_length": 100, "unread_in_pass": 0,
                                      "never_read": 0}}
    assert drop.coverage() == {"a": {"passes_completed": 2, "position": 90, "pass_length": 100, "unread_in_pass": 10,
                                     "never_read": 20}}
    ids = [tuple(p) for c in carried for p in c.components["a"].tolist()]
    assert len(set(ids[:100])) == len(set(ids[100:200])) == len(set(ids[200:])) == 100


def test_a_drop_chunk_at_the_boundary_skips_what_carry_reads():
    carry, drop = collect(one_dataset("carry"), 4), collect(one_dataset("drop"), 4)
    assert [c.components["a"].tolist() for c in carry[:3]] == [c.components["a"].tolist() for c in drop[:3]]
    first_pass = {tuple(p) for c in carry[:3] for p in c.components["a"].tolist()}
    assert len(first_pass) == 90
    boundary = [tuple(p) for p in carry[3].components["a"].tolist()]
    assert set(boundary[:10]).isdisjoint(first_pass) and len(first_pass | set(boundary[:10])) == 100


def test_reshuffle_off_repeats_pass_zero_under_carry():
    source = one_dataset("carry", shuffle_within_shard=True, reshuffle_on_repeat=False)
    ids = [tuple(p) for c in collect(source) for p in c.components["a"].tolist()]
    assert ids[:100] == ids[100:200] == ids[200:]


def test_a_per_dataset_mapping_and_bad_values():
    source = StaticMixtureWorkSource(three_datasets(), MIX, chunk_size=10, pass_tail={"math": "drop"})
    assert [d.pass_tail for d in source.config.datasets] == ["carry", "carry", "drop"]
    with pytest.raises(ValueError, match=r"pass_tail\['web'\].*'keep'"):
        StaticMixtureWorkSource(three_datasets(), MIX, chunk_size=10, pass_tail={"web": "keep"})
    with pytest.raises(ValueError, match="unknown datasets"):
        StaticMixtureWorkSource(three_datasets(), MIX, chunk_size=10, pass_tail={"nope": "drop"})
    with pytest.warns(RuntimeWarning, match="pass_tail='drop' has no effect on 'web': it never repeats"):
        StaticMixtureWorkSource(three_datasets(), MIX, chunk_size=10, exhausted_policy="stop", pass_tail="drop")


def test_checkpoints_hold_read_coordinates_and_refuse_other_versions_and_modes():
    lane = one_dataset("carry")
    collect(lane, 4)
    state = json.loads(json.dumps(lane.state_dict()))
    assert state["version"] == 5 and state["state"]["cursors"]["a"] == {"epoch": 1, "position": 20, "tails": 0}
    with pytest.raises(ValueError, match="pass_tail"):
        one_dataset("drop").load_state_dict(state)
    for bad in (-1, 1, 2.0, True):  # "carry" skips nothing
        broken = json.loads(json.dumps(state))
        broken["state"]["cursors"]["a"]["tails"] = bad
        with pytest.raises(ValueError, match="tails"):
            one_dataset("carry").load_state_dict(sealed(broken))  # sealed: past the digest, to the bound
    drop = one_dataset("drop")
    collect(drop, 4)
    state = json.loads(json.dumps(drop.state_dict()))
    assert state["state"]["cursors"]["a"] == {"epoch": 1, "position": 30, "tails": 10}
    for bad in (-1, 100):  # a "drop" pass start skips at most 99
        broken = json.loads(json.dumps(state))
        broken["state"]["cursors"]["a"]["tails"] = bad
        with pytest.raises(ValueError, match="tails"):
            one_dataset("drop").load_state_dict(sealed(broken))
    for version in (2, 3, 4):
        with pytest.raises(ValueError, match=f"version {version}"):
            one_dataset("carry").load_state_dict(sealed(dict(state, version=version)))


@pytest.mark.parametrize("policies", [{}, {"exhausted_policy": {"a": "repeat", "b": "redistribute", "c": "repeat"},
                                           "max_repeats": {"a": 2, "c": 3}, "stop_after_passes": None}])
def test_token_mode_carries_tails_priced_by_what_is_drawn(policies):
    carry = collect(pinned_source(**policies, pass_tail="carry").clone_for_lane(0, 1))
    lane = pinned_source(**policies, pass_tail="carry").clone_for_lane(0, 1)
    assert len(lane) == sum(len(c) for c in carry)
    for c, d in enumerate(lane.config.datasets):
        drawn = [tuple(p) for chunk in carry if d.name in chunk.components for p in chunk.components[d.name].tolist()]
        assert drawn == [pointer_reference(lane.config, c, 0, k) for k in range(len(drawn))]
    assert_replay_equivalent(lambda: pinned_source(**policies).clone_for_lane(0, 2), [0, 5, 17], max_chunks=80)


def test_the_torch_loader_reads_every_completed_pass_once_across_ranks():
    import zephon.torch as zt
    from zephon import Pipeline

    data = [Dataset.from_counts("web", [60] * 6), Dataset.from_counts("code", [45] * 4),
            Dataset.from_counts("math", [30] * 2)]
    kwargs = dict(datasets=data, mixture={"web": 0.5, "code": 0.3, "math": 0.2}, chunk_size=16, seed=3,
                  stop_after_passes=3)
    seen = []
    for rank in range(2):
        loader = zt.DataLoader(Pipeline(StaticMixtureWorkSource(**kwargs)), batch_size=5, num_workers=2,
                               canonical_replicas=4, rank=rank, world_size=2, even_batches=False)
        seen += [tuple(p) for batch in loader for p in batch["_sample_id"].tolist()]
    whole = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1)
    collect(whole, 10**6)
    for c, d in enumerate(whole.config.datasets):
        covered = whole.coverage()[d.name]
        times = [seen.count((c, int(s), o)) for s, n in zip(d.shard_ids, d.shard_counts) for o in range(n)]
        passes = covered["passes_completed"]
        assert covered["never_read"] == 0 and set(times) <= {passes, passes + 1}
        assert times.count(passes + 1) == covered["position"]
