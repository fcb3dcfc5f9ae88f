"""Equal steps on every rank, the default lane count, stats() and events (issue #13; one process).

Ranks are simulated with explicit ``rank`` / ``world_size`` (a fresh start and a global state
know every rank's lanes, so no collective is needed); real processes with an all-reduce after
every batch are in ``test_torch_distributed.py``.
"""
import json
import logging

import pytest
from helpers import lane_streams
from hypothesis import given, settings
from hypothesis import strategies as st

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.work import Phase, PhasedMixtureWorkSource
from zephon.runtime import DatasetStatsDict, EvenBatchesDict, LoaderStatsDict, make_state, rank_lanes, worker_lanes
from zephon.runtime._book import GROWTH, LaneBook, default_replicas

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning",
                                        "ignore:'set_vital' is deprecated:UserWarning")


def make_source(policy="stop", **kwargs):
    datasets = [Dataset.from_counts("web", [60] * 6), Dataset.from_counts("code", [45] * 4),
                Dataset.from_counts("math", [30] * 2)]
    return StaticMixtureWorkSource(datasets, {"web": 0.5, "code": 0.3, "math": 0.2}, chunk_size=16, seed=21,
                                   exhausted_policy=policy, **kwargs)


def ids(batch):
    return list(map(tuple, batch["_sample_id"].tolist()))


def run(world, workers, even=True, batch=5, state=None, stop_after=None, **kwargs):
    """Each simulated rank's batches (all, or the first ``stop_after``), lengths and final states."""
    out = []
    for rank in range(world):
        loader = zt.DataLoader(Pipeline(make_source()), batch_size=batch, num_workers=workers, even_batches=even,
                               rank=rank, world_size=world, **kwargs)
        if state is not None:
            loader.load_state_dict(state)
        length = len(loader)
        batches = []
        for unit in loader:
            batches.append(ids(unit))
            if stop_after is not None and len(batches) == stop_after:
                break
        out.append({"len": length, "batches": batches, "state": json.loads(json.dumps(loader.state_dict())),
                    "stats": loader.stats()})
    return out


def test_ranks_with_lanes_of_different_lengths_take_equal_steps():
    uneven = run(3, 2, even=False, canonical_replicas=7)
    counts = [len(r["batches"]) for r in uneven]
    assert len(set(counts)) > 1, "the lanes must give the ranks different batch counts"
    assert [r["len"] for r in uneven] == counts
    even = run(3, 2, canonical_replicas=7)
    assert [len(r["batches"]) for r in even] == [r["len"] for r in even] == [min(counts)] * 3
    reference = lane_streams(make_source(), 7)
    owner = {p: lane for lane, pointers in reference.items() for p in pointers}
    for r, u in zip(even, uneven):
        assert r["batches"] == u["batches"][:min(counts)]  # the surplus is the tail of each rank's order
        held = r["stats"]["even_batches"]
        assert list(held) == list(EvenBatchesDict.__annotations__)
        assert held["steps"] == held["given"] == min(counts)
        assert held["held_back_batches"] == len(u["batches"]) - min(counts)
        assert held["held_back_samples"] == sum(map(len, u["batches"][min(counts):]))
    # each lane gave a prefix of its stream; the held-back samples stay in the checkpoint
    seen = [p for r in even for b in r["batches"] for p in b]
    assert len(seen) == len(set(seen))
    for lane, pointers in reference.items():
        mine = [p for p in seen if owner[p] == lane]
        assert mine == pointers[:len(mine)]


def test_equal_steps_hold_after_an_elastic_resume_and_the_surplus_is_not_lost():
    first = run(3, 2, canonical_replicas=7, stop_after=4)
    merged = zt.merge_states([r["state"] for r in first])
    second = run(2, 2, state=merged)
    # len() is the epoch's: the 4 batches each rank received before the state, then equal steps
    assert len({r["len"] for r in second}) == 1 and [len(r["batches"]) + 4 for r in second] == [r["len"] for r in second]
    uneven = run(2, 2, even=False, state=merged)
    assert second[0]["len"] == 4 + min(len(r["batches"]) for r in uneven)
    # what the even run held back is read by a resume of its final state on one rank
    final = zt.merge_states([r["state"] for r in second])
    rest = run(1, 1, state=final)
    seen = [p for leg in (first, second, rest) for r in leg for b in r["batches"] for p in b]
    everything = [p for pointers in lane_streams(make_source(), 7).values() for p in pointers]
    assert sorted(seen) == sorted(everything)


