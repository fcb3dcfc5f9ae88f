"""The seed's stopping rules (SPEC §4), checked on the sample stream itself.

Under ``pass_tail="carry"`` a dataset's stream is its passes back to back: pass k is rows
[kT, (k+1)T) of its concatenated pointers, every row once. ``stop_after_passes=N`` ends at the
first chunk boundary where every dataset has read N complete passes; ``max_repeats=M`` and
``"stop"`` end when some dataset cannot supply its next quota within what it may read.
"""
import dataclasses
import logging
import warnings

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from test_tokens import pinned_source

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.schedule import Ended, active_weights
from zephon.core.step import walk_to_end
from zephon.testing import collect, phased_source_configs, source_configs
from zephon.work import PhasedMixtureWorkSource


def carried(**kwargs):
    """A single lane of the source, constructed with every warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1)


def reads_per_chunk(chunks, names):
    """``(k, n)`` samples each chunk read of each dataset."""
    return np.array([[chunk.counts.get(name, 0) for name in names] for chunk in chunks],
                    dtype=np.int64).reshape(len(chunks), len(names))


def assert_passes_are_whole(chunks, config):
    for c, d in enumerate(config.datasets):
        drawn = [tuple(p) for chunk in chunks if d.name in chunk.components for p in chunk.components[d.name].tolist()]
        every_row = sorted((c, int(s), o) for s, n in zip(d.shard_ids, d.shard_counts) for o in range(n))
        for start in range(0, len(drawn), max(d.total, 1)):
            one_pass = drawn[start:start + d.total]
            assert len(set(one_pass)) == len(one_pass), f"{d.name}: a row twice in pass {start // d.total}"
            if len(one_pass) == d.total:
                assert sorted(one_pass) == every_row


def allowed(plan):
    """How many samples a dataset may read in all: its pass, its capped passes, or unbounded."""
    if plan.policy != "repeat":
        return plan.total
    return None if plan.max_repeats is None else (plan.max_repeats + 1) * plan.total


def assert_ends_where_its_rule_holds(lane, chunks):
    config = lane.config
    reads = reads_per_chunk(chunks, config.names)
    before = np.vstack([np.zeros((1, len(config.names)), np.int64), np.cumsum(reads, axis=0)])
    totals = np.array([d.total for d in config.datasets])
    limits = [allowed(d) for d in config.datasets]
    for k in range(len(chunks) + 1):  # no chunk reads past what a dataset may read
        assert all(limit is None or before[k, c] <= limit for c, limit in enumerate(limits))
    if config.stop_after_passes is not None:
        done = [bool(np.all(row >= config.stop_after_passes * totals)) for row in before]
        assert done.index(True) == len(chunks), "the stream ends at the first chunk where every dataset is done"
        return
    weights = active_weights(config, lane.state.cursors)
    if not any(weights):
        return  # every dataset left redistributes and is drained
    quotas, _ = config.allocator.allocate(lane.state.alloc, weights, config.chunk_size)
    short = [c for c, (d, limit) in enumerate(zip(config.datasets, limits))
             if d.policy != "redistribute" and limit is not None and before[-1, c] + quotas[c] > limit]
    assert short, "the stream ended while every dataset could supply its next quota"


def assert_coverage_counts_the_stream(lane, chunks):
    reads = reads_per_chunk(chunks, lane.config.names).sum(axis=0)
    for d, read in zip(lane.config.datasets, reads.tolist()):
        passes, position = divmod(read, d.total) if d.total else (0, 0)
        assert lane.coverage()[d.name] == {"passes_completed": passes, "position": position, "pass_length": d.total,
                                           "unread_in_pass": d.total - position if position else 0,
                                           "never_read": 0}


def lanes_together(kwargs, replicas):
    """Every lane's chunks merged by global index; the lanes' last global chunks."""
    merged, last = {}, []
    for lane_id in range(replicas):
        lane = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane_id, replicas)
        while (chunk := lane.next_chunk()) is not None:
            merged[lane.state.chunk_index - 1] = chunk
        last.append(lane.coverage())
    return [merged[g] for g in sorted(merged)], last


@given(source_configs(pass_tails=st.just("carry")), st.integers(1, 4))
def test_every_rule_holds_on_the_stream_and_ends_it_at_the_first_chunk_where_it_holds(kwargs, replicas):
    lane = carried(**kwargs)
    chunks = collect(lane, 10**6)
    assert lane.next_chunk() is None
    assert_passes_are_whole(chunks, lane.config)
    assert_ends_where_its_rule_holds(lane, chunks)
    assert_coverage_counts_the_stream(lane, chunks)
    dropped = collect(StaticMixtureWorkSource(**dict(kwargs, pass_tail="drop")).clone_for_lane(0, 1), 10**6)
    both = min(len(chunks), len(dropped))
    assert [c.counts for c in chunks[:both]] == [c.counts for c in dropped[:both]], "carry's quotas are drop's"
    assert len(chunks) >= len(dropped)
    merged, ends = lanes_together(kwargs, replicas)
    assert [c.state_dict() for c in merged] == [c.state_dict() for c in chunks]
    assert all(end == lane.coverage() for end in ends), "the lanes end together, reporting the whole stream"


@given(st.one_of(source_configs().map(lambda kwargs: (StaticMixtureWorkSource, kwargs)),
                 phased_source_configs().map(lambda kwargs: (PhasedMixtureWorkSource, kwargs))),
       st.integers(1, 6), st.data())
def test_lanes_of_one_template_end_where_each_lanes_own_walk_ends(made, replicas, data):
    """The lanes of one template keep the walks to the stream's end they share (a lane's walk
    stops at a state another lane's walk passed): ending in any order, each reports the end
    and the ending dataset that a lane of a template of its own finds."""
    kind, kwargs = made
    template = kind(**kwargs)
    lanes = [template.clone_for_lane(lane, replicas) for lane in range(replicas)]
    for lane in data.draw(st.permutations(range(replicas))):
        collect(lanes[lane], 10**6)
    for lane, source in enumerate(lanes):
        alone = kind(**kwargs).clone_for_lane(lane, replicas)
        collect(alone, 10**6)  # the first walk of its template's lanes: nothing remembered
        restored = kind(**kwargs).clone_for_lane(lane, replicas)
        restored.load_state_dict(source.state_dict())
        assert source.coverage() == alone.coverage() and source.ended_by() == restored.ended_by()


def ends_by_its_own_rule(plan):
    """Whether a dataset's own rule can end a stream: "stop", or a capped repeat."""
    return plan.policy == "stop" or (plan.policy == "repeat" and plan.max_repeats is not None)


