"""The shard catalog: built once, cached atomically, reused, invalidated, fingerprinted (issue #4)."""
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.io import Dataset, ShardChangedError, catalog
from zephon.io.progress import Progress


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch, tmp_path):
    monkeypatch.delenv("ZEPHON_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(catalog, "RACY_NS", 0)  # trust files written just before a build (see test_racy_...)


def parquet(directory, name, ids):
    os.makedirs(directory, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), os.path.join(directory, name))


def jsonl(directory, name, ids):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "w") as file:
        file.writelines(json.dumps({"id": i}) + "\n" for i in ids)


def same(a, b):
    assert a.ids().tolist() == b.ids().tolist() and a.counts().tolist() == b.counts().tolist()
    assert a.raw_bytes().tolist() == b.raw_bytes().tolist() and a.fingerprint() == b.fingerprint()
    assert a.columns() == b.columns()


@pytest.mark.parametrize("write", [parquet, jsonl])
def test_the_catalog_is_cached_outside_the_data_and_reused(tmp_path, write):
    for i in range(3):
        write(tmp_path / "d", f"p{i}", list(range(i * 10, i * 10 + i + 1)))
    for i in range(3):
        os.rename(tmp_path / "d" / f"p{i}", tmp_path / "d" / f"p{i}.{'parquet' if write is parquet else 'jsonl'}")
    before = sorted(os.listdir(tmp_path / "d"))
    first = Dataset.from_path("d", tmp_path / "d")
    assert first.catalog.scanned == 3 and first.catalog.location.startswith(str(tmp_path / "xdg" / "zephon"))
    assert sorted(os.listdir(tmp_path / "d")) == before  # nothing is written into the data
    stored = json.loads(Path(first.catalog.location).read_text())
    assert stored["kind"] == "zephon.catalog" and stored["version"] == 2 and stored["rows"] == [1, 2, 3]
    again = Dataset.from_path("d", tmp_path / "d")
    assert again.catalog.scanned == 0
    same(first, again)
    assert again.read(2, [2]) == [{"id": 22}]
    leftovers = [n for n in os.listdir(tmp_path / "d") if ".tmp-" in n]
    assert leftovers == []


def test_changed_added_and_removed_files_rescan_only_what_changed(tmp_path):
    for i in range(4):
        jsonl(tmp_path / "d", f"{i}.jsonl", range(i + 1))
    base = Dataset.from_path("d", tmp_path / "d")
    jsonl(tmp_path / "d", "2.jsonl", range(7))
    changed = Dataset.from_path("d", tmp_path / "d")
    assert changed.catalog.scanned == 1 and changed.counts().tolist() == [1, 2, 7, 4]
    assert changed.fingerprint() != base.fingerprint()
    assert changed.read(3, [3]) == [{"id": 3}] and changed.read(2, [6]) == [{"id": 6}]
    jsonl(tmp_path / "d", "10.jsonl", range(2))  # sorts between 1 and 2
    added = Dataset.from_path("d", tmp_path / "d")
    assert added.catalog.scanned == 1 and added.counts().tolist() == [1, 2, 2, 7, 4]
    os.remove(tmp_path / "d" / "0.jsonl")
    removed = Dataset.from_path("d", tmp_path / "d")
    assert removed.catalog.scanned == 0 and removed.counts().tolist() == [2, 2, 7, 4]
    assert removed.read(0, [1]) == [{"id": 1}] and removed.read(3, [0]) == [{"id": 0}]
    sidecars = [n for n in os.listdir(tmp_path / "xdg" / "zephon") if n.endswith(".index.npy")]
    assert len(sidecars) == 1  # stale line indexes are removed


