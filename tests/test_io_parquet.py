"""Parquet datasets: footer row counts, row-group reads, the fetch cache, bad input (issue #4)."""
import copy
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from zephon.io import Dataset, block_span
from zephon.io.faults import faulty_filesystem

SCHEMA = pa.schema([("id", pa.int64()), ("text", pa.string()), ("score", pa.float64())])


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch, tmp_path):
    monkeypatch.delenv("ZEPHON_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def write_shards(directory, counts, row_group_size=4, start=0, schema=SCHEMA):
    """One file per count, ``part-00000.parquet``..., rows with ``id`` = running number from ``start``."""
    os.makedirs(directory, exist_ok=True)
    next_id = start
    for i, count in enumerate(counts):
        ids = np.arange(next_id, next_id + count)
        table = pa.table({"id": ids, "text": [f"row {j}" for j in ids], "score": ids / 2}, schema=schema)
        pq.write_table(table, os.path.join(directory, f"part-{i:05d}.parquet"), row_group_size=row_group_size)
        next_id += count
    return directory


def expected(counts, shard, offset):
    row = sum(counts[:shard]) + offset
    return {"id": row, "text": f"row {row}", "score": row / 2}


def test_counts_come_from_footers_and_shards_follow_sorted_names(tmp_path):
    counts = [5, 0, 17, 3]
    data = write_shards(tmp_path / "d", counts)
    d = Dataset.from_path("d", data)
    assert d.ids().tolist() == [0, 1, 2, 3] and d.counts().tolist() == counts
    assert d.raw_bytes().tolist() == [os.path.getsize(data / f"part-{i:05d}.parquet") for i in range(4)]
    assert d.columns() == ("id", "text", "score") and d.total() == 25 and len(d) == 25
    assert d.path(2).endswith("part-00002.parquet")
    assert d.read(2, [16, 0, 5]) == [expected(counts, 2, o) for o in (16, 0, 5)]
    assert isinstance(d.fingerprint(), str) and len(d.fingerprint()) == 16


def test_read_decodes_only_the_row_groups_it_needs(tmp_path):
    d = Dataset.from_path("d", write_shards(tmp_path / "d", [40], row_group_size=4))  # 10 row groups
    assert d.read(0, [13, 12, 14]) == [expected([40], 0, o) for o in (13, 12, 14)]
    assert d.cache_info()["misses"] == 1  # row group 3 only
    d.read(0, [1, 39, 15])
    info = d.cache_info()
    assert (info["misses"], info["hits"]) == (3, 1)  # groups 0 and 9 decoded, 3 cached


def test_read_table_keeps_the_order_asked_and_projects_columns(tmp_path):
    counts = [30]
    d = Dataset.from_path("d", write_shards(tmp_path / "d", counts, row_group_size=7))
    offsets = [29, 0, 14, 7, 7, 21, 3]
    table = d.read_table(0, offsets, columns=["text", "id"])
    assert table.column_names == ["text", "id"]
    assert table.column("id").to_pylist() == offsets
    assert d.read(0, offsets, columns=["id"]) == [{"id": o} for o in offsets]
    assert d.read_table(0, []).num_rows == 0 and d.read(0, []) == []
    assert d.read_table(0, np.array([], dtype=np.int64), columns=["id"]).column_names == ["id"]


def test_cache_keeps_at_most_max_shards_and_max_bytes(tmp_path):
    d = Dataset.from_path("d", write_shards(tmp_path / "d", [8, 8, 8], row_group_size=4))
    for shard in (0, 1, 2):
        d.read(shard, [0, 7])
    info = d.cache_info()
    assert info["shards"] == 1 and info["max_shards"] == 1 and info["misses"] == 6
    d.configure_cache(max_shards=2)
    d.clear_cache()
    for shard in (0, 1, 0, 1):
        d.read(shard, [0, 7])
    assert d.cache_info()["misses"] == 4 and d.cache_info()["hits"] == 4
    one_group = d.cache_info()["bytes"] // 4
    d.configure_cache(max_shards=2, max_bytes=one_group * 2)
    assert d.cache_info()["bytes"] <= one_group * 2
    d.read(2, [0, 7])
    assert d.cache_info()["bytes"] <= one_group * 2 and d.cache_info()["shards"] == 1
    d.configure_cache()
    assert (d.cache_info()["max_shards"], d.cache_info()["max_bytes"]) == (1, None)
    with pytest.raises(ValueError, match="max_shards"):
        d.configure_cache(max_shards=0)
    with pytest.raises(ValueError, match="max_bytes"):
        d.configure_cache(max_bytes=-1)


def test_from_path_sets_the_cache_bounds(tmp_path):
    d = Dataset.from_path("d", write_shards(tmp_path / "d", [8]), cache_shards=3, cache_bytes=10**6)
    assert (d.cache_info()["max_shards"], d.cache_info()["max_bytes"]) == (3, 10**6)
    with pytest.raises(ValueError, match="max_shards"):
        Dataset.from_path("d", tmp_path / "d", cache_shards=0)
    with pytest.raises(ValueError, match="non-empty str"):
        Dataset.from_path("", tmp_path / "nowhere")


def test_block_span_bounds_the_shards_a_block_touches():
    assert block_span([10, 10, 10], None) == 1 and block_span([10, 10, 10], 1) == 1
    assert block_span([10, 10, 10], 5) == 2 and block_span([10, 10, 10], 11) == 2
    assert block_span([10, 10, 10], 12) == 3 and block_span([10, 10, 10], 10**6) == 3
    assert block_span([0, 0, 5, 1, 1], 3) == 3 and block_span([0, 0], 5) == 1


def test_pickled_and_copied_datasets_read_with_their_own_empty_cache(tmp_path):
    d = Dataset.from_path("d", write_shards(tmp_path / "d", [6, 6]), cache_shards=2)
    d.read(0, [1])
    for clone in (pickle.loads(pickle.dumps(d)), copy.deepcopy(d)):
        assert clone.cache_info()["misses"] == 0 and clone.cache_info()["max_shards"] == 2
        assert clone.read(1, [5]) == [expected([6, 6], 1, 5)]
        assert clone.fingerprint() == d.fingerprint()


def test_null_typed_columns_of_empty_shards_match_any_type(tmp_path):
    write_shards(tmp_path / "d", [3])
    pq.write_table(pa.table({"id": pa.array([], pa.int64()), "text": pa.array([], pa.null()),
                             "score": pa.array([], pa.float64())}), tmp_path / "d" / "part-00001.parquet")
    assert Dataset.from_path("d", tmp_path / "d").counts().tolist() == [3, 0]


# -- bad input --------------------------------------------------------------------------------


def test_missing_path_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Dataset.from_path("d", tmp_path / "nowhere")


def test_empty_directory_and_a_plain_file_raise_value_error(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="empty.*no \\*.parquet"):
        Dataset.from_path("d", tmp_path / "empty")
    write_shards(tmp_path / "d", [2])
    with pytest.raises(ValueError, match="not a directory"):
        Dataset.from_path("d", tmp_path / "d" / "part-00000.parquet")
    with pytest.raises(ValueError, match="fmt="):
        Dataset.from_path("d", tmp_path / "d", fmt="csv")
    with pytest.raises(ValueError, match="no jsonl files.*fmt='parquet'"):
        Dataset.from_path("d", tmp_path / "d", fmt="jsonl")


def test_mixed_formats_raise_unless_fmt_picks_one(tmp_path):
    write_shards(tmp_path / "d", [2, 3])
    (tmp_path / "d" / "extra.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="mixes formats.*part-00000.parquet.*extra.jsonl"):
        Dataset.from_path("d", tmp_path / "d")
    assert Dataset.from_path("d", tmp_path / "d", fmt="parquet").counts().tolist() == [2, 3]
    assert Dataset.from_path("j", tmp_path / "d", fmt="jsonl").counts().tolist() == [1]


def test_hidden_files_and_subdirectories_are_not_shards(tmp_path):
    write_shards(tmp_path / "d", [2, 3])
    (tmp_path / "d" / ".partial.parquet").write_bytes(b"junk")
    (tmp_path / "d" / "nested.parquet").mkdir()
    assert Dataset.from_path("d", tmp_path / "d").counts().tolist() == [2, 3]


@pytest.mark.parametrize("content", [b"", b"not parquet at all", b"PAR1" + b"\0" * 20 + b"PAR1",
                                     b"x" * 100 + (10**6).to_bytes(4, "little") + b"PAR1"])
def test_corrupted_file_raises_naming_it(tmp_path, content):
    write_shards(tmp_path / "d", [2])
    (tmp_path / "d" / "part-00001.parquet").write_bytes(content)
    with pytest.raises(ValueError, match="part-00001.parquet"):
        Dataset.from_path("d", tmp_path / "d")


def test_corrupted_data_pages_raise_naming_the_file_and_row_group(tmp_path):
    write_shards(tmp_path / "d", [40], row_group_size=20)
    path = tmp_path / "d" / "part-00000.parquet"
    metadata = pq.read_metadata(path)
    column = metadata.row_group(1).column(1)
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(path.read_bytes())
    data[start:start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    stat = os.stat(path)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    d = Dataset.from_path("d", tmp_path / "d")
    assert d.read(0, [0])[0]["id"] == 0
    with pytest.raises(ValueError, match="part-00000.parquet.*row group 1"):
        d.read(0, [25])


def test_the_row_groups_a_read_misses_load_at_once_and_its_first_failure_is_named(tmp_path, monkeypatch):
    """Two loads must overlap to pass a barrier; of two failing row groups the first in
    row-group order is raised although the later one fails first, and the good ones stay cached."""
    import threading
    import time

    import zephon.io._parquet as parquet
    import zephon.io._shards as shards_module

    d = Dataset.from_path("d", write_shards(tmp_path / "d", [60], row_group_size=10))  # 6 row groups
    monkeypatch.setattr(shards_module.os, "cpu_count", lambda: 4)
    load, together = parquet.ParquetReader._load, threading.Barrier(2, timeout=10)

    def overlapping(self, k, meta, piece, columns):
        together.wait()
        return load(self, k, meta, piece, columns)

    monkeypatch.setattr(parquet.ParquetReader, "_load", overlapping)
    assert d.read(0, [15, 5]) == [expected([60], 0, o) for o in (15, 5)]

    def failing(self, k, meta, piece, columns):
        if piece in (2, 4):
            time.sleep(0.3 if piece == 2 else 0)
            raise ValueError(f"bad row group {piece}")
        return load(self, k, meta, piece, columns)

    monkeypatch.setattr(parquet.ParquetReader, "_load", failing)
    with pytest.raises(ValueError, match="bad row group 2"):
        d.read(0, [55, 45, 25, 35, 15])
    misses = d.cache_info()["misses"]
    assert d.read(0, [55, 35, 15]) == [expected([60], 0, o) for o in (55, 35, 15)]
    assert d.cache_info()["misses"] == misses  # row groups 1, 3 and 5 were cached by the failed read


def test_reads_of_a_row_group_at_once_decode_it_once(tmp_path, monkeypatch):
    """A read that needs a row group another read is decoding waits for that decode."""
    import threading
    import time

    import zephon.io._parquet as parquet

    d = Dataset.from_path("d", write_shards(tmp_path / "d", [8], row_group_size=8))
    load, loading, loads = parquet.ParquetReader._load, threading.Event(), []

    def slow(self, k, meta, piece, columns):
        loads.append(piece)
        loading.set()
        time.sleep(0.3)  # the second read comes meanwhile
        return load(self, k, meta, piece, columns)

    monkeypatch.setattr(parquet.ParquetReader, "_load", slow)
    first: list = []
    reading = threading.Thread(target=lambda: first.append(d.read(0, [3])))
    reading.start()
    assert loading.wait(10)
    assert d.read(0, [5]) == [expected([8], 0, 5)]
    reading.join(10)
    assert first == [[expected([8], 0, 3)]] and loads == [0]
    assert (d.cache_info()["misses"], d.cache_info()["hits"]) == (1, 1)


def _waiting_read(cache, key):
    """A thread reading ``key`` of shard 0 from ``cache``, which another read is loading: it
    must still be waiting a moment later. Returns the thread and the list its result goes to."""
    import threading

    got: list = []
    thread = threading.Thread(target=lambda: got.append(cache.get(0, key)))
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and not got
    return thread, got


def test_a_read_of_a_piece_another_read_is_loading_gets_that_piece():
    from zephon.io._cache import ShardCache

    cache, key = ShardCache(max_shards=2), (1, None)
    assert cache.get(0, key) is None  # this read loads the piece
    thread, got = _waiting_read(cache, key)
    cache.put(0, key, "row group 1", 10)
    thread.join(10)
    assert got == ["row group 1"] and (cache.info()["misses"], cache.info()["hits"]) == (1, 1)


@pytest.mark.parametrize("end", ["interrupted", "clear"])
def test_reads_waiting_for_a_load_that_is_interrupted_or_let_go_load_the_piece_themselves(end):
    from zephon.io._cache import ShardCache

    cache, key = ShardCache(max_shards=2), (1, None)
    assert cache.get(0, key) is None
    thread, got = _waiting_read(cache, key)
    cache.failed(0, key, KeyboardInterrupt()) if end == "interrupted" else cache.clear()
    thread.join(10)
    assert got == [None]  # the waiting read loads it now, and the next read waits for that
    thread, got = _waiting_read(cache, key)
    cache.put(0, key, "row group 1", 10)
    thread.join(10)
    assert got == ["row group 1"]


def test_reads_waiting_for_a_load_that_failed_raise_its_error():
    import threading

    from zephon.io._cache import ShardCache

    cache, key, raised = ShardCache(max_shards=2), (1, None), []
    assert cache.get(0, key) is None

    def read():
        try:
            cache.get(0, key)
        except OSError as error:
            raised.append(error)

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(0.2)
    error = OSError("row group 1: retries spent")
    cache.failed(0, key, error)
    thread.join(10)
    assert raised == [error]
    assert cache.get(0, key) is None  # nothing is left waiting: the next read loads it


def test_a_load_that_cannot_be_cached_leaves_no_read_waiting(tmp_path, monkeypatch):
    """Even an interrupt between a row group's decoding and its caching lets the next read of it
    decode it."""
    import threading

    d = Dataset.from_path("d", write_shards(tmp_path / "d", [8], row_group_size=8))
    cache = d._reader.cache
    put = cache.put

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "put", interrupted)
    with pytest.raises(KeyboardInterrupt):
        d.read(0, [1])
    monkeypatch.setattr(cache, "put", put)
    got: list = []
    thread = threading.Thread(target=lambda: got.append(d.read(0, [2])), daemon=True)
    thread.start()
    thread.join(10)
    assert got == [[expected([8], 0, 2)]]


def test_reads_of_a_piece_the_readahead_loads_take_it_once_and_cache_it():
    """Two reads that find a piece the readahead is loading: one claims it, the other waits for
    that read; both get the piece, and the cache holds it (not an emptied ticket's None)."""
    import threading

    from zephon.io._cache import ShardCache
    from zephon.io._readahead import DONE, RUNNING, Ticket, _Pool

    cache, key, pool = ShardCache(max_shards=2), (1, None), _Pool(1 << 30, 1, None)
    ticket = Ticket(pool, 10, (cache, 0, key), 0, lambda: 0)
    assert cache.expect(0, key, ticket)
    ticket.state = RUNNING  # the readahead is loading it
    got: list = []
    reads = [threading.Thread(target=lambda: got.append(cache.get(0, key))) for _ in range(2)]
    for read in reads:
        read.start()
    for read in reads:
        read.join(0.2)
    with pool.cond:
        ticket.value, ticket.nbytes, ticket.state = "row group 1", 10, DONE
        ticket.event.set()
    for read in reads:
        read.join(10)
    assert got == ["row group 1", "row group 1"] and cache.get(0, key) == "row group 1"
    info = cache.info()
    assert (info["misses"], info["prefetched"], info["hits"]) == (1, 1, 2)


def test_each_is_a_list_comprehension_run_on_threads():
    from zephon.io._shards import _each

    for threads in (1, 2, 5, 9):
        assert _each(lambda x: x * x, list(range(7)), threads) == [x * x for x in range(7)]
        assert _each(str, [], threads) == []

    def fail(x):
        if x in (3, 5):
            raise KeyError(x)
        return x

    with pytest.raises(KeyError, match="3"):
        _each(fail, list(range(7)), 3)


def test_unreadable_file_raises_naming_it(tmp_path):
    write_shards(tmp_path / "d", [2])
    os.symlink(tmp_path / "gone.parquet", tmp_path / "d" / "part-00001.parquet")
    with pytest.raises(ValueError, match="part-00001.parquet"):
        Dataset.from_path("d", tmp_path / "d")


def test_file_without_read_permission_raises_naming_it(tmp_path):
    write_shards(tmp_path / "d", [2, 2])

    def refuse(operation, path):
        if operation == "open" and path.endswith("part-00001.parquet"):
            return PermissionError(13, "Permission denied", path)
        return None

    fs, handler = faulty_filesystem(pafs.LocalFileSystem(), rule=refuse)
    with pytest.raises(OSError, match="'d', shard 1 .*part-00001.parquet.*Permission denied"):
        Dataset.from_path("d", str(tmp_path / "d"), filesystem=fs)
    assert handler.calls["open"] == 2  # not retried: permission errors are not transient


def test_schemas_differing_across_shards_raise_naming_both_files_and_the_column(tmp_path):
    write_shards(tmp_path / "d", [2, 2])
    other = pa.schema([("id", pa.int64()), ("text", pa.large_binary()), ("score", pa.float64())])
    write_shards(tmp_path / "e", [2], schema=other)
    os.replace(tmp_path / "e" / "part-00000.parquet", tmp_path / "d" / "part-00002.parquet")
    with pytest.raises(ValueError, match="'text'.*part-00000.parquet.*part-00002.parquet"):
        Dataset.from_path("d", tmp_path / "d")
    assert Dataset.from_path("d", tmp_path / "d", check_schema=False).counts().tolist() == [2, 2, 2]
    pq.write_table(pa.table({"id": [1]}), tmp_path / "d" / "part-00002.parquet")
    with pytest.raises(ValueError, match="'text'.*present in part-00000.parquet but missing in part-00002"):
        Dataset.from_path("d", tmp_path / "d")


def test_pointers_out_of_range_raise_index_error_naming_dataset_shard_and_offset(tmp_path):
    d = Dataset.from_path("web", write_shards(tmp_path / "d", [3, 4]))
    with pytest.raises(IndexError, match="'web', shard 1 .*part-00001.parquet.*offset 4 is out of range \\[0, 4\\)"):
        d.read(1, [0, 4])
    with pytest.raises(IndexError, match="'web'.*offset -1"):
        d.read(0, [-1])
    with pytest.raises(IndexError, match="no shard 2"):
        d.read(2, [0])
    with pytest.raises(ValueError, match="no column 'body'.*columns: id, text, score"):
        d.read(0, [0], columns=["body"])
    with pytest.raises(TypeError, match="list of column names"):
        d.read(0, [0], columns="id")
    with pytest.raises(TypeError, match="offsets"):
        d.read(0, [0.5])


def test_a_file_rewritten_under_a_reused_catalog_is_detected_on_read(tmp_path):
    d = Dataset.from_path("d", write_shards(tmp_path / "d", [4]))
    write_shards(tmp_path / "d", [6])
    with pytest.raises(ValueError, match="part-00000.parquet.*changed since its catalog"):
        d.read(0, [0])
    assert Dataset.from_path("d", tmp_path / "d").counts().tolist() == [6]
