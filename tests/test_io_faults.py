"""Storage faults: transient errors retried, stalls timed out, lost or changed shards named — never a hang."""
import gc
import json
import logging
import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from zephon import Pipeline, StaticMixtureWorkSource
from zephon.io import Dataset, RetryPolicy, ShardChangedError, StorageError, StorageTimeoutError
from zephon.io.faults import faulty_filesystem

QUICK = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0)


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))


def shards(directory, counts=(20, 20, 20)):
    os.makedirs(directory, exist_ok=True)
    start = 0
    for i, count in enumerate(counts):
        ids = np.arange(start, start + count)
        pq.write_table(pa.table({"id": ids}), os.path.join(directory, f"part-{i}.parquet"), row_group_size=5)
        start += count
    return str(directory)


class Failing:
    """A rule: the first ``times`` reads of files whose name contains ``match`` fail with ``error``."""

    def __init__(self, match, times=0, error=lambda: ConnectionResetError(104, "Connection reset by peer"), op="read"):
        self.match, self.left, self.error, self.op = match, times, error, op

    def __call__(self, operation, path):
        if operation == self.op and self.match in path and self.left:
            self.left -= 1
            return self.error()
        return None


def test_transient_errors_are_retried_with_a_log_line(tmp_path, caplog):
    directory = shards(tmp_path / "d")
    rule = Failing("part-1")
    fs, handler = faulty_filesystem(pafs.LocalFileSystem(), rule=rule)
    d = Dataset.from_path("web", directory, filesystem=fs, retry=QUICK)
    rule.left = 2
    with caplog.at_level(logging.WARNING, logger="zephon"):
        assert [r["id"] for r in d.read(1, [7, 0])] == [27, 20]
    assert rule.left == 0
    retried = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert len(retried) == 2 and "'web', shard 1" in retried[0] and "part-1.parquet" in retried[0]


def test_a_short_read_of_an_unchanged_file_is_retried(tmp_path):
    """An object store's body cut off mid-way makes pyarrow say "File too short": the storage's
    fault, not the file's, as long as the file is unchanged."""
    directory = shards(tmp_path / "d")
    rule = Failing("part-1", error=lambda: OSError("File too short: expected to be able to read 100 bytes, got 50"))
    fs, _ = faulty_filesystem(pafs.LocalFileSystem(), rule=rule)
    d = Dataset.from_path("web", directory, filesystem=fs, retry=QUICK)
    rule.left = 1
    assert [r["id"] for r in d.read(1, [7, 0])] == [27, 20] and rule.left == 0


def test_a_read_that_keeps_failing_names_the_dataset_shard_and_uri(tmp_path):
    directory = shards(tmp_path / "d")
    d = Dataset.from_path("web", directory, retry=QUICK)
    rule = Failing("part-2")
    fs, handler = faulty_filesystem(pafs.LocalFileSystem(), rule=rule)
    broken = Dataset.from_path("web", directory, filesystem=fs, retry=QUICK, cache_shards=3)
    rule.left = 10**6
    assert broken.read(0, [1]) == d.read(0, [1])
    with pytest.raises(StorageError, match=r"'web', shard 2 \(.*part-2.parquet\): .* failed after 3 attempts") as caught:
        broken.read(2, [0])
    assert caught.value.dataset == "web" and caught.value.shard == 2 and caught.value.uri.endswith("part-2.parquet")