def test_the_fingerprint_follows_content_not_mtimes(tmp_path):
    parquet(tmp_path / "p", "a.parquet", [1, 2, 3])
    jsonl(tmp_path / "j", "b.jsonl", [1, 2])
    p, j = Dataset.from_path("p", tmp_path / "p"), Dataset.from_path("j", tmp_path / "j")
    shutil.copytree(tmp_path / "p", tmp_path / "p2", copy_function=shutil.copy)  # new mtimes, no catalog
    assert Dataset.from_path("p", tmp_path / "p2").fingerprint() == p.fingerprint()
    os.utime(tmp_path / "j" / "b.jsonl", ns=(1, 1))
    touched = Dataset.from_path("j", tmp_path / "j")
    assert touched.catalog.scanned == 1 and touched.fingerprint() == j.fingerprint()
    jsonl(tmp_path / "j", "b.jsonl", [1, 3])  # same size, new content
    os.utime(tmp_path / "j" / "b.jsonl", ns=(2, 2))
    assert Dataset.from_path("j", tmp_path / "j").fingerprint() != j.fingerprint()
    parquet(tmp_path / "p", "a.parquet", [1, 2, 4])
    assert Dataset.from_path("p", tmp_path / "p").fingerprint() != p.fingerprint()
    os.rename(tmp_path / "p" / "a.parquet", tmp_path / "p" / "z.parquet")
    assert Dataset.from_path("p", tmp_path / "p").fingerprint() not in (p.fingerprint(), None)


def test_racy_entries_written_during_a_build_are_scanned_again(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog, "RACY_NS", 2 * 10**9)
    jsonl(tmp_path / "d", "a.jsonl", [1, 2])
    jsonl(tmp_path / "d", "b.jsonl", [5])
    old = time.time_ns() - 10 * 10**9
    os.utime(tmp_path / "d" / "b.jsonl", ns=(old, old))
    first = Dataset.from_path("d", tmp_path / "d")
    info = os.stat(tmp_path / "d" / "a.jsonl")
    jsonl(tmp_path / "d", "a.jsonl", [3, 4])  # same size, and (as within one timestamp tick) the same mtime
    os.utime(tmp_path / "d" / "a.jsonl", ns=(info.st_atime_ns, info.st_mtime_ns))
    again = Dataset.from_path("d", tmp_path / "d")
    assert again.catalog.scanned == 1 and again.read(0, [0]) == [{"id": 3}]
    assert again.fingerprint() != first.fingerprint()


def test_count_only_and_in_memory_datasets_have_no_fingerprint():
    d = Dataset.from_counts("d", [3, 4])
    assert d.fingerprint() is None and d.raw_bytes().tolist() == [0, 0] and d.cache_info() is None
    r = Dataset.from_records("r", [[{"a": 1}], ["héllo", b"xyz"]])
    assert r.fingerprint() is None and r.columns() is None
    assert r.raw_bytes().tolist() == [len('{"a": 1}\n'), len("héllo".encode()) + 3]  # encoded sizes
    d.configure_cache(max_shards=3)  # no-op without a cache
    d.clear_cache()


def test_cache_dir_and_the_environment_variable_move_the_catalog(tmp_path, monkeypatch):
    jsonl(tmp_path / "d", "a.jsonl", [1, 2])
    d = Dataset.from_path("d", tmp_path / "d", cache_dir=tmp_path / "cache")
    assert os.path.dirname(d.catalog.location) == str(tmp_path / "cache")
    assert not os.path.exists(tmp_path / "d" / catalog.CATALOG_NAME)
    assert Dataset.from_path("d", tmp_path / "d", cache_dir=tmp_path / "cache").catalog.scanned == 0
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "env"))
    e = Dataset.from_path("d", tmp_path / "d")
    assert os.path.dirname(e.catalog.location) == str(tmp_path / "env") and e.catalog.scanned == 1
    assert Dataset.from_path("d", tmp_path / "d").catalog.scanned == 0
    same(d, e)


def test_read_only_data_works_and_an_unwritable_cache_warns(tmp_path, monkeypatch):
    jsonl(tmp_path / "d", "a.jsonl", [1, 2])
    os.chmod(tmp_path / "d", 0o555)
    try:
        d = Dataset.from_path("d", tmp_path / "d")
        assert d.catalog.location.startswith(str(tmp_path / "xdg" / "zephon")) and d.read(0, [1]) == [{"id": 2}]
        assert Dataset.from_path("d", tmp_path / "d").catalog.scanned == 0
    finally:
        os.chmod(tmp_path / "d", 0o755)
    (tmp_path / "blocked").write_text("a file where a directory should be")
    with pytest.warns(RuntimeWarning, match="could not cache the catalog"):
        u = Dataset.from_path("d", tmp_path / "d", cache_dir=tmp_path / "blocked" / "sub")
    assert u.catalog.location is None and u.read(0, [1]) == [{"id": 2}]


