"""A batch carries the mixture (SPEC §9): it is a window of one lane's read order, so each
component is within 2 samples of its share of the batch, on every rank, with any number of
workers and lanes; resumes continue the same batches."""
import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def deviations(batches, weights):
    """Per batch of its full size, the largest |count - share x size| over the components."""
    names = list(weights)
    total = sum(weights.values())
    out = []
    for batch in batches:
        got = batch["_component"]
        out.append(max(abs(got.count(name) - weights[name] / total * len(got)) for name in names))
    return out


mixtures = st.lists(st.floats(0.05, 1.0), min_size=1, max_size=4).map(
    lambda ws: {f"d{i}": w for i, w in enumerate(ws)})


@settings(max_examples=25)
@given(mixtures, st.integers(1, 178), st.integers(1, 9), st.integers(1, 40), st.sampled_from([None, 1, 3]),
       st.integers(0, 2**32))
def test_every_full_batch_holds_each_component_within_two_of_its_share(weights, chunk_size, replicas, batch_size,
                                                                       world, seed):
    datasets = [Dataset.from_counts(name, [57, 91, 30]) for name in weights]  # 178: one chunk's draw at most
    source = StaticMixtureWorkSource(datasets, weights, chunk_size=chunk_size, seed=seed, exhausted_policy="repeat",
                                     shuffle_within_shard=True)
    ranks = [(None, None)] if world is None else [(rank, world) for rank in range(world)]
    for rank, size in ranks:
        loader = zt.DataLoader(Pipeline(source), batch_size=batch_size, canonical_replicas=replicas, rank=rank,
                               world_size=size, even_batches=False)
        batches = [b for _, b in zip(range(40), loader)]
        full = [b for b in batches if len(b["_component"]) == batch_size]
        assert max(deviations(full, weights), default=0) <= 2


@pytest.mark.parametrize("workers", [0, 2])
def test_the_issue_mixture_in_batches_of_eight(workers):
    weights = {"web": 0.6, "code": 0.3, "math": 0.1}
    datasets = [Dataset.from_counts(name, [5_000] * 4) for name in weights]
    source = StaticMixtureWorkSource(datasets, weights, chunk_size=1024, seed=1)
    loader = zt.DataLoader(Pipeline(source), batch_size=8, num_workers=workers)
    batches = [b for _, b in zip(range(2000), loader)]
    worst = deviations(batches, weights)
    assert max(worst) <= 2
    single = sum(len(set(b["_component"])) == 1 for b in batches)
    assert single == 0, f"{single} of {len(batches)} batches hold one component"
    web = [b["_component"].count("web") for b in batches]
    assert min(web) >= 3 and max(web) <= 6  # 4.8 a batch


def ids(batch):
    return [tuple(p) for p in batch["_sample_id"].tolist()]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_on_the_same_topology_continues_the_same_batches(workers):
    datasets = [Dataset.from_counts("web", [300] * 3), Dataset.from_counts("code", [170] * 2)]
    make = lambda: StaticMixtureWorkSource(datasets, {"web": 0.7, "code": 0.3}, chunk_size=50, seed=5)
    whole = [ids(b) for b in zt.DataLoader(Pipeline(make()), batch_size=7, num_workers=workers,
                                           canonical_replicas=5)]
    for cut in (0, 1, 4, 11, len(whole) - 1):
        first = zt.DataLoader(Pipeline(make()), batch_size=7, num_workers=workers, canonical_replicas=5)
        it = iter(first)
        head = [ids(next(it)) for _ in range(cut)]
        state = json.loads(json.dumps(first.state_dict()))
        second = zt.DataLoader(Pipeline(make()), batch_size=7, num_workers=workers, canonical_replicas=5)
        second.load_state_dict(state)
        assert head + [ids(b) for b in second] == whole
    assert len(whole) == len(zt.DataLoader(Pipeline(make()), batch_size=7, num_workers=workers, canonical_replicas=5))


def test_a_lanes_chunk_end_inside_a_batch_continues_with_its_next_chunk():
    datasets = [Dataset.from_counts("a", [40]), Dataset.from_counts("b", [40])]
    source = StaticMixtureWorkSource(datasets, {"a": 0.5, "b": 0.5}, chunk_size=6, seed=2, exhausted_policy="stop")
    lane = source.clone_for_lane(1, 2)
    stream = [tuple(p) for chunk in iter(lane.next_chunk, None) for p in chunk.read_order()[0].tolist()]
    loader = zt.DataLoader(Pipeline(source), batch_size=4, canonical_replicas=2)
    lane_one = [ids(b) for b in loader if ids(b)[0] in set(stream)]  # no sample repeats: it names its lane
    assert [p for b in lane_one for p in b] == stream  # batches of 4 across its chunks of 6
    assert {len(b) for b in lane_one[:-1]} == {4}


