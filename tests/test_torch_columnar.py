"""A DataLoader without map steps reads path datasets as columns: each batch equals the collate
of its records (what any map step gives), or both fail alike; never a silently different batch."""
from __future__ import annotations

import json
import logging
import os
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import zephon.torch as zt  # noqa: E402
from zephon import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon.io import fetch_table  # noqa: E402

COLLATED = "collated from the records"  # what the log says when a bundle is not read as columns


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))


def write_jsonl(directory, shards):
    os.makedirs(directory, exist_ok=True)
    for s, records in enumerate(shards):
        with open(os.path.join(directory, f"{s:03d}.jsonl"), "w") as file:
            file.write("".join(json.dumps(record) + "\n" for record in records))
    return directory


def pipeline_of(dataset, chunk_size=4, **options):
    source = StaticMixtureWorkSource([dataset], {dataset.name: 1}, chunk_size=chunk_size, seed=1, exhausted_policy="stop",
                                     **options)
    return Pipeline(source)


def outcome(pipeline, batch_size, **options):
    """The loader's batches, or the type of what it raised."""
    try:
        return "made", list(zt.DataLoader(pipeline, batch_size=batch_size, num_workers=0, **options))
    except Exception as error:  # noqa: BLE001 - the two paths must fail alike
        return "raised", type(error)


def assert_same(columnar, records):
    assert columnar[0] == records[0], (columnar, records)
    if columnar[0] == "raised":
        assert columnar[1] is records[1]
        return
    assert len(columnar[1]) == len(records[1])
    for a, b in zip(columnar[1], records[1]):
        assert list(a) == list(b)
        for key in a:
            if isinstance(b[key], torch.Tensor):
                assert type(a[key]) is torch.Tensor and a[key].dtype == b[key].dtype, key
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key] and type(a[key]) is type(b[key]), key


def assert_as_records(pipeline, batch_size=4):
    """The batches of ``pipeline`` (no map step) equal those of its records collated."""
    assert_same(outcome(pipeline, batch_size), outcome(pipeline, batch_size, collate_fn=zt.collate))


# -- uint64 -----------------------------------------------------------------------------------


def test_a_uint64_value_past_int64_is_an_error_never_a_wrapped_value(tmp_path):
    (tmp_path / "u").mkdir()
    pq.write_table(pa.table({"h": pa.array([7, 2**63 + 5, 3, 2**64 - 1], pa.uint64())}), tmp_path / "u" / "a.parquet")
    pq.write_table(pa.table({"h": pa.array([7, 2**63 - 1], pa.uint64())}), tmp_path / "u" / "b.parquet")
    big = pipeline_of(Dataset.from_path("u", tmp_path / "u"), shuffle_shards=False)
    assert big.columnar
    with pytest.raises(ValueError, match=r"column 'h' holds the uint64 value 18446744073709551615, past the int64"):
        list(zt.DataLoader(big, batch_size=2, num_workers=0))
    assert_as_records(big, 2)  # the records' collate refuses them too
    os.remove(tmp_path / "u" / "a.parquet")
    small = pipeline_of(Dataset.from_path("u", tmp_path / "u"), chunk_size=2)
    (batch,) = list(zt.DataLoader(small, batch_size=2, num_workers=0))
    assert batch["h"].dtype == torch.int64 and sorted(batch["h"].tolist()) == [7, 2**63 - 1]
    assert_as_records(small, 2)


# -- JSONL records ------------------------------------------------------------------------------


def test_jsonl_fields_a_first_record_lacks_are_never_dropped(tmp_path, caplog):
    records = [{"text": "a0"}, {"text": "a1", "label": 7}, {"text": "a2", "label": 8}, {"text": "a3", "meta": {"x": 1}},
               {"text": "a4", "meta": {"y": 2}}]
    dataset = Dataset.from_path("j", write_jsonl(tmp_path / "j", [records]))
    pipeline = pipeline_of(dataset, chunk_size=5, shuffle_shards=False)
    with pytest.raises(ValueError, match="the items of one batch have different fields"):
        list(zt.DataLoader(pipeline, batch_size=5, num_workers=0))
    assert_as_records(pipeline, 5)
    assert dataset.read_table(0, range(5)).to_pylist()[1] == {"text": "a1", "label": 7, "meta": None}


def test_jsonl_batches_whose_fields_agree_are_made_though_the_shards_fields_differ(tmp_path, caplog):
    records = [{"text": f"a{i}"} for i in range(4)] + [{"text": f"b{i}", "label": i} for i in range(4)]
    dataset = Dataset.from_path("j", write_jsonl(tmp_path / "j", [records]))
    pipeline = pipeline_of(dataset, shuffle_shards=False)
    with caplog.at_level(logging.INFO, logger="zephon"):
        batches = list(zt.DataLoader(pipeline, batch_size=4, num_workers=0))
    assert [list(b) for b in batches] == [["text", "_sample_id", "_component"],
                                          ["text", "label", "_sample_id", "_component"]]
    assert batches[1]["label"].tolist() == [0, 1, 2, 3]
    assert COLLATED in caplog.text  # said, since it is slower
    assert_as_records(pipeline)


def test_jsonl_of_one_shape_is_read_as_columns(tmp_path, caplog):
    shards = [[{"text": f"t{s}.{i}", "n": i, "x": i / 2 + 0.5, "ok": i % 2 == 0, "ids": [i, s], "none": None}
               for i in range(9)] for s in range(3)]
    pipeline = pipeline_of(Dataset.from_path("j", write_jsonl(tmp_path / "j", shards)), shuffle_within_shard=True)
    assert pipeline.columnar
    with caplog.at_level(logging.INFO, logger="zephon"):
        assert_as_records(pipeline, 3)
    assert COLLATED not in caplog.text