@given(source_configs(), st.integers(1, 4), st.data())
@example({"datasets": [Dataset.from_counts("big", [10]), Dataset.from_counts("small", [7])],
          "mixture": {"big": 0.5, "small": 0.5}, "chunk_size": 4, "stop_after_passes": 1,
          "pass_tail": "drop"}, 1, None)
def test_ended_by_names_a_dataset_only_where_its_own_rule_ends_the_stream(kwargs, replicas, data):
    """Under either pass tail, a stream that ends because every dataset has done its
    ``stop_after_passes`` names none (in ``ended_by()``, the end's log line and the loader's
    ``exhausted``); a named dataset is a "stop" or capped one."""
    lane_id = 0 if data is None else data.draw(st.integers(0, replicas - 1))
    lane = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane_id, replicas)
    collect(lane, 10**6)
    plans = {d.name: d for d in lane.config.datasets}
    if lane.config.stop_after_passes is not None:
        assert lane.ended_by() is None
    else:
        assert lane.ended_by() is None or ends_by_its_own_rule(plans[lane.ended_by()])


@given(st.integers(0, 2**32), st.integers(1, 64), st.integers(1, 2), st.sampled_from(["carry", "drop"]))
@example(0, 50, 1, "drop")
def test_a_token_stream_that_ends_with_every_dataset_done_names_none(seed, chunk_size, passes, tail):
    lane = pinned_source(seed=seed, chunk_size=chunk_size, stop_after_passes=passes, pass_tail=tail)
    lane = lane.clone_for_lane(0, 1)
    collect(lane, 10**6)
    assert lane.next_chunk() is None and lane.ended_by() is None