@pytest.mark.parametrize("damage", ["garbage", "version", "format", "rows", "sidecar"])
def test_a_damaged_catalog_is_ignored_and_rebuilt(tmp_path, damage):
    jsonl(tmp_path / "d", "a.jsonl", [1, 2, 3])
    d = Dataset.from_path("d", tmp_path / "d")
    path = Path(d.catalog.location)
    stored = json.loads(path.read_text())
    if damage == "garbage":
        path.write_text("{not json")
    elif damage == "sidecar":
        os.remove(path.parent / stored["index"])
    else:
        stored.update({"version": 99} if damage == "version" else {"format": "parquet"} if damage == "format"
                      else {"rows": [1, 2]})
        path.write_text(json.dumps(stored))
    again = Dataset.from_path("d", tmp_path / "d")
    assert again.catalog.scanned == 1 and again.read(0, [2]) == [{"id": 3}]
    same(d, again)
    assert Dataset.from_path("d", tmp_path / "d").catalog.scanned == 0


def test_the_progress_bar_is_drawn_when_asked_and_silent_otherwise(tmp_path, capsys):
    for i in range(3):
        parquet(tmp_path / "d", f"{i}.parquet", [i])
    Dataset.from_path("d", tmp_path / "d", progress=True, cache_dir=tmp_path / "c1")
    err = capsys.readouterr().err
    assert "cataloging 'd' (3 parquet files)" in err and "3/3 (100%" in err and err.endswith("\n")
    Dataset.from_path("d", tmp_path / "d", cache_dir=tmp_path / "c2")  # stderr is not a terminal here
    Dataset.from_path("d", tmp_path / "d", progress=True, cache_dir=tmp_path / "c2")  # reused: nothing to scan
    assert "cataloging" not in capsys.readouterr().err.replace("0/0", "")


def test_progress_shows_on_a_terminal_only_after_a_delay(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    stream = Terminal()
    bar = Progress(10, "quick", None, stream)
    bar.advance(10)
    bar.close()
    assert stream.getvalue() == ""
    clock = iter([0.0, 5.0, 5.0])
    monkeypatch.setattr("zephon.io.progress.time.perf_counter", lambda: next(clock))
    slow = Progress(10, "slow", None, stream)
    slow.advance(4)
    slow.close()
    assert "slow [" in stream.getvalue() and "4/10 (40%" in stream.getvalue()


@settings(max_examples=25)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=6), st.sampled_from(["parquet", "jsonl"]),
       st.lists(st.tuples(st.sampled_from(["edit", "add", "remove", "touch"]), st.integers(0, 7)), max_size=3))
def test_a_reused_or_updated_catalog_equals_a_fresh_build(counts, fmt, edits):
    catalog.RACY_NS = 2 * 10**9  # the real rule: same-size edits within a timestamp tick are caught
    write = parquet if fmt == "parquet" else jsonl
    old = time.time_ns() - 100 * 10**9
    with tempfile.TemporaryDirectory() as folder:
        data, fresh = os.path.join(folder, "d"), os.path.join(folder, "fresh")
        for i, n in enumerate(counts):
            write(data, f"{i:02d}.{fmt}", range(n))
            os.utime(os.path.join(data, f"{i:02d}.{fmt}"), ns=(old, old))
        assert Dataset.from_path("d", data).catalog.scanned == len(counts)
        for action, i in edits:
            name = os.path.join(data, f"{i:02d}.{fmt}")
            if action == "remove" and os.path.exists(name) and len(os.listdir(data)) > 2:
                os.remove(name)
            elif action == "touch" and os.path.exists(name):
                os.utime(name, ns=(old + i + 1, old + i + 1))
            elif action in ("edit", "add"):
                write(data, f"{i:02d}.{fmt}", range(100, 100 + i))
        reused = Dataset.from_path("d", data)
        built = Dataset.from_path("d", data, cache_dir=fresh)
        assert built.catalog.scanned == built.shard_count()
        assert reused.catalog.scanned <= len(edits)
        same(reused, built)
        for shard in range(reused.shard_count()):
            offsets = list(range(int(reused.counts()[shard])))
            assert reused.read(shard, offsets) == built.read(shard, offsets)


