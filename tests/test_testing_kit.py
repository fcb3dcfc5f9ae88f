"""The zephon.testing kit itself: failure messages, digests, strategies' arguments, the pytest plugin."""
import functools
import re
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.testing import (assert_elastic_resume_equivalent, assert_mixture_prefix_bound, assert_passes_complete,
                            assert_replay_equivalent, assert_same_stream_in_fresh_process, loader_topologies,
                            reachable_states, sources, stream_digest, work_chunks)
from zephon.work import WorkChunk

pytest_plugins = ["pytester"]


def three(seed=5, **kwargs):
    data = [Dataset.from_counts("a", [40, 20]), Dataset.from_counts("b", [30]), Dataset.from_counts("c", [25, 5])]
    settings = {"chunk_size": 10, "seed": seed, "exhausted_policy": "repeat", "max_repeats": 1, **kwargs}
    return StaticMixtureWorkSource(data, {"a": 0.5, "b": 0.3, "c": 0.2}, **settings)


class SkipsOnRestore(StaticMixtureWorkSource):
    """A broken source: a restore lands one chunk further than it should."""

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.next_chunk()


class RepeatsAPointer(StaticMixtureWorkSource):
    """A broken source: the last pointer of every chunk is its first one again."""

    def next_chunk(self):
        chunk = super().next_chunk()
        if chunk is None:
            return None
        name, pointers = next(iter(chunk.components.items()))
        components = dict(chunk.components)
        components[name] = list(map(tuple, pointers.tolist()))[:-1] + [tuple(pointers[0].tolist())]
        return WorkChunk(components, seed=chunk.seed)


def broken(kind):
    data = [Dataset.from_counts("a", [40, 20]), Dataset.from_counts("b", [30])]
    return kind(data, {"a": 0.6, "b": 0.4}, chunk_size=10, seed=2)


def test_a_replay_failure_says_chunk_position_and_pointers():
    with pytest.raises(AssertionError, match=r"lane 0 of 1, restored before chunk 2: the streams part at chunk 2, "
                                             r"position \d+: expected \(\d+, \d+, \d+\) of '\w', got \("):
        assert_replay_equivalent(lambda: broken(SkipsOnRestore), [2])


def test_an_elastic_failure_names_the_lane_chunk_and_pointers():
    with pytest.raises(AssertionError, match=r"lane \d of 4 \(stopped after 15 samples on \(2, 1, 'contiguous'\), "
                                             r"resumed on \(1, 2, 'interleaved'\)\) (parts from its stream at chunk "
                                             r"\d+, position \d+ .*expected \(.*read \(|lost \d+ samples)"):
        assert_elastic_resume_equivalent(lambda: broken(SkipsOnRestore), (2, 1, "contiguous"), 15,
                                         (1, 2, "interleaved"), canonical_replicas=4)


@pytest.mark.parametrize("cut", [0, 7, 10**6])
def test_an_elastic_resume_of_a_pipeline_with_maps(cut):
    pipeline = Pipeline(three()).map(lambda item: dict(item, seen=True))
    assert_elastic_resume_equivalent(lambda: pipeline, (3, 2, "interleaved"), cut, (2, 0, "contiguous"))


def test_a_topology_must_be_a_triple():
    with pytest.raises(ValueError, match="world_size, num_workers, mapping"):
        assert_elastic_resume_equivalent(three, (2, 1), 3, (1, 1, "contiguous"))


def test_an_empty_redistributing_dataset_has_no_passes_to_check():
    data = [Dataset.from_counts("a", [500, 300]), Dataset.from_counts("empty", [0])]
    source = StaticMixtureWorkSource(data, {"a": 1, "empty": 1}, chunk_size=4, seed=0,
                                     exhausted_policy={"a": "stop", "empty": "redistribute"})
    assert source.config.datasets[1].total == 0 and source.config.datasets[1].pass_tail == "carry"
    assert_passes_complete(lambda: source)


def test_a_repeated_sample_fails_the_pass_check_naming_it():
    with pytest.raises(AssertionError, match=r"dataset 'a' pass 0 holds \(0, \d+, \d+\) twice \(chunks 0 and 0\)"):
        assert_passes_complete(lambda: broken(RepeatsAPointer))
    assert_passes_complete(three)