def test_a_stalled_read_times_out_instead_of_hanging(tmp_path):
    import threading
    import time

    directory = shards(tmp_path / "d")
    stall = RetryPolicy(attempts=2, backoff_s=0.01, timeout_s=0.2)
    stalled, over = {"on": False}, threading.Semaphore(0)

    def rule(operation, path):
        if stalled["on"] and operation == "read":
            time.sleep(0.6)
            over.release()

    fs, _ = faulty_filesystem(pafs.LocalFileSystem(), rule=rule)
    d = Dataset.from_path("web", directory, filesystem=fs, retry=stall)
    stalled["on"] = True
    with pytest.raises(StorageTimeoutError, match=r"'web', shard 0 .*part-0.parquet.*timeout_s=0.2"):
        d.read(0, [3])
    # the abandoned reads run on in Python code called from Arrow; one that returns while the
    # interpreter exits aborts it (a CPython limit), so the test outlives them: their stalls end,
    # then every read thread is idle again
    from zephon.io import retry

    assert over.acquire(timeout=10) and over.acquire(timeout=10)
    deadline = time.monotonic() + 10
    while retry._POOL._idle < sum(t.name == "zephon-read" for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_filesystem_of_a_paths_device_tells_a_local_disk_from_a_network_or_fuse_mount(tmp_path):
    from zephon.io._fs import on_local_disk

    device = os.stat(tmp_path).st_dev
    here = f"{os.major(device)}:{os.minor(device)}".encode()

    def mountinfo(*kinds):
        """A mount table in which ``tmp_path``'s device is mounted once per kind given."""
        path = tmp_path / ("mountinfo-" + "-".join(kinds))
        path.write_bytes(b"\n".join([
            b"22 27 0:21 / /proc rw,relatime - proc proc rw",
            *(b"%d 1 %s / /m%d rw,relatime shared:1 - %s /dev/vda rw" % (30 + k, here, k, kind.encode())
              for k, kind in enumerate(kinds)),
            b"40 27 8:17 / /media/caf\xe9 rw - vfat /dev/sdb1 rw",  # a mount point that is not UTF-8
            b"odd line",
        ]))
        return str(path)

    for kind in ("ext4", "xfs", "tmpfs", "overlay"):
        assert on_local_disk([tmp_path], mountinfo(kind)) is True, kind
    for kind in ("nfs4", "fuse.s3fs", "lustre", "cifs", "9p"):
        assert on_local_disk([tmp_path], mountinfo(kind)) is False, kind
    assert on_local_disk([tmp_path], mountinfo("ext4", "nfs4")) is False  # the device mounted twice, once as NFS
    assert on_local_disk([tmp_path, tmp_path / "missing"], mountinfo("ext4")) is False
    assert on_local_disk([tmp_path], str(tmp_path / "no-mountinfo")) is False  # cannot tell: not local
    assert on_local_disk(["/proc"]) is False  # this machine's own table: procfs is no disk


@pytest.mark.parametrize("local_disk", [True, False])
def test_reads_from_a_local_disk_run_untimed_in_the_calling_thread_by_default(tmp_path, monkeypatch, caplog,
                                                                              local_disk):
    """By default a local disk's reads run in the thread that wants them (said in a debug line),
    other storage's on the timed read threads; a policy passed in is kept either way."""
    import threading

    import zephon.io._parquet as parquet
    import zephon.io.dataset as dataset_module

    monkeypatch.setattr(dataset_module, "on_local_disk", lambda paths: local_disk)
    load, threads = parquet.ParquetReader._load, []

    def recorded(self, k, meta, piece, columns):
        threads.append(threading.current_thread())
        return load(self, k, meta, piece, columns)

    monkeypatch.setattr(parquet.ParquetReader, "_load", recorded)
    directory = shards(tmp_path / "d")
    with caplog.at_level(logging.DEBUG, logger="zephon"):
        d = Dataset.from_path("web", directory)
    assert ("are on a local disk, so its reads run untimed" in caplog.text) is local_disk
    assert d.read(0, [3]) == [{"id": 3}]
    assert (threads[-1] is threading.current_thread()) is local_disk
    assert (d._reader.policy.timeout_s is None) is local_disk
    assert Dataset.from_path("web", directory, retry=QUICK)._reader.policy is QUICK


def test_the_disk_of_a_dataset_is_that_of_its_directory_and_of_every_file_or_link_in_it(tmp_path, monkeypatch):
    """A dataset's directory of links to files elsewhere is local only if the files are: the
    devices looked up are those of the directory and of each file (a link's, its target's)."""
    import zephon.io.dataset as dataset_module

    elsewhere = shards(tmp_path / "elsewhere", counts=(20,))
    directory = tmp_path / "d"
    directory.mkdir()
    os.symlink(os.path.join(elsewhere, "part-0.parquet"), directory / "part-0.parquet")
    asked: list = []

    def local(paths):
        asked.extend(paths)
        return True

    monkeypatch.setattr(dataset_module, "on_local_disk", local)
    Dataset.from_path("web", directory)
    assert asked == [str(directory), str(directory / "part-0.parquet")]
    assert os.stat(asked[1]).st_ino == os.stat(os.path.join(elsewhere, "part-0.parquet")).st_ino  # the target's


def test_timed_reads_reuse_their_threads_and_a_stuck_one_is_replaced():
    import threading
    import time

    def readers():
        return sum(t.name == "zephon-read" for t in threading.enumerate())

    policy = RetryPolicy(attempts=1, timeout_s=5.0)
    before = readers()
    assert [policy.call(lambda k=k: k, what="a read", dataset="d", shard=0, uri="u") for k in range(200)] == \
        list(range(200))
    assert readers() - before <= 1  # one pool thread served them all
    with pytest.raises(StorageTimeoutError):
        RetryPolicy(attempts=1, timeout_s=0.05).call(lambda: time.sleep(0.5), what="a read", dataset="d", shard=0,
                                                      uri="u")
    assert policy.call(lambda: "after", what="a read", dataset="d", shard=0, uri="u") == "after"  # not stuck behind it


def test_exit_waits_for_the_reads_in_progress_but_not_for_abandoned_ones():
    import threading

    from zephon.io import retry

    def call(policy, fn):
        return policy.call(fn, what="a read", dataset="d", shard=0, uri="u")

    stuck, started, release = threading.Event(), threading.Event(), threading.Event()
    assert retry._POOL.settle(30)  # the reads of earlier tests, if any, have ended
    try:
        with pytest.raises(StorageTimeoutError):
            call(RetryPolicy(attempts=1, timeout_s=0.05), lambda: stuck.wait(30))
        assert retry._POOL.settle(5)  # the abandoned read is not waited for
        slow = threading.Thread(target=call, args=(RetryPolicy(attempts=1), lambda: (started.set(), release.wait(30))))
        slow.start()
        assert started.wait(5)
        assert not retry._POOL.settle(0.01)  # a read in progress is
        release.set()
        assert retry._POOL.settle(10)
        slow.join()
    finally:
        stuck.set()
        release.set()


def test_a_shard_that_disappears_or_changes_during_the_run_is_named(tmp_path):
    directory = shards(tmp_path / "d")
    d = Dataset.from_path("web", directory, cache_shards=3)
    assert d.read(0, [0]) == [{"id": 0}]
    os.remove(os.path.join(directory, "part-1.parquet"))
    with pytest.raises(ShardChangedError, match=r"'web', shard 1 \(.*part-1.parquet\): the file disappeared"):
        d.read(1, [0])
    pq.write_table(pa.table({"id": np.arange(30)}), os.path.join(directory, "part-2.parquet"))
    with pytest.raises(ShardChangedError, match=r"'web', shard 2 \(.*part-2.parquet\): the file changed"):
        d.read(2, [0])


def test_an_error_met_by_the_readahead_reaches_the_stream_instead_of_skipping_data(tmp_path):
    directory = shards(tmp_path / "d", counts=(40, 40))
    rule = Failing("part-1")
    fs, _ = faulty_filesystem(pafs.LocalFileSystem(), rule=rule)
    d = Dataset.from_path("web", directory, filesystem=fs, retry=QUICK)
    rule.left = 10**6
    source = StaticMixtureWorkSource([d], {"web": 1}, chunk_size=10, seed=4, shuffle_within_shard=True)
    pipeline = Pipeline(source, prefetch_bytes=1 << 20)
    seen = []
    with pytest.raises(StorageError, match=r"'web', shard 1 .*part-1.parquet"):
        for item in pipeline:
            seen.append(item["_sample_id"])
    assert all(shard == 0 for _, shard, _ in seen)  # nothing of shard 1 was skipped or invented


def test_the_retry_policy_checks_its_settings():
    assert RetryPolicy().delay(1) == 0.2 and RetryPolicy().delay(10) == 5.0
    for bad in ({"attempts": 0}, {"attempts": 1.5}, {"backoff_s": 0}, {"max_backoff_s": -1}, {"timeout_s": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RetryPolicy(**bad)
    with pytest.raises(TypeError, match="retry=.*RetryPolicy"):
        Dataset.from_path("web", "/nowhere", retry=3)


def test_reading_jsonl_shards_in_turn_leaves_no_file_open(tmp_path):
    os.makedirs(tmp_path / "j")
    for i in range(3):
        (tmp_path / "j" / f"{i}.jsonl").write_text("".join(json.dumps({"i": i, "k": k}) + "\n" for k in range(4)))
    d = Dataset.from_path("j", tmp_path / "j")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for shard in range(3):
            assert d.read(shard, [3]) == [{"i": shard, "k": 3}]
        d.clear_cache()
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


@pytest.mark.parametrize("compression", ["gzip", "snappy", "zstd", "brotli"])
def test_a_corrupted_compressed_row_group_is_named_at_once_not_retried(tmp_path, compression, caplog):
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "a.parquet"
    pq.write_table(pa.table({"s": [f"text number {i} " * 20 for i in range(2000)], "i": list(range(2000))}), path,
                   compression=compression, row_group_size=1000)
    stat = os.stat(path)
    with open(path, "r+b") as file:
        file.seek(200)
        file.write(b"\xff" * 300)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    d = Dataset.from_path("c", tmp_path / "d")
    with caplog.at_level(logging.WARNING, logger="zephon"):
        with pytest.raises(ValueError, match=r"'c', shard 0 \(.*a.parquet\): cannot read row group 0 .* the file is "
                                             "corrupted") as raised:
            d.read(0, [0])
    assert not isinstance(raised.value, StorageError) and "retry" not in caplog.text.lower()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_shard_cut_short_after_its_first_read_is_a_changed_shard(tmp_path, fmt, caplog):
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / f"a.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"text": [f"row-{i:03d}" for i in range(10)]}), path)
    else:
        path.write_text("".join(json.dumps({"text": f"row-{i:03d}"}) + "\n" for i in range(10)))
    d = Dataset.from_path("p", tmp_path / "d")
    assert d.read(0, [0, 5]) == [{"text": "row-000"}, {"text": "row-005"}]
    d.clear_cache()
    with open(path, "r+b") as file:
        file.truncate(30)
    with caplog.at_level(logging.WARNING, logger="zephon"):
        with pytest.raises(ShardChangedError, match=r"'p', shard 0 \(.*a\.\w+\): the file changed since its catalog"):
            d.read(0, [0, 5, 9])
    assert "retry" not in caplog.text.lower()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_shard_rewritten_in_place_after_it_was_opened_is_a_changed_shard(tmp_path, fmt):
    """Same size, another mtime: an open shard's reads would give the new content without an
    error, so every piece loaded is followed by a look at the file."""
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / f"a.{fmt}"

    def write(tag):
        rows = [f"{tag}-{i:03d}" for i in range(10)]
        if fmt == "parquet":
            pq.write_table(pa.table({"text": rows}), path, compression="none")
        else:
            path.write_text("".join(json.dumps({"text": row}) + "\n" for row in rows))
    write("old")
    d = Dataset.from_path("p", tmp_path / "d")
    assert d.read(0, [0]) == [{"text": "old-000"}]
    d.clear_cache()  # the shard stays open
    size = os.path.getsize(path)
    write("new")
    assert os.path.getsize(path) == size
    later = os.stat(path).st_mtime_ns + 5 * 10**9
    os.utime(path, ns=(later, later))
    with pytest.raises(ShardChangedError, match=r"'p', shard 0 \(.*a\.\w+\): the file changed since its catalog"):
        d.read(0, [0])


def test_a_time_in_whole_seconds_is_compared_in_seconds(tmp_path):
    """An object store's HEAD gives whole seconds where its listing gave milliseconds: the same
    file, not a changed one; another second is a change."""
    directory = shards(tmp_path / "d", counts=(10,))
    d = Dataset.from_path("web", directory)
    reader, size = d.reader, int(d.raw_bytes()[0])
    listed = int(reader.shards.mtimes[0])
    whole = listed // 10**9 * 10**9
    reader.shards.mtimes[0] = whole + 123 * 10**6  # as a listing in milliseconds gives it
    reader.check_identity(0, pafs.FileInfo("x", pafs.FileType.File, size=size, mtime=whole / 1e9))
    with pytest.raises(ShardChangedError, match="the file changed"):
        reader.check_identity(0, pafs.FileInfo("x", pafs.FileType.File, size=size, mtime=whole / 1e9 + 1))
    with pytest.raises(ShardChangedError, match="the file changed"):  # both with fractions: compared exactly
        reader.check_identity(0, pafs.FileInfo("x", pafs.FileType.File, size=size, mtime=(whole + 5 * 10**6) / 1e9))
