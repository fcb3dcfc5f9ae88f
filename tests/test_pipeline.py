"""Pipeline: items, map steps, records, random access, direct iteration (issue #5; torch-free)."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.runtime import rank_lanes, worker_lanes


def counts_source(**kwargs):
    datasets = [Dataset.from_counts("web", [40] * 5), Dataset.from_counts("code", [25, 0, 30])]
    kwargs = {"chunk_size": 16, "seed": 5, **kwargs}
    return StaticMixtureWorkSource(datasets, {"web": 0.6, "code": 0.4}, **kwargs)


def global_stream(source):
    """The whole stream (lane 0 of 1) in read order, as (pointer, component) pairs."""
    lane, out = source.clone_for_lane(0, 1), []
    while (chunk := lane.next_chunk()) is not None:
        out.extend(chunk.iter_samples())
    return out


def test_count_only_items_are_pointer_and_component():
    source = counts_source()
    items = list(Pipeline(source))
    assert all(set(item) == {"_sample_id", "_component"} for item in items)
    assert [(item["_sample_id"], item["_component"]) for item in items] == global_stream(counts_source())


def test_items_carry_record_fields_then_metadata_and_maps_apply_in_order():
    shards = [[{"id": 100 * s + o, "text": f"r{s}.{o}"} for o in range(n)] for s, n in enumerate([7, 5])]
    words = [["a", "b", "c"], ["d"]]
    datasets = [Dataset.from_records("rec", shards), Dataset.from_records("words", words)]
    source = StaticMixtureWorkSource(datasets, {"rec": 3, "words": 1}, chunk_size=4, seed=1)
    pipeline = Pipeline(source).map(lambda item: {**item, "n": 1}).map(lambda item: {**item, "n": item["n"] + 1})
    items = list(pipeline)
    assert items, "the stream is not empty"
    for item in items:
        d, s, o = item["_sample_id"]
        if item["_component"] == "rec":
            assert list(item) == ["id", "text", "_sample_id", "_component", "n"]
            assert item["id"] == 100 * s + o and d == 0
        else:
            assert item["record"] == words[s][o] and d == 1
        assert item["n"] == 2
    assert Pipeline(source).maps == () and len(pipeline.maps) == 2  # map returns a new pipeline


def test_records_are_copied_so_map_steps_cannot_change_the_dataset():
    shards = [[{"x": 1}, {"x": 2}]]
    source = StaticMixtureWorkSource([Dataset.from_records("d", shards)], {"d": 1}, chunk_size=2)

    def bump(item):
        item["x"] += 10
        return item

    assert sorted(i["x"] for i in Pipeline(source).map(bump)) == [11, 12]
    assert shards == [[{"x": 1}, {"x": 2}]]


def test_path_datasets_and_mixed_count_only(tmp_path):
    os.makedirs(tmp_path / "pq")
    for s in range(3):
        pq.write_table(pa.table({"id": list(range(100 * s, 100 * s + 9)), "t": [f"x{s}"] * 9}),
                       tmp_path / "pq" / f"{s:02d}.parquet")
    with open(tmp_path / "j.jsonl", "w") as f:
        for i in range(6):
            f.write(json.dumps({"id": -i}) + "\n")
    os.makedirs(tmp_path / "js")
    os.replace(tmp_path / "j.jsonl", tmp_path / "js" / "0.jsonl")
    datasets = [Dataset.from_path("pq", tmp_path / "pq", cache_dir=tmp_path / "c"),
                Dataset.from_path("js", tmp_path / "js", cache_dir=tmp_path / "c"),
                Dataset.from_counts("n", [8])]
    source = StaticMixtureWorkSource(datasets, {"pq": 2, "js": 1, "n": 1}, chunk_size=8, seed=2)
    pipeline = Pipeline(source, columns=["id"])
    assert not pipeline.pointer_only and not pipeline.columnar
    for item in pipeline:
        d, s, o = item["_sample_id"]
        if d == 0:
            assert item == {"id": 100 * s + o, "_sample_id": (d, s, o), "_component": "pq"}
        elif d == 1:
            assert item == {"id": -o, "_sample_id": (d, s, o), "_component": "js"}
        else:
            assert item == {"_sample_id": (d, s, o), "_component": "n"}
    assert Pipeline(StaticMixtureWorkSource(datasets[:1], {"pq": 1}, chunk_size=4)).columnar


def test_no_columns_reads_items_of_metadata_alone(tmp_path):
    """``columns=[]`` over Parquet (records gathered at once) and JSONL (read per shard) alike."""
    pq.write_table(pa.table({"id": list(range(9))}), tmp_path / "00.parquet", row_group_size=4)
    (tmp_path / "js").mkdir()
    (tmp_path / "js" / "0.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(5)))
    for name, path in (("pq", tmp_path), ("js", tmp_path / "js")):
        source = StaticMixtureWorkSource([Dataset.from_path(name, path, cache_dir=tmp_path / f"c-{name}")], {name: 1},
                                         chunk_size=4, seed=3)
        items, whole = list(Pipeline(source, columns=[])), list(Pipeline(source))
        assert [{key: item[key] for key in ("_sample_id", "_component")} for item in whole] == items


def test_is_indexable_follows_the_source():
    assert Pipeline(counts_source()).is_indexable
    assert Pipeline(counts_source()).map(str).is_indexable  # per-record steps keep random access
    assert not Pipeline(counts_source(exhausted_policy="repeat")).is_indexable


def test_items_at_matches_the_stream():
    source = counts_source()
    pipeline = Pipeline(source)
    stream = list(pipeline)
    picks = np.array([0, 5, len(stream) - 1, 3])
    items = pipeline.items_at(source.sample_ids_at(picks))
    assert items == [stream[i] for i in picks]


def test_pipeline_refuses_bad_input():
    with pytest.raises(TypeError, match="WorkSource"):
        Pipeline([1, 2])
    with pytest.raises(ValueError, match="template"):
        Pipeline(counts_source().clone_for_lane(0, 2))
    with pytest.raises(TypeError, match="callable"):
        Pipeline(counts_source()).map(3)
    with pytest.raises(TypeError, match="columns"):
        Pipeline(counts_source(), columns="text")


@pytest.mark.parametrize("mapping", ["contiguous", "interleaved"])
@pytest.mark.parametrize("replicas,world", [(8, 3), (4, 4), (2, 5), (7, 1)])
def test_lanes_partition_over_ranks_and_workers(mapping, replicas, world):
    seen = []
    for rank in range(world):
        lanes = rank_lanes(replicas, rank, world, mapping)
        assert lanes == sorted(lanes)
        parts = [worker_lanes(lanes, w, 3, mapping) for w in range(3)]
        assert sorted(sum(parts, [])) == lanes
        seen += lanes
    assert sorted(seen) == list(range(replicas))
    if mapping == "contiguous":
        assert rank_lanes(8, 0, 3, mapping) == [0, 1, 2] and rank_lanes(8, 2, 3, mapping) == [6, 7]
    else:
        assert rank_lanes(8, 1, 3, mapping) == [1, 4, 7]


def test_bad_mapping_is_refused():
    from zephon.runtime import LaneBook

    with pytest.raises(ValueError, match="mapping"):
        LaneBook(Pipeline(counts_source()), canonical_replicas=None, mapping="random", rank=0, world_size=1)


def _renamed(item):
    return {"n": len(item)}


def test_map_keeps_sample_id_and_component_on_a_new_dict_and_refuses_changing_them():
    source = counts_source()
    items = list(Pipeline(source).map(_renamed))
    assert [(i["_sample_id"], i["_component"]) for i in items] == global_stream(counts_source())
    assert all(i["n"] == 2 for i in items)
    with pytest.raises(ValueError, match="changed '_component'.*another key"):
        list(Pipeline(source).map(lambda item: {**item, "_component": "other"}))
    with pytest.raises(ValueError, match="changed '_sample_id'"):
        list(Pipeline(source).map(lambda item: dict(item, _sample_id=(0, 0, 0))))
    assert list(Pipeline(source).map(lambda item: item["_sample_id"][2]))[:3] == [p[2] for p, _ in
                                                                                  global_stream(source)[:3]]


def test_filter_drops_items_and_they_count_as_consumed_in_checkpoints():
    from zephon.runtime import ItemStream, initial_entries

    source = counts_source(exhausted_policy="stop")
    pipeline = Pipeline(source).filter(lambda item: item["_sample_id"][2] % 3 != 0)
    everything = [p for p, _ in global_stream(counts_source(exhausted_policy="stop"))]
    kept = [i["_sample_id"] for i in pipeline]
    assert kept == [p for p in everything if p[2] % 3 != 0] and len(kept) < len(everything)
    for cut in [0, 1, 7, len(kept) - 1]:
        stream = ItemStream(pipeline, [0], 1, initial_entries(source, [0], 1))
        head = [next(stream)["_sample_id"] for _ in range(cut)]
        resumed = ItemStream(pipeline, [0], 1, stream.entries())
        assert head + [i["_sample_id"] for i in resumed] == kept, cut
    assert "filter(" in repr(pipeline) and pipeline.maps == () and not pipeline.pointer_only
    with pytest.raises(TypeError, match="filter"):
        Pipeline(source).filter(3)


@settings(max_examples=25, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 29)), min_size=1, max_size=60),
       columns=st.sampled_from([None, ["t"], ["t", "id"]]))
def test_records_of_columnar_datasets_are_gathered_at_once_and_equal_a_read_per_shard(tmp_path_factory, picks,
                                                                                      columns):
    """Parquet and Arrow datasets of one schema: the pipeline gathers a bundle's records in one
    ``fetch_table``; they are the records ``fetch`` reads shard by shard, in pointer order."""
    from zephon.io import fetch

    root = tmp_path_factory.mktemp("g")
    for fmt in ("parquet", "arrow"):
        os.makedirs(root / fmt)
        for s in range(3):
            table = pa.table({"id": np.arange(30) + 100 * s, "t": [f"{fmt}{s}:{i}" for i in range(30)]})
            if fmt == "parquet":
                pq.write_table(table, root / fmt / f"{s:02d}.parquet", row_group_size=7)
            else:
                with pa.ipc.new_file(root / fmt / f"{s:02d}.arrow", table.schema) as writer:
                    for batch in table.to_batches(max_chunksize=11):
                        writer.write_batch(batch)
    datasets = [Dataset.from_path(fmt, root / fmt, catalog_dir=root / "c") for fmt in ("parquet", "arrow")]
    pipeline = Pipeline(StaticMixtureWorkSource(datasets, {"parquet": 1, "arrow": 1}, chunk_size=8), columns=columns)
    assert pipeline._gathers
    pointers = np.array(picks, dtype=np.int64)
    gathered, read = pipeline._records(pointers), fetch(pipeline.datasets_by_id, pointers, columns)
    assert [list(r.items()) for r in gathered] == [list(r.items()) for r in read]  # keys in the same order too


def test_records_of_shards_whose_columns_differ_in_order_are_read_shard_by_shard(tmp_path):
    """Shards that agree on their columns only as sets (what ``check_schema`` accepts) are read
    one by one, so that each record keeps its own file's column order."""
    os.makedirs(tmp_path / "d")
    pq.write_table(pa.table({"id": [0, 1], "t": ["a", "b"]}), tmp_path / "d" / "00.parquet")
    pq.write_table(pa.table({"t": ["c", "d"], "id": [2, 3]}), tmp_path / "d" / "01.parquet")
    dataset = Dataset.from_path("d", tmp_path / "d", catalog_dir=tmp_path / "c")
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], {"d": 1}, chunk_size=4))
    assert not pipeline._gathers
    records = pipeline._records(np.array([[0, 0, 1], [0, 1, 0]], dtype=np.int64))
    assert [list(r.items()) for r in records] == [[("id", 1), ("t", "b")], [("t", "c"), ("id", 2)]]
