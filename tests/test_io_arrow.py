"""Arrow IPC shards (file and stream formats, Feather) and Hugging Face datasets."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon import Pipeline, StaticMixtureWorkSource
from zephon.io import Dataset


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))


def table(start, count):
    ids = np.arange(start, start + count)
    return pa.table({"id": ids, "text": [f"row {i}" for i in ids], "score": ids / 4})


def write(directory, counts, layout, batch=5):
    os.makedirs(directory, exist_ok=True)
    start = 0
    for i, count in enumerate(counts):
        data = table(start, count)
        path = os.path.join(directory, f"part-{i:03d}.{'feather' if layout == 'feather' else 'arrow'}")
        if layout == "feather":
            feather.write_feather(data, path, chunksize=batch)
        else:
            opener = pa.ipc.new_file if layout == "file" else pa.ipc.new_stream
            with opener(path, data.schema) as writer:
                for piece in data.to_batches(max_chunksize=batch):
                    writer.write_batch(piece)
        start += count
    return directory


@settings(max_examples=15, deadline=None)
@given(counts=st.lists(st.integers(0, 23), min_size=1, max_size=4), layout=st.sampled_from(["file", "stream", "feather"]),
       batch=st.integers(1, 9), data=st.data())
def test_random_reads_equal_the_written_rows(tmp_path_factory, counts, layout, batch, data):
    directory = write(tmp_path_factory.mktemp("a"), counts, layout, batch)
    d = Dataset.from_path("a", directory)
    assert d.counts().tolist() == counts and d.columns() == ("id", "text", "score")
    starts = np.concatenate(([0], np.cumsum(counts)))
    for shard, count in enumerate(counts):
        offsets = data.draw(st.lists(st.integers(0, count - 1), max_size=12)) if count else []
        got = d.read_table(shard, offsets, columns=["id", "text"])
        assert got.column("id").to_pylist() == [int(starts[shard]) + o for o in offsets]
        assert got.column_names == ["id", "text"]


def test_one_request_per_record_batch_and_pieces_read_once(tmp_path):
    from pyarrow import fs as pafs

    from zephon.io.faults import faulty_filesystem

    write(tmp_path / "a", [40], "stream", batch=10)
    fs, handler = faulty_filesystem(pafs.LocalFileSystem())
    d = Dataset.from_path("a", str(tmp_path / "a"), filesystem=fs)
    handler.calls.clear()
    assert [r["id"] for r in d.read(0, [35, 1, 12, 3])] == [35, 1, 12, 3]
    assert handler.calls["read"] == 1 + 3  # the schema, then batches 3, 0 and 1
    assert d.read(0, [2, 36])[1]["id"] == 36 and handler.calls["read"] == 4  # cached


def test_dictionary_encoded_columns_are_refused_with_the_fix(tmp_path):
    os.makedirs(tmp_path / "a")
    data = pa.table({"tag": pa.array(["x", "y", "x"]).dictionary_encode()})
    with pa.ipc.new_file(tmp_path / "a" / "t.arrow", data.schema) as writer:
        writer.write_table(data)
    with pytest.raises(ValueError, match="t.arrow: dictionary-encoded.*cast"):
        Dataset.from_path("a", tmp_path / "a")


def test_not_an_arrow_file_names_it(tmp_path):
    os.makedirs(tmp_path / "a")
    (tmp_path / "a" / "x.arrow").write_bytes(b"definitely not arrow")
    with pytest.raises(ValueError, match="'a'.*x.arrow"):
        Dataset.from_path("a", tmp_path / "a")


# -- Hugging Face datasets ------------------------------------------------------------------------


@pytest.fixture
def hf():
    return pytest.importorskip("datasets", reason="the zephon-mixtures[hf] extra (datasets) is not installed")


def saved(hf, path, rows=50, shards=3):
    ids = list(range(rows))
    data = hf.Dataset.from_dict({"id": ids, "text": [f"t{i}" for i in ids]})
    data.save_to_disk(str(path), num_shards=shards)
    return path


def test_a_saved_dataset_is_one_shard_per_arrow_file_and_reads_through_the_loader(hf, tmp_path):
    import zephon.torch as zt

    path = saved(hf, tmp_path / "saved")
    d = Dataset.from_hf("hf", path)
    loaded = hf.load_from_disk(str(path))
    assert d.shard_count() == 3 and d.total() == 50 and d.columns() == ("id", "text")
    assert Dataset.from_hf("hf", loaded).read(2, [0, 1]) == d.read(2, [0, 1])
    rows = [loaded[i]["id"] for i in range(50)]
    assert [r["id"] for s in range(3) for r in d.read(s, list(range(d.counts()[s])))] == rows  # the dataset's order
    source = StaticMixtureWorkSource([d], {"hf": 1}, chunk_size=8, seed=2, shuffle_within_shard=True)
    batches = list(zt.DataLoader(Pipeline(source), batch_size=10))
    starts = np.concatenate(([0], np.cumsum(d.counts())))
    pointers = np.concatenate([batch["_sample_id"].numpy() for batch in batches])
    ids = np.concatenate([batch["id"].numpy() for batch in batches])
    assert len(ids) > 40 and (ids == starts[pointers[:, 1]] + pointers[:, 2]).all()


def test_from_hf_says_what_it_expected(hf, tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="'hf'.*plain has no state.json; from_hf needs a datasets.Dataset"):
        Dataset.from_hf("hf", tmp_path / "plain")
    splits = hf.DatasetDict({"train": hf.Dataset.from_dict({"a": [1]}), "test": hf.Dataset.from_dict({"a": [2]})})
    splits.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(ValueError, match="holds a DatasetDict.*pass one split's directory, e.g. .*dict/"):
        Dataset.from_hf("hf", tmp_path / "dict")
    loaded = hf.load_from_disk(str(saved(hf, tmp_path / "s")))
    with pytest.raises(ValueError, match="indices mapping.*flatten_indices"):
        Dataset.from_hf("hf", loaded.shuffle(seed=0))
    with pytest.raises(ValueError, match="in memory.*save_to_disk"):
        Dataset.from_hf("hf", hf.Dataset.from_dict({"a": [1, 2]}))
    with pytest.raises(TypeError, match="from_hf needs"):
        Dataset.from_hf("hf", 42)


def test_from_hf_refuses_a_dataset_that_shows_other_rows_or_columns_than_its_files(hf, tmp_path):
    """A slice or a change of columns made in memory is refused (zephon would read whole files),
    and what the error says to do (flatten_indices) gives exactly the rows and columns shown."""
    loaded = hf.load_from_disk(str(saved(hf, tmp_path / "s", shards=1)))
    parquet = tmp_path / "pq"
    parquet.mkdir()
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": [f"d{i}" for i in range(20)]}), parquet / "a.parquet")
    sliced = [loaded.select(range(10)), loaded.shard(4, 1, contiguous=True)]
    sliced += [hf.load_dataset("parquet", data_files=str(parquet / "*.parquet"), split=split,
                               cache_dir=str(tmp_path / "hf")) for split in ("train[:10]", "train[50%:]")]
    for view in sliced:
        with pytest.raises(ValueError, match=rf"shows {len(view)} of the \d+ rows.*flatten_indices"):
            Dataset.from_hf("hf", view)
    renamed = [loaded.rename_column("text", "body"), loaded.remove_columns(["id"]), loaded.select_columns(["id"]),
               loaded.cast_column("id", hf.Value("int32"))]
    for view in renamed[:3]:
        with pytest.raises(ValueError, match=r"shows the columns \(.*\) but its Arrow files hold \(id: int64, text: "
                                             r"string\).*flatten_indices"):
            Dataset.from_hf("hf", view)
    for view in sliced[:2] + renamed:
        flat = view.flatten_indices()
        d = Dataset.from_hf("hf", flat)
        assert d.columns() == tuple(flat.column_names)
        assert [r for s in range(d.shard_count()) for r in d.read(s, list(range(d.counts()[s])))] == flat.to_list()


@pytest.mark.parametrize("compression", ["zstd", None])
def test_the_fetch_cache_counts_what_a_record_batch_holds(tmp_path, compression):
    """A zstd body is a fraction of its record batch, and an uncompressed one is kept whole by
    the columns read from it: the cache's byte bound is on what it holds."""
    (tmp_path / "a").mkdir()
    path = str(tmp_path / "a" / "part.arrow")
    table = pa.table({"id": np.arange(2000), "text": ["lorem ipsum dolor sit amet " * 8] * 2000})
    with pa.OSFile(path, "wb") as out, \
            pa.ipc.new_file(out, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    d = Dataset.from_path("a", str(tmp_path / "a"))
    assert d.read(0, [0], columns=None if compression else ["id"])[0]["id"] == 0
    decoded = pa.Table.from_batches([pa.ipc.open_file(path).get_batch(0)]).get_total_buffer_size()
    if compression:  # decoded whole, the compressed body gone
        assert d.cache_info()["bytes"] == decoded > 10 * os.path.getsize(path)
    else:  # the ids alone are 8,000 bytes of the batch kept whole
        assert d.cache_info()["bytes"] >= decoded > 8000