def test_more_ranks_than_lanes_with_even_batches_is_an_error_not_a_run_that_stops_at_once():
    first = run(2, 0, canonical_replicas=2, stop_after=1)
    merged = zt.merge_states([r["state"] for r in first])
    with pytest.raises(ValueError, match=r"3 ranks share canonical_replicas=2 lanes.*migrate_checkpoint"):
        run(3, 0, state=merged)
    uneven = run(3, 0, even=False, state=merged)  # the idle rank reads nothing, the others read on
    assert [len(r["batches"]) > 0 for r in uneven] == [True, True, False]


def test_resume_on_the_same_topology_counts_the_remaining_steps_again():
    first = run(3, 2, canonical_replicas=7, stop_after=3)
    merged = zt.merge_states([r["state"] for r in first])
    full = run(3, 2, canonical_replicas=7)
    second = run(3, 2, state=merged)
    assert [r["len"] for r in second] == [full[0]["len"]] * 3  # the epoch's length: 3 received, the rest to come
    assert [r["batches"] for r in second] == [r["batches"][3:] for r in full]


def test_a_per_rank_state_without_a_process_group_is_refused_with_a_fix():
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, canonical_replicas=4, rank=0, world_size=2)
    next(iter(loader))
    fresh = zt.DataLoader(Pipeline(make_source()), batch_size=5, rank=0, world_size=2)
    fresh.load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="global state.*even_batches=False"):
        len(fresh)
    off = zt.DataLoader(Pipeline(make_source()), batch_size=5, rank=0, world_size=2, even_batches=False)
    off.load_state_dict(loader.state_dict())
    assert len(off) == 1 + len(list(off))  # the batch received before the state, and the rest


def test_the_surplus_is_logged_once_and_the_end_of_the_stream_at_info(caplog):
    counts = [len(r["batches"]) for r in run(3, 0, even=False, canonical_replicas=7)]
    longest = counts.index(max(counts))
    with caplog.at_level(logging.INFO, logger="zephon"):
        loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, canonical_replicas=7, rank=longest,
                               world_size=3)
        list(loader)
        list(loader)
    held = [r for r in caplog.records if "holds back" in r.message]
    assert len(held) == 1 and held[0].levelno == logging.WARNING
    assert sum("stream ended" in r.message for r in caplog.records) == 1


def test_unbounded_streams_need_no_evening():
    loader = zt.DataLoader(Pipeline(make_source(policy="repeat")), batch_size=5, rank=0, world_size=2)
    it = iter(loader)
    for _ in range(50):
        next(it)
    assert loader.stats()["even_batches"] is None
    with pytest.raises(TypeError, match="no length"):
        len(loader)


@pytest.mark.parametrize("first_readers", [1, 2, 3, 6])
def test_the_default_lane_count_leaves_no_reader_idle_growing_8x(first_readers):
    replicas = default_replicas(first_readers)
    for readers in range(1, GROWTH * first_readers + 1):
        for world in [w for w in range(1, readers + 1) if readers % w == 0]:
            workers = readers // world
            counts = [len(worker_lanes(rank_lanes(replicas, r, world, m), w, workers, m))
                      for m in ("contiguous", "interleaved") for r in range(world) for w in range(workers)]
            assert min(counts) >= 1 and max(counts) - min(counts) <= 1, (readers, world)


def test_the_loader_default_is_8_lanes_per_first_reader_and_a_checkpoint_keeps_it():
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=2)
    assert loader.canonical_replicas == 16
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    grown = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=2, rank=3, world_size=4)
    grown.load_state_dict(state)
    assert grown.canonical_replicas == 16 and len(grown.lanes()) == 4
    assert zt.DataLoader(Pipeline(make_source()), rank=0, world_size=2).canonical_replicas == 16