def test_the_prefix_bound_fails_for_the_legacy_allocator_and_says_where():
    data = [Dataset.from_counts("a", [10**4]), Dataset.from_counts("b", [10**4])]
    skewed = functools.partial(StaticMixtureWorkSource, data, {"a": 0.93, "b": 0.07}, chunk_size=20)
    with pytest.raises(AssertionError, match=r"component '[ab]' is [\d.]+ samples off its target after \d+ samples "
                                             r"\(chunk \d+, position \d+\)"):
        assert_mixture_prefix_bound(functools.partial(skewed, allocation="fixed"), 2)
    assert_mixture_prefix_bound(skewed, 1.5)


def hash_seeded():
    """A stream that depends on the interpreter's hash seed: what the fresh-process check catches."""
    return three(seed=hash("zephon") % 1000, shuffle_within_shard=True)


def test_a_stream_that_depends_on_the_hash_seed_fails_in_a_fresh_process():
    with pytest.raises(AssertionError, match=r"PYTHONHASHSEED=.*: chunk 0, position \d+: this process reads"):
        assert_same_stream_in_fresh_process(hash_seeded, max_chunks=3)
    assert_same_stream_in_fresh_process(lambda: three(chunk_size=7), max_chunks=4)  # a lambda travels by value
    lock = threading.Lock()
    with pytest.raises(TypeError, match="must be picklable"):
        assert_same_stream_in_fresh_process(lambda: lock and three())


def test_the_digest_is_stable_and_tells_streams_apart():
    digest = stream_digest(three())
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert digest == stream_digest(three().clone_for_lane(0, 1))
    assert digest != stream_digest(three(seed=6)) != stream_digest(three(chunk_size=9))
    assert stream_digest(three(), max_chunks=3) != digest
    source = three().clone_for_lane(1, 2)
    before = stream_digest(source)
    assert source.state.chunk_index == 0 and stream_digest(source) == before  # the source is not advanced
    with pytest.raises(ValueError, match="max_chunks"):
        stream_digest(three(), max_chunks=-1)


def records(text):
    data = [Dataset.from_records("notes", [[{"text": text, "n": i} for i in range(6)]] * 2)]
    return Pipeline(StaticMixtureWorkSource(data, {"notes": 1}, chunk_size=4)).map(lambda item: dict(item, size=3))


def test_a_pipeline_digest_covers_its_items_and_a_source_digest_its_data():
    assert stream_digest(records("a")) == stream_digest(records("a"))
    assert stream_digest(records("a")) != stream_digest(records("b"))  # same pointers, other records
    assert stream_digest(records("a").source) == stream_digest(records("b").source)
    assert stream_digest(records("a")) != stream_digest(records("a").map(lambda item: dict(item, size=4)))
    grown = [Dataset.from_counts("a", [40, 21]), Dataset.from_counts("b", [30]), Dataset.from_counts("c", [25, 5])]
    assert stream_digest(three(), max_chunks=2) != stream_digest(
        StaticMixtureWorkSource(grown, {"a": 0.5, "b": 0.3, "c": 0.2}, chunk_size=10, seed=5, exhausted_policy="repeat",
                                max_repeats=1), max_chunks=2)


@given(st.data())
def test_strategies_take_values_or_strategies_and_check_them(data):
    bound = data.draw(sources(canonical_replicas=3, lane=st.just(2), num_datasets=2))
    assert (bound.lane_id, bound.canonical_replicas, len(bound.component_ids())) == (2, 3, 2)
    world, workers, mapping = data.draw(loader_topologies(max_world_size=2, max_workers=0))
    assert 1 <= world <= 2 and workers == 0 and mapping in ("contiguous", "interleaved")
    assert len(data.draw(work_chunks(max_components=1, max_pointers=2))) <= 2
    assert data.draw(reachable_states(three().clone_for_lane(0, 1), max_chunks=0))["state"]["chunk_index"] == 0


@pytest.mark.parametrize("kwargs", [{"lane": 1}, {"canonical_replicas": 2, "lane": 5}, {"canonical_replicas": 0}])
def test_sources_refuse_a_lane_binding_that_cannot_exist(kwargs):
    with pytest.raises(InvalidArgument, match="lane|canonical_replicas"):
        sources(**kwargs)


@pytest.mark.parametrize("strategy", [loader_topologies(max_world_size=0), work_chunks(max_components=0),
])
def test_strategy_misuse_raises_invalid_argument(strategy):
    @given(strategy)
    def draw(value):
        pass

    with pytest.raises(InvalidArgument):
        draw()


