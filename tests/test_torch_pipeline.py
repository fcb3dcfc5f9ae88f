"""Pipeline steps through zephon.torch.DataLoader: filters keep checkpoints exact and are counted,
mixed columns get the library's error (issue #13)."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning",
                                        "ignore:'set_vital' is deprecated:UserWarning")


def records_source():
    shards = [[{"id": 10 * s + o} for o in range(n)] for s, n in enumerate([30, 25, 40])]
    return StaticMixtureWorkSource([Dataset.from_records("r", shards), Dataset.from_counts("n", [50])],
                                   {"r": 2, "n": 1}, chunk_size=9, seed=1, exhausted_policy="stop")


def uniform(item):
    return {"id": item.get("id", 1)}


def odd_ids(item):
    return item.get("id", 1) % 2 == 1


def ids(batch):
    return list(map(tuple, batch["_sample_id"].tolist()))


@pytest.mark.parametrize("workers", [0, 2])
def test_filtered_batches_resume_exactly_and_drops_are_counted(workers):
    def make():
        return zt.DataLoader(Pipeline(records_source()).map(uniform).filter(odd_ids), batch_size=6,
                             num_workers=workers,
                             canonical_replicas=2)

    loader = make()
    full = [ids(b) for b in loader]
    unfiltered = [ids(b) for b in zt.DataLoader(Pipeline(records_source()), batch_size=6, num_workers=workers,
                                                canonical_replicas=2, collate_fn=_pointers)]
    assert len(full) == len(unfiltered) == loader.stats()["batches"]  # batches are cut before filtering
    dropped = sum(map(len, unfiltered)) - sum(map(len, full))
    assert dropped > 0 and loader.stats()["filtered"] == dropped
    assert sum(loader.stats()["samples"].values()) == sum(map(len, full))
    for cut in [1, 4, len(full) - 1]:
        first = make()
        it = iter(first)
        head = [ids(next(it)) for _ in range(cut)]
        again = make()
        again.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert len(again) == len(full) and again.remaining() == len(full) - cut  # the epoch it resumes into
        assert head + [ids(b) for b in again] == full, cut


def _pointers(items):
    return {"_sample_id": __import__("torch").tensor([i["_sample_id"] for i in items]).reshape(-1, 3)}


def test_a_batch_whose_items_are_all_filtered_is_empty():
    loader = zt.DataLoader(Pipeline(records_source()).filter(lambda item: False), batch_size=4, num_workers=1)
    batches = list(loader)
    assert batches and all(b["_sample_id"].shape == (0, 3) and b["_component"] == [] for b in batches)
    with pytest.raises(ValueError, match="filter step needs a batch_size"):
        zt.DataLoader(Pipeline(records_source()).filter(odd_ids))


def test_mixed_parquet_columns_without_a_map_get_the_librarys_error(tmp_path):
    for name, columns in {"a": {"x": [1, 2, 3, 4]}, "b": {"y": ["p", "q", "r", "s"]}}.items():
        (tmp_path / name).mkdir()
        pq.write_table(pa.table(columns), tmp_path / name / "0.parquet")
    datasets = [Dataset.from_path(n, tmp_path / n, cache_dir=tmp_path / "c") for n in ("a", "b")]
    source = StaticMixtureWorkSource(datasets, {"a": 1, "b": 1}, chunk_size=4, exhausted_policy="stop")
    with pytest.raises(ValueError, match="different fields.*map step"):
        list(zt.DataLoader(Pipeline(source), batch_size=4))