def chunks_and_states(lane):
    """A lane's chunks and its state after each (a lane of one: every chunk is a global one)."""
    chunks, states = [], []
    while (chunk := lane.next_chunk()) is not None:
        chunks.append(chunk)
        states.append(lane.state.inner if isinstance(lane, PhasedMixtureWorkSource) else lane.state)
    return chunks, states


def assert_source_exhausted_follows_the_rules(lane):
    """``source_exhausted`` (SPEC §4), chunk by chunk of a whole stream: cumulative; a "stop" or
    "redistribute" dataset once drained; a capped repeating one only in its last allowed pass,
    and then either drained there or on the stream's last chunk; and the capped dataset that
    ends the stream is on its last chunk."""
    chunks, states = chunks_and_states(lane)
    datasets = lane.config.datasets
    for k, (chunk, state) in enumerate(zip(chunks, states)):
        listed = set(chunk.source_exhausted)
        assert k == 0 or set(chunks[k - 1].source_exhausted) <= listed, "source_exhausted is cumulative"
        for d, cursor in zip(datasets, state.cursors):
            drained = cursor.position >= d.total
            if d.policy != "repeat":
                assert (d.name in listed) == drained
            elif d.max_repeats is None:
                assert d.name not in listed
            elif d.name in listed:
                assert cursor.epoch >= d.max_repeats, "listed before its last allowed pass"
                assert drained or k == len(chunks) - 1, "listed, but it supplied the next chunk's quota"
    by = lane.ended_by()
    if chunks and by is not None and lane.config.datasets[lane.config.names.index(by)].policy == "repeat":
        assert by in chunks[-1].source_exhausted, f"{by!r} ends the stream by its cap, the last chunk does not say so"


@given(st.one_of(source_configs().map(lambda kwargs: (StaticMixtureWorkSource, kwargs)),
                 phased_source_configs().map(lambda kwargs: (PhasedMixtureWorkSource, kwargs))))
@example((StaticMixtureWorkSource, {
    "datasets": [Dataset.from_counts("big", [1_000] * 4), Dataset.from_counts("small", [97] * 3)],
    "mixture": {"big": 0.7, "small": 0.3}, "chunk_size": 100, "exhausted_policy": "repeat", "max_repeats": 2}))
def test_source_exhausted_lists_a_capped_dataset_that_cannot_supply_its_next_quota(made):
    kind, kwargs = made
    assert_source_exhausted_follows_the_rules(kind(**kwargs).clone_for_lane(0, 1))


@given(st.integers(0, 2**32), st.integers(1, 64), st.integers(0, 2), st.sampled_from(["carry", "drop"]))
def test_token_streams_list_the_capped_dataset_that_ends_them(seed, chunk_size, cap, tail):
    source = pinned_source(seed=seed, chunk_size=chunk_size, stop_after_passes=None, exhausted_policy="repeat",
                           max_repeats={"a": 9, "b": cap, "c": 9}, pass_tail=tail)
    assert_source_exhausted_follows_the_rules(source.clone_for_lane(0, 1))


@dataclasses.dataclass(frozen=True)
class _At:
    chunk_index: int
    stream: str


def test_a_walk_to_the_end_takes_a_remembered_end_only_from_an_equal_state():
    """Two streams pass chunks 2 and 3 in different states; the later walk's states are kept
    there. A walk of the first stream from chunk 3 walks on until a state it knows (chunk 4)."""
    ends = {"a": 5, "b": 3}
    calls = []

    def following(state):
        calls.append(state)
        if state.chunk_index == ends[state.stream]:
            return Ended(state.chunk_index, 0 if state.stream == "a" else 1)
        return _At(state.chunk_index + 1, state.stream)

    known = {}
    assert walk_to_end(_At(2, "a"), following, known, keep=8) == (_At(5, "a"), 0)
    assert walk_to_end(_At(1, "b"), following, known, keep=8) == (_At(3, "b"), 1)
    assert [known[k][0].stream for k in sorted(known)] == ["b", "b", "b", "a", "a"]
    calls.clear()
    assert walk_to_end(_At(3, "a"), following, known, keep=8) == (_At(5, "a"), 0)
    assert calls == [_At(3, "a")]
    assert walk_to_end(_At(2, "b"), following, known, keep=8) == (_At(3, "b"), 1) and len(calls) == 1
    kept = {}
    assert walk_to_end(_At(0, "a"), following, kept, keep=2) == (_At(5, "a"), 0) and sorted(kept) == [4, 5]