def test_each_readers_fetch_cache_holds_a_shard_per_lane_so_nothing_is_decoded_twice(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for k in range(12):
        pq.write_table(pa.table({"id": list(range(k * 50, k * 50 + 50))}), tmp_path / f"part-{k:02d}.parquet")
    dataset = Dataset.from_path("d", tmp_path, catalog_dir=tmp_path / "catalog")
    source = StaticMixtureWorkSource([dataset], {"d": 1.0}, chunk_size=20, seed=3, exhausted_policy="stop")
    loader = zt.DataLoader(Pipeline(source), batch_size=5, canonical_replicas=4, cache_bytes=1 << 20)
    ids = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(600))
    info = dataset.cache_info()
    assert info["max_shards"] == 4 and info["max_bytes"] == 1 << 20  # one shard per lane, within cache_bytes
    assert info["misses"] == 12  # every row group decoded once, though 4 lanes read 4 shards at a time
    with pytest.raises(ValueError, match="cache_bytes=0 must be an int >= 1"):
        zt.DataLoader(Pipeline(source), batch_size=5, cache_bytes=0)


def test_batch_tensors_cross_from_workers_as_arrays_and_come_back_as_they_were():
    import torch

    from zephon.torch._bundles import land, ship

    batch = {"_sample_id": torch.arange(12).reshape(4, 3), "_component": ["a", "b", "a", "a"],
             "x": (torch.ones(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.float16)), "n": 3}
    back = land(pickle.loads(pickle.dumps(ship(batch))))
    assert back["_component"] == batch["_component"] and back["n"] == 3
    for got, want in ((back["_sample_id"], batch["_sample_id"]), *zip(back["x"], batch["x"])):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)


def test_large_or_special_tensors_keep_torchs_own_hand_off():
    import torch

    from zephon.torch._bundles import SHIP_BYTES, ship

    big = torch.zeros(SHIP_BYTES // 4 + 1, dtype=torch.float32)
    sparse = torch.eye(3).to_sparse()
    conj = torch.ones(2, dtype=torch.complex64).conj()
    shipped = ship({"big": big, "sparse": sparse, "conj": conj, "list": [torch.ones(2), torch.ones(2)]})
    assert shipped["big"] is big and shipped["sparse"] is sparse and shipped["conj"] is conj
    assert all(type(t).__name__ == "_Shipped" for t in shipped["list"])


def test_drop_last_passes_over_what_it_drops_and_counts_it_as_the_loop_goes():
    datasets = [Dataset.from_counts("a", [23]), Dataset.from_counts("b", [19])]
    make = lambda: StaticMixtureWorkSource(datasets, {"a": 0.5, "b": 0.5}, chunk_size=6, seed=1,
                                           exhausted_policy="stop")
    for workers in (0, 2):
        loader = zt.DataLoader(Pipeline(make()), batch_size=4, num_workers=workers, canonical_replicas=3,
                               drop_last=True)
        it = iter(loader)
        next(it)
        assert loader.stats()["drop_last"] <= 3  # only what the first batch passed over
        rest = list(it)
        stats = loader.stats()
        total = len(make().clone_for_lane(0, 1))
        assert stats["drop_last"] + 4 * (1 + len(rest)) == total and loader.remaining() == 0
        assert stats["even_batches"]["held_back_samples"] == 0


def _odd(item):
    return item["_sample_id"][2] % 2 == 1


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.booleans(), st.booleans(), st.sampled_from([0, 2]),
       st.integers(0, 2**32), st.sampled_from([1, 3, 10**6]))
def test_stats_count_exactly_what_the_loop_received(chunk_size, batch_size, drop_last, filtered, workers, seed, every):
    """Read after every ``every`` batches and at the end. A filter step sends the batches down the
    records path; without one they take the pointer path, whose readers count a bundle's
    components (used when no look fell inside the bundle)."""
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    datasets = [Dataset.from_counts(name, [23, 17]) for name in weights]
    source = StaticMixtureWorkSource(datasets, weights, chunk_size=chunk_size, seed=seed, exhausted_policy="stop")
    pipeline = Pipeline(source).filter(_odd) if filtered else Pipeline(source)
    loader = zt.DataLoader(pipeline, batch_size=batch_size, canonical_replicas=3, drop_last=drop_last,
                           num_workers=workers)
    received = dict.fromkeys(weights, 0)
    k = 0
    for k, batch in enumerate(loader, 1):
        for name in batch["_component"]:
            received[name] += 1
        if k % every == 0:
            stats = loader.stats()  # counted a bundle at a time, settled when read
            assert stats["samples"] == received and stats["batches"] == k
    stats = loader.stats()
    assert stats["samples"] == received and stats["batches"] == k
