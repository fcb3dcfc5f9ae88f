"""Pipeline.to_torch_dataset / to_indexable_torch_dataset with plain torch and torchdata loaders (issue #5)."""
import json

import numpy as np
import pytest
import torch
from helpers import lane_streams
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import DistributedSampler
from torchdata import stateful_dataloader as stateful  # the test extra pins torchdata

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.runtime import parse_state

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning",
                                        "ignore:'set_vital' is deprecated:UserWarning")


def make_source(seed=3, policy="stop"):
    datasets = [Dataset.from_counts("web", [50] * 6), Dataset.from_counts("code", [40] * 4)]
    return StaticMixtureWorkSource(datasets, {"web": 0.6, "code": 0.4}, chunk_size=16, seed=seed,
                                   exhausted_policy=policy)


def ids(batch):
    return list(map(tuple, batch["_sample_id"].tolist()))


def test_iterable_dataset_with_a_plain_torch_loader_covers_the_stream_once():
    source = make_source()
    dataset = Pipeline(source).to_torch_dataset(canonical_replicas=3)
    assert isinstance(dataset, torch.utils.data.IterableDataset)
    batches = list(TorchDataLoader(dataset, batch_size=10, num_workers=2, collate_fn=zt.collate))
    seen = [p for b in batches for p in ids(b)]
    reference = lane_streams(source, 3)
    assert sorted(seen) == sorted(p for lane in reference.values() for p in lane)


def test_iterable_dataset_state_is_exact_with_num_workers_0():
    def make():
        return Pipeline(make_source()).to_torch_dataset(canonical_replicas=2)

    full = [ids(b) for b in TorchDataLoader(make(), batch_size=7, collate_fn=zt.collate)]
    dataset = make()
    it = iter(TorchDataLoader(dataset, batch_size=7, collate_fn=zt.collate))
    head = [ids(next(it)) for _ in range(9)]
    state = json.loads(json.dumps(dataset.state_dict()))
    fresh = make()
    fresh.load_state_dict(state)
    assert head + [ids(b) for b in TorchDataLoader(fresh, batch_size=7, collate_fn=zt.collate)] == full
    # every iter() starts at the dataset's position, like any IterableDataset
    assert [ids(b) for b in TorchDataLoader(fresh, batch_size=7, collate_fn=zt.collate)] == full[9:]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(workers):
    def make():
        dataset = Pipeline(make_source()).to_torch_dataset(canonical_replicas=3)
        return stateful.StatefulDataLoader(dataset, batch_size=6, num_workers=workers, collate_fn=zt.collate)

    full = [ids(b) for b in make()]
    loader = make()
    it = iter(loader)
    head = [ids(next(it)) for _ in range(11)]
    state = loader.state_dict()
    fresh = make()
    fresh.load_state_dict(state)
    assert head + [ids(b) for b in fresh] == full


def test_stateful_dataloader_state_resumes_elastically():
    """A StatefulDataLoader run on 1 rank x 2 workers, resumed on 2 ranks x 1 and 1 rank x 3 workers."""
    source = make_source(seed=8)
    loader = stateful.StatefulDataLoader(Pipeline(source).to_torch_dataset(canonical_replicas=4), batch_size=5,
                                         num_workers=2, collate_fn=zt.collate)
    it = iter(loader)
    seen = [p for _ in range(7) for p in ids(next(it))]
    state = zt.all_gather_state(zt.stateful_dataloader_state(loader.state_dict()))
    assert sorted(parse_state(state).entries) == [0, 1, 2, 3]
    reference = lane_streams(source, 4)
    owner = {p: lane for lane, pointers in reference.items() for p in pointers}
    for world, workers in ((2, 1), (1, 3)):
        resumed = list(seen)
        for rank in range(world):
            dataset = Pipeline(make_source(seed=8)).to_torch_dataset(rank=rank, world_size=world)
            dataset.load_state_dict(state)  # before the loader forks its workers
            loader = stateful.StatefulDataLoader(dataset, batch_size=5, num_workers=workers, collate_fn=zt.collate)
            resumed += [p for b in loader for p in ids(b)]
        assert sorted(resumed) == sorted(owner)
        assert {lane: [p for p in resumed if owner[p] == lane] for lane in reference} == reference


def test_stateful_dataloader_state_needs_a_zephon_dataset():
    with pytest.raises(ValueError, match="no zephon state"):
        zt.stateful_dataloader_state({"_snapshot": {}})


def test_indexable_dataset_reads_the_stream_by_position():
    source = make_source()
    pipeline = Pipeline(source)
    stream = list(pipeline)
    dataset = pipeline.to_indexable_torch_dataset()
    assert len(dataset) == len(stream)
    assert dataset[0] == stream[0] and dataset[-1] == stream[-1] and dataset[17] == stream[17]
    assert dataset.__getitems__([5, 2, -1]) == [stream[5], stream[2], stream[-1]]
    batches = list(TorchDataLoader(dataset, batch_size=32, collate_fn=zt.collate, num_workers=2))
    assert [p for b in batches for p in ids(b)] == [i["_sample_id"] for i in stream]
    # split over ranks with a sampler
    parts = [list(DistributedSampler(dataset, num_replicas=2, rank=r, shuffle=False)) for r in range(2)]
    assert sorted(parts[0] + parts[1])[:len(stream)] == list(range(len(stream)))
    lane = pipeline.to_indexable_torch_dataset(lane=1, canonical_replicas=3)
    assert [lane[i]["_sample_id"] for i in range(len(lane))] == lane_streams(make_source(), 3)[1]
    with pytest.raises(IndexError):
        dataset[len(stream)]


def test_indexable_dataset_with_records_and_maps():
    shards = [[{"id": 10 * s + o} for o in range(n)] for s, n in enumerate([12, 9])]
    pipeline = Pipeline(StaticMixtureWorkSource([Dataset.from_records("r", shards)], {"r": 1}, chunk_size=5))
    pipeline = pipeline.map(lambda item: {**item, "neg": -item["id"]})
    dataset = pipeline.to_indexable_torch_dataset()
    assert [dataset[i] for i in range(len(dataset))] == list(pipeline)


def test_not_indexable_is_refused_clearly():
    pipeline = Pipeline(make_source(policy="repeat"))
    assert not pipeline.is_indexable
    with pytest.raises(TypeError, match="not indexable.*to_torch_dataset"):
        pipeline.to_indexable_torch_dataset()
    with pytest.raises(ValueError, match="both lane and canonical_replicas"):
        Pipeline(make_source()).to_indexable_torch_dataset(lane=0)


def test_collate_batches_pointers_and_keeps_other_fields_torch_like():
    items = [{"x": 1, "t": "a", "_sample_id": (0, 1, 2), "_component": "web"},
             {"x": 2, "t": "b", "_sample_id": (0, 1, 3), "_component": "code"}]
    batch = zt.collate(items)
    assert torch.equal(batch["_sample_id"], torch.tensor([[0, 1, 2], [0, 1, 3]]))
    assert batch["_component"] == ["web", "code"] and batch["t"] == ["a", "b"]
    assert torch.equal(batch["x"], torch.tensor([1, 2]))
    assert torch.equal(zt.collate([np.int64(1), np.int64(2)]), torch.tensor([1, 2]))