def test_stats_count_components_passes_and_redistributed_datasets(caplog):
    datasets = [Dataset.from_counts("big", [200] * 4), Dataset.from_counts("small", [20, 20])]
    source = StaticMixtureWorkSource(datasets, {"big": 0.7, "small": 0.3}, chunk_size=16, seed=2,
                                     exhausted_policy={"big": "repeat", "small": "redistribute"}, max_repeats=1)
    with caplog.at_level(logging.INFO, logger="zephon"):
        loader = zt.DataLoader(Pipeline(source), batch_size=8, num_workers=2)
        batches = list(loader)
    stats = json.loads(json.dumps(loader.stats()))
    assert list(stats) == list(LoaderStatsDict.__annotations__)  # the documented type is what it returns
    assert all(list(entry) == list(DatasetStatsDict.__annotations__) for entry in stats["datasets"].values())
    assert stats["batches"] == len(batches) == len(loader) and loader.remaining() == 0
    names = [n for b in batches for n in b["_component"]]
    assert stats["samples"] == {"big": names.count("big"), "small": names.count("small")}
    assert stats["samples"]["small"] == 40 and stats["redistributed"] == ["small"]
    big = stats["datasets"]["big"]
    assert big["passes_completed"] * 800 + big["position"] == names.count("big") and big["pass_length"] == 800
    assert stats["datasets"]["small"] == {"passes_completed": 1, "position": 0, "pass_length": 40, "unread_in_pass": 0,
                                          "never_read": 0, "policy": "redistribute"}
    assert stats["ended"] and stats["exhausted"] == ["big"]
    messages = [r.message for r in caplog.records if r.levelno == logging.INFO]
    assert sum("'big' starts pass 2" in m for m in messages) == 1
    assert sum("'small' is exhausted" in m for m in messages) == 1
    assert sum("stream ended" in m and "big" in m for m in messages) == 1


def test_a_phased_sources_passes_and_redistributed_datasets_are_said(caplog):
    datasets = [Dataset.from_counts("big", [200] * 4), Dataset.from_counts("small", [20, 20])]
    source = PhasedMixtureWorkSource(datasets, [Phase({"big": 0.9, "small": 0.1}, until_chunk=2),
                                                Phase({"big": 0.7, "small": 0.3})], chunk_size=16, seed=2,
                                     exhausted_policy={"big": "repeat", "small": "redistribute"}, max_repeats=1)
    with caplog.at_level(logging.INFO, logger="zephon"):
        loader = zt.DataLoader(Pipeline(source), batch_size=8, num_workers=0)
        names = [n for batch in loader for n in batch["_component"]]
    assert names.count("small") == 40 and names.count("big") > 800
    assert loader.stats()["redistributed"] == ["small"]
    messages = [r.message for r in caplog.records if r.levelno == logging.INFO]
    assert sum("'big' starts pass 2" in m for m in messages) == 1
    assert sum("'small' is exhausted" in m for m in messages) == 1


def test_the_resolved_configuration_is_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="zephon"):
        next(iter(zt.DataLoader(Pipeline(make_source()), batch_size=5)))
    found = [r.message for r in caplog.records if "resolved configuration" in r.message]
    assert len(found) == 1 and '"canonical_replicas": 8' in found[0] and '"policy": "stop"' in found[0]


def test_a_finite_source_that_cannot_count_is_said_once(caplog):
    source = make_source()
    source.supports_indexing = lambda: False  # as a custom source without random access
    with caplog.at_level(logging.WARNING, logger="zephon"):
        loader = zt.DataLoader(Pipeline(source), batch_size=5, canonical_replicas=7, rank=0, world_size=3)
        assert list(loader) and loader.stats()["even_batches"] is None
    assert sum("cannot count its remaining samples" in r.message for r in caplog.records) == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(12, 70), min_size=3, max_size=3), st.integers(1, 12), st.integers(0, 50),
       st.sampled_from([None, 1, 4]), st.lists(st.sampled_from(["repeat", "redistribute"]), min_size=3, max_size=3))
def test_stats_name_every_redistributed_dataset_the_run_drained(rows, chunk_size, seed, batch_size, policies):
    """A bundle holds chunk starts of several lanes; the furthest of them says what was drained."""
    names = ["big", "small", "mid"]
    datasets = [Dataset.from_counts(name, [n]) for name, n in zip(names, rows)]
    source = StaticMixtureWorkSource(datasets, dict(zip(names, (0.6, 0.2, 0.2))), chunk_size=chunk_size, seed=seed,
                                     exhausted_policy=dict(zip(names, policies)), max_repeats=1)
    loader = zt.DataLoader(Pipeline(source), batch_size=batch_size, num_workers=0)
    for _ in loader:
        pass
    stats = loader.stats()
    drained = {name for name, entry in stats["datasets"].items()
               if entry["policy"] == "redistribute" and entry["passes_completed"] >= 1}
    assert set(stats["redistributed"]) == drained