def run(datasets, mixture, **settings):
    lane = carried(datasets=datasets, mixture=mixture, **settings)
    return lane, collect(lane, 10**6)


def test_the_seeds_first_row_nothing_supplied_reads_every_dataset_once():
    lane, chunks = run([Dataset.from_counts("big", [1000] * 4), Dataset.from_counts("small", [97] * 3)],
                       {"big": 0.7, "small": 0.3}, chunk_size=100)
    assert lane.coverage()["big"]["passes_completed"] == 1 and lane.coverage()["small"]["passes_completed"] >= 1
    assert sum(c.counts["big"] for c in chunks[:-1]) < 4000 <= sum(c.counts["big"] for c in chunks)


def test_stop_after_passes_three_reads_three_passes_of_each():
    lane, _ = run([Dataset.from_counts("web", [3997]), Dataset.from_counts("wiki", [357]),
                   Dataset.from_counts("code", [801])], {"web": 0.6, "wiki": 0.1, "code": 0.3},
                  chunk_size=64, stop_after_passes=3)
    assert {name: c["passes_completed"] >= 3 for name, c in lane.coverage().items()} == dict.fromkeys(
        ["web", "wiki", "code"], True)
    assert lane.coverage()["web"]["passes_completed"] == 3


def test_max_repeats_reads_its_last_pass_up_to_its_last_quota():
    lane, chunks = run([Dataset.from_counts("web", [3997]), Dataset.from_counts("wiki", [357])],
                       {"web": 0.5, "wiki": 0.5}, chunk_size=64, exhausted_policy="repeat", max_repeats=2)
    read = sum(c.counts["wiki"] for c in chunks)
    assert read <= 3 * 357 < read + 32  # a third pass, read until its next quota of 32 no longer fits
    assert lane.coverage()["wiki"] == {"passes_completed": 2, "position": read - 714, "pass_length": 357,
                                       "unread_in_pass": 3 * 357 - read, "never_read": 0}


def test_the_end_logs_what_it_left_unread_once_per_lane(caplog):
    kwargs = dict(datasets=[Dataset.from_counts("web", [3997]), Dataset.from_counts("wiki", [357])],
                  mixture={"web": 0.5, "wiki": 0.5}, chunk_size=64, stop_after_passes=2)
    with caplog.at_level(logging.INFO, logger="zephon"):
        for lane_id in range(3):
            lane = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane_id, 3)
            collect(lane, 10**6)
            assert lane.next_chunk() is None and lane.next_chunk() is None
    ends = [r.getMessage() for r in caplog.records if "ended its stream" in r.getMessage()]
    assert len(ends) == 3 and len({e.split("ended its stream")[1] for e in ends}) == 1
    covered = lane.coverage()["web"]
    assert (f"'web': 2 passes completed, {covered['unread_in_pass']:,} of 3,997 samples of pass 2 unread "
            "(stop_after_passes=2)") in ends[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_progress_counts_what_the_loop_received_mid_run(num_workers):
    import zephon.torch as zt
    from zephon import Pipeline

    source = StaticMixtureWorkSource([Dataset.from_counts("web", [500] * 2), Dataset.from_counts("wiki", [97] * 3)],
                                     {"web": 0.7, "wiki": 0.3}, chunk_size=64, seed=1, stop_after_passes=2)
    loader = zt.DataLoader(Pipeline(source), batch_size=8, num_workers=num_workers)
    batches = iter(loader)
    received = [name for _ in range(150) for name in next(batches)["_component"]]
    for name, figures in loader.stats()["datasets"].items():
        assert figures["passes_completed"] * figures["pass_length"] + figures["position"] == received.count(name)
    assert loader.stats()["datasets"]["wiki"]["passes_completed"] >= 1  # 1,200 samples: wiki is in its second pass