GOLDEN_SUITE = """
from zephon import Dataset, StaticMixtureWorkSource

def test_pinned(zephon_golden):
    data = [Dataset.from_counts("a", [{count}]), Dataset.from_counts("b", [20])]
    zephon_golden("ab", StaticMixtureWorkSource(data, {{"a": 1, "b": 1}}, chunk_size=4))
"""


def test_the_golden_fixture_pins_a_digest_and_rewrites_it_only_when_asked(pytester):
    pytester.makepyfile(test_golden=GOLDEN_SUITE.format(count=30))
    missing = pytester.runpytest("-p", "no:cacheprovider")
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(["*no golden digest for 'ab'*--zephon-update-golden*"])
    pytester.runpytest("-p", "no:cacheprovider", "--zephon-update-golden").assert_outcomes(passed=1)
    pinned = (pytester.path / "golden" / "ab.digest").read_text()
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    (pytester.path / "test_golden.py").unlink()  # a new module: pytester runs in this process
    pytester.makepyfile(test_changed_data=GOLDEN_SUITE.format(count=12))
    changed = pytester.runpytest("-p", "no:cacheprovider")
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines(["*the stream 'ab' changed*"])
    assert (pytester.path / "golden" / "ab.digest").read_text() == pinned


@given(replica_batches=st.lists(st.lists(st.integers(0, 10**6), unique=True, max_size=6), min_size=1, max_size=4,
                                unique_by=lambda keys: tuple(keys)),
       peers=st.integers(1, 3), data=st.data())
def test_parallel_reads_pass_for_a_true_layout_and_name_each_way_it_breaks(replica_batches, peers, data):
    from zephon.testing import assert_parallel_reads

    seen: set[int] = set()
    batches = [[k for k in keys if not (k in seen or seen.add(k))] for keys in replica_batches]  # disjoint replicas
    groups = [[r * peers + p for p in range(peers)] for r in range(len(batches))]
    reads = {rank: list(batches[r]) for r, group in enumerate(groups) for rank in group}
    stream = [k for keys in batches for k in keys]
    assert_parallel_reads(reads, groups, data.draw(st.permutations(stream)))
    r = data.draw(st.integers(0, len(batches) - 1))
    if peers > 1 and batches[r]:
        parted = {**reads, groups[r][-1]: reads[groups[r][-1]][:-1]}
        with pytest.raises(AssertionError, match=f"ranks {groups[r][0]} and {groups[r][-1]} of one replica part"):
            assert_parallel_reads(parted, groups)
    if len(batches) > 1 and batches[r]:
        other = (r + 1) % len(batches)
        shared = {rank: keys + [batches[r][0]] if rank in groups[other] else keys for rank, keys in reads.items()}
        with pytest.raises(AssertionError, match="also read by rank"):
            assert_parallel_reads(shared, groups)
    with pytest.raises(AssertionError, match="not read"):
        assert_parallel_reads(reads, groups, stream + [-1])


def test_a_batch_digest_reads_values_not_containers():
    import numpy as np
    import torch

    from zephon.testing import batch_digest

    batch = {"input_ids": torch.arange(6).reshape(2, 3), "_component": ["a", "b"]}
    assert batch_digest(batch) == batch_digest({"_component": ("a", "b"), "input_ids": np.arange(6).reshape(2, 3)})
    assert batch_digest(batch) != batch_digest({**batch, "input_ids": torch.arange(6, dtype=torch.int32).reshape(2, 3)})
    assert batch_digest(batch) != batch_digest({**batch, "input_ids": torch.arange(6).reshape(3, 2)})
    # pinned: the digest of a batch never changes (other processes, versions and machines compare them)
    assert batch_digest(batch) == "a7645e64a5375649335df88ed324eba81161fc705789973eb2ed6c82b80d5f77"
    assert batch_digest({1: "a"}) != batch_digest({"1": "a"})  # keys by type and value
    words = np.array(["a", None], dtype=object)
    assert batch_digest(words) == batch_digest(words.copy()) == batch_digest(["a", None])  # objects by value
    half = torch.ones(3, dtype=torch.bfloat16)
    assert batch_digest(half) == batch_digest(half.clone()) != batch_digest(half.to(torch.float16))