def test_a_new_pass_is_said_while_the_loader_runs(caplog):
    """The stats look at the readers' chunk starts every few bundles, not only when read."""
    datasets = [Dataset.from_counts("small", [5000]), Dataset.from_counts("big", [10 ** 7])]
    source = StaticMixtureWorkSource(datasets, {"small": 0.5, "big": 0.5}, chunk_size=4096, seed=1,
                                     exhausted_policy="repeat")
    loader = zt.DataLoader(Pipeline(source), batch_size=256, num_workers=0, canonical_replicas=1)
    it = iter(loader)
    with caplog.at_level(logging.INFO, logger="zephon"):
        for _ in range(2048):  # 512 Ki samples: several looks
            next(it)
    assert any("'small' starts pass 2" in r.message for r in caplog.records)


@pytest.mark.parametrize("kind", ["static", "phased"])
def test_another_ranks_lanes_are_checked_before_they_are_counted(kind):
    """Loading checks the lanes the rank reads; counting equal steps restores every rank's lanes
    (without a re-check), so a global state whose other lanes were written by another source is
    refused when it counts them, naming the lane, and nothing has changed."""
    def source(seed):
        if kind == "static":
            return StaticMixtureWorkSource([Dataset.from_counts("web", [60] * 6), Dataset.from_counts("code", [45] * 4)],
                                           {"web": 0.6, "code": 0.4}, chunk_size=16, seed=seed)
        datasets = [Dataset.from_counts("big", [200] * 4), Dataset.from_counts("small", [20, 20])]
        return PhasedMixtureWorkSource(datasets, [Phase({"big": 0.9, "small": 0.1}, until_chunk=2),
                                                  Phase({"big": 0.7, "small": 0.3})], chunk_size=16, seed=seed,
                                       exhausted_policy={"big": "repeat", "small": "redistribute"}, max_repeats=1)
    ours, theirs, replicas = source(2), source(5), 4
    entries = {}
    for lane in range(replicas):  # rank 0 reads lanes 0 and 1, rank 1 lanes 2 and 3
        clone = (ours if lane < 2 else theirs).clone_for_lane(lane, replicas)
        clone.next_chunk()
        entries[lane] = (clone.state_dict(), 3, 0)
    datasets = zt.DataLoader(Pipeline(ours), batch_size=8, canonical_replicas=replicas).state_dict()["datasets"]
    state = make_state(replicas, entries, datasets, {"world_size": 2, "ranks": [0, 1], "mapping": "contiguous",
                                                    "num_workers": 0})
    loader = zt.DataLoader(Pipeline(ours), batch_size=8, canonical_replicas=replicas, rank=0, world_size=2)
    loader.load_state_dict(state)  # rank 0's lanes (0 and 1) restore here
    before = loader.state_dict()
    with pytest.raises(ValueError, match="lane 2 of the checkpoint does not restore into this pipeline's source"):
        iter(loader)
    assert loader.state_dict() == before


def test_a_book_without_a_lanes_position_says_so():
    """A state of one rank's lanes holds no position for the other ranks' lanes: asking the book
    for them is refused by name (the loader asks only once every lane is known)."""
    source, replicas = StaticMixtureWorkSource([Dataset.from_counts("web", [60] * 6)], {"web": 1.0}, chunk_size=16), 4
    entries = {lane: (source.clone_for_lane(lane, replicas).state_dict(), 0, 0) for lane in (0, 1)}
    datasets = zt.DataLoader(Pipeline(source), batch_size=8, canonical_replicas=replicas).state_dict()["datasets"]
    state = make_state(replicas, entries, datasets, {"world_size": 2, "ranks": [0], "mapping": "contiguous",
                                                    "num_workers": 0})
    book = LaneBook(Pipeline(source), canonical_replicas=replicas, mapping="contiguous", rank=0, world_size=2)
    book.load(state)
    assert not book.known(range(replicas)) and sorted(book.entries()) == [0, 1]
    with pytest.raises(RuntimeError, match=r"no position for lanes \[2, 3\]"):
        book.entries([1, 2, 3])