def test_jsonl_numbers_that_are_ints_in_some_records_and_floats_in_others_batch_as_the_records_do(tmp_path):
    one_file = [[{"score": 1}, {"score": 1.5}, {"score": 2}, {"score": 3}, {"score": 2.5}, {"score": 4.0}]]
    two_files = [[{"text": "a0", "score": 1}, {"text": "a1", "score": 2}],
                 [{"text": "b0", "score": 1.5}, {"text": "b1", "score": 2.5}]]
    for k, shards in enumerate((one_file, two_files)):
        pipeline = pipeline_of(Dataset.from_path("j", write_jsonl(tmp_path / f"j{k}", shards)), chunk_size=2)
        assert outcome(pipeline, 2)[0] == "made"
        assert_as_records(pipeline, 2)


VALUES = st.one_of(st.integers(-3, 3), st.floats(-2, 2, allow_nan=False), st.booleans(), st.none(),
                   st.sampled_from(["x", "yz"]), st.lists(st.integers(0, 3), max_size=2),
                   st.dictionaries(st.sampled_from("pq"), st.integers(0, 2), max_size=2))


@settings(max_examples=25, deadline=None)
@given(shards=st.lists(st.lists(st.dictionaries(st.sampled_from(["a", "b", "c"]), VALUES, min_size=1, max_size=3),
                                min_size=1, max_size=6), min_size=1, max_size=3),
       batch_size=st.integers(1, 4), chunk_size=st.integers(1, 5))
def test_jsonl_batches_equal_their_records_collated_or_both_fail(tmp_path_factory, shards, batch_size, chunk_size):
    directory = write_jsonl(tmp_path_factory.mktemp("j") / uuid.uuid4().hex, shards)
    pipeline = pipeline_of(Dataset.from_path("j", directory, check_schema=False), chunk_size=chunk_size)
    assert_as_records(pipeline, batch_size)


# -- token files ------------------------------------------------------------------------------


def test_token_documents_batch_as_their_records_do(tmp_path):
    (tmp_path / "t").mkdir()
    np.arange(12, dtype=np.uint16).tofile(tmp_path / "t" / "f0.bin")
    dataset = Dataset.from_token_files("t", tmp_path / "t", dtype="uint16", doc_lengths=[3, 3, 3, 3])
    pipeline = pipeline_of(dataset, chunk_size=2, shuffle_shards=False)
    assert not pipeline.columnar
    batch = next(iter(zt.DataLoader(pipeline, batch_size=2, num_workers=0)))
    assert batch["input_ids"].dtype == torch.uint16 and batch["input_ids"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert_as_records(pipeline, 2)


# -- shards whose column types differ ----------------------------------------------------------


def test_parquet_shards_whose_ints_differ_in_width_are_read_as_columns_and_widened(tmp_path):
    (tmp_path / "p").mkdir()
    pq.write_table(pa.table({"text": ["a", "b"], "n": pa.array([1, 2], pa.int32())}), tmp_path / "p" / "a.parquet")
    pq.write_table(pa.table({"text": ["c"], "n": pa.array([2**40], pa.int64())}), tmp_path / "p" / "b.parquet")
    dataset = Dataset.from_path("p", tmp_path / "p", check_schema=False)
    pipeline = pipeline_of(dataset, chunk_size=3)
    assert pipeline.columnar
    assert_as_records(pipeline, 3)
    table = fetch_table({0: dataset}, [(0, 0, 1), (0, 1, 0)])
    assert table.schema.field("n").type == pa.int64() and table.column("n").to_pylist() == [2, 2**40]


def test_parquet_shards_whose_types_do_not_widen_are_collated_and_say_so(tmp_path, caplog):
    (tmp_path / "p").mkdir()
    pq.write_table(pa.table({"n": pa.array([1, 2], pa.int64())}), tmp_path / "p" / "a.parquet")
    pq.write_table(pa.table({"n": pa.array([0.5], pa.float64())}), tmp_path / "p" / "b.parquet")
    dataset = Dataset.from_path("p", tmp_path / "p", check_schema=False)
    with caplog.at_level(logging.INFO, logger="zephon"):
        pipeline = pipeline_of(dataset, chunk_size=3)
    assert not pipeline.columnar and "column 'n' is double, int64 in different shards" in caplog.text
    assert_as_records(pipeline, 1)
    with pytest.raises(ValueError, match="column 'n' is .* no one type holds them all unchanged"):
        fetch_table({0: dataset}, [(0, 0, 1), (0, 1, 0)])


# -- no columns -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "arrow"])
def test_no_columns_give_an_empty_record_per_row_everywhere(tmp_path, fmt):
    from zephon.io import fetch

    table = pa.table({"text": [f"r{i}" for i in range(6)]})
    (tmp_path / fmt).mkdir()
    path = tmp_path / fmt / f"a.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=4)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    else:
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=4)
    dataset = Dataset.from_path("x", tmp_path / fmt)
    pointers = [(0, 0, 0), (0, 0, 5), (0, 0, 1)]
    assert dataset.read(0, [0, 5], columns=[]) == [{}, {}]
    assert dataset.read_table(0, [0, 5], columns=[]).num_rows == 2
    assert fetch({0: dataset}, pointers, columns=[]) == [{}, {}, {}]
    assert fetch_table({0: dataset}, pointers, columns=[]).num_rows == 3
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], {"x": 1}, chunk_size=3, seed=0), columns=[])
    batches = list(zt.DataLoader(pipeline, batch_size=2, num_workers=0))
    assert sum(len(b["_sample_id"]) for b in batches) == 6 and all(list(b) == ["_sample_id", "_component"]
                                                                    for b in batches)
    assert_as_records(pipeline, 2)