def test_a_published_catalog_is_used_on_read_only_data_and_never_written_implicitly(tmp_path, capsys):
    from zephon.cli import main

    jsonl(tmp_path / "d", "a.jsonl", [1, 2, 3])
    jsonl(tmp_path / "d", "b.jsonl", [4])
    assert main(["catalog", "build", str(tmp_path / "d"), "--out", str(tmp_path / "out" / "c.json")]) == 0
    assert "c.json" in capsys.readouterr().out and catalog.CATALOG_NAME not in os.listdir(tmp_path / "d")
    assert main(["catalog", "build", str(tmp_path / "d")]) == 0
    assert catalog.CATALOG_NAME in os.listdir(tmp_path / "d")
    os.chmod(tmp_path / "d", 0o555)
    try:
        d = Dataset.from_path("d", tmp_path / "d", catalog_dir=tmp_path / "fresh")
        assert d.catalog.location == str(tmp_path / "d" / catalog.CATALOG_NAME) and d.catalog.scanned == 0
        assert d.read(1, [0]) == [{"id": 4}] and not os.path.exists(tmp_path / "fresh")
    finally:
        os.chmod(tmp_path / "d", 0o755)
    jsonl(tmp_path / "d", "b.jsonl", [4, 5])  # the published catalog is stale: rebuilt into the cache, not there
    published = (tmp_path / "d" / catalog.CATALOG_NAME).read_bytes()
    e = Dataset.from_path("d", tmp_path / "d", catalog_dir=tmp_path / "fresh")
    assert e.counts().tolist() == [3, 2] and e.catalog.location.startswith(str(tmp_path / "fresh"))
    assert (tmp_path / "d" / catalog.CATALOG_NAME).read_bytes() == published
    assert main(["catalog", "build", "ftp://host/data"]) == 2
    assert "unsupported scheme 'ftp://'; supported: file://, s3://" in capsys.readouterr().err


def test_an_fsspec_filesystem_without_mtime_still_tells_a_rewritten_file(tmp_path):
    """fsspec's memory filesystem names a file's time ``created`` (s3fs ``LastModified``), where
    pyarrow reads ``mtime`` alone: a file rewritten with the same size must still be seen."""
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    memory.store.clear()

    def write(tag):
        with memory.open("/d/a.jsonl", "wb") as file:
            file.write("".join(json.dumps({"text": f"{tag}-{i}"}) + "\n" for i in range(4)).encode())
    write("old")
    first = Dataset.from_path("d", "/d", filesystem=memory, catalog_dir=tmp_path / "cache")
    assert first.read(0, [0]) == [{"text": "old-0"}]
    assert Dataset.from_path("d", "/d", filesystem=memory, catalog_dir=tmp_path / "cache").catalog.scanned == 0
    write("new")
    again = Dataset.from_path("d", "/d", filesystem=memory, catalog_dir=tmp_path / "cache")
    assert again.catalog.scanned == 1 and again.fingerprint() != first.fingerprint()
    assert again.read(0, [0]) == [{"text": "new-0"}]
    first.clear_cache()
    with pytest.raises(ShardChangedError, match="the file changed since its catalog"):
        first.read(0, [0])


def test_a_time_an_fsspec_filesystem_gives_in_a_form_not_understood_is_no_time():
    from zephon.io._fs import _FSSpecHandler
    made = _FSSpecHandler._create_file_info("a", {"size": 3, "type": "file", "LastModified": "Mon, 07 Dec 2026 10:00"})
    assert made.mtime is None and made.size == 3
    made = _FSSpecHandler._create_file_info("a", {"size": 3, "type": "file", "updated": "2026-12-07T10:00:00Z"})
    assert made.mtime_ns == 1796637600 * 10**9
