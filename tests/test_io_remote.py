"""Datasets in object storage: a real S3-compatible server (moto), read through pyarrow's S3 client."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from zephon import Pipeline, StaticMixtureWorkSource
from zephon.io import Dataset, ShardChangedError, fetch_table

from s3_server import s3_client, start_server


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))


def tables(counts):
    start = 0
    for count in counts:
        ids = np.arange(start, start + count)
        yield pa.table({"id": ids, "text": [f"row {i}" for i in ids]})
        start += count


def upload(url: str, bucket: str, local, counts=(30, 17, 25)):
    """The same shards locally (``local``) and in ``s3://bucket/{parquet,jsonl,arrow}``."""
    fs = s3_client(url)
    fs.create_dir(bucket)
    for fmt in ("parquet", "jsonl", "arrow"):
        os.makedirs(local / fmt, exist_ok=True)
        for i, table in enumerate(tables(counts)):
            name = f"part-{i:03d}.{fmt}"
            if fmt == "parquet":
                pq.write_table(table, local / fmt / name, row_group_size=8)
            elif fmt == "jsonl":
                (local / fmt / name).write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
            else:
                with pa.ipc.new_file(local / fmt / name, table.schema) as writer:
                    for batch in table.to_batches(max_chunksize=7):
                        writer.write_batch(batch)
            pafs.copy_files(str(local / fmt / name), f"{bucket}/{fmt}/{name}", destination_filesystem=fs)
    return fs


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "arrow"])
def test_every_fetch_from_object_storage_equals_the_local_copy(endpoint, tmp_path, fmt):
    upload(endpoint, f"fetch-{fmt}", tmp_path / "local")
    remote = Dataset.from_path("web", f"s3://fetch-{fmt}/{fmt}")
    local = Dataset.from_path("web", tmp_path / "local" / fmt)
    assert remote.counts().tolist() == local.counts().tolist() == [30, 17, 25]
    assert remote.fingerprint() == local.fingerprint() and remote.columns() == local.columns()
    assert remote.path(1) == f"s3://fetch-{fmt}/{fmt}/part-001.{fmt}"
    rng = np.random.default_rng(0)
    pointers = np.array([(0, s, rng.integers(local.counts()[s])) for s in rng.integers(3, size=60)])
    assert fetch_table({0: remote}, pointers).equals(fetch_table({0: local}, pointers))
    source = StaticMixtureWorkSource([remote], {"web": 1}, chunk_size=16, seed=5, shuffle_within_shard=True)
    expected = StaticMixtureWorkSource([local], {"web": 1}, chunk_size=16, seed=5, shuffle_within_shard=True)
    assert Pipeline(source).prefetch_bytes > 0  # readahead is on for object storage
    assert [item["id"] for item in Pipeline(source)] == [item["id"] for item in Pipeline(expected)]


def test_an_explicit_filesystem_and_a_published_catalog(endpoint, tmp_path, monkeypatch):
    from zephon.io import build_catalog, catalog

    monkeypatch.setattr(catalog, "RACY_NS", 0)  # trust objects written just before the build
    fs = upload(endpoint, "explicit", tmp_path / "local")
    d = Dataset.from_path("web", "explicit/parquet", filesystem=fs)
    assert d.counts().tolist() == [30, 17, 25] and d.read(2, [24]) == [{"id": 71, "text": "row 71"}]
    written = build_catalog("s3://explicit/jsonl")
    assert written == "s3://explicit/jsonl/.zephon-catalog.json"
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "empty-cache"))
    published = Dataset.from_path("web", "s3://explicit/jsonl")
    assert published.catalog.location == written and published.catalog.scanned == 0
    assert published.read(1, [16, 0]) == [{"id": 46, "text": "row 46"}, {"id": 30, "text": "row 30"}]
    assert not os.path.exists(tmp_path / "empty-cache")  # a usable published catalog is not copied


def test_a_changed_object_is_refused_on_resume_and_when_read(endpoint, tmp_path):
    fs = upload(endpoint, "changing", tmp_path / "local")
    d = Dataset.from_path("web", "s3://changing/parquet")
    source = StaticMixtureWorkSource([d], {"web": 1}, chunk_size=8, seed=1)
    lane = source.clone_for_lane(0, 1)
    lane.next_chunk()
    state = lane.state_dict()
    pq.write_table(pa.table({"id": np.arange(30) + 100, "text": ["changed"] * 30}), "changing/parquet/part-000.parquet",
                   filesystem=fs)
    with pytest.raises(ShardChangedError, match="'web', shard 0 .*s3://changing/parquet/part-000.parquet.*changed"):
        d.read(0, [0])
    again = Dataset.from_path("web", "s3://changing/parquet")
    assert again.fingerprint() != d.fingerprint()
    resumed = StaticMixtureWorkSource([again], {"web": 1}, chunk_size=8, seed=1).clone_for_lane(0, 1)
    with pytest.raises(ValueError, match="different configuration: datasets.*'data'"):
        resumed.load_state_dict(state)
    fs.delete_file("changing/parquet/part-001.parquet")
    with pytest.raises(ShardChangedError, match="'web', shard 1 .*part-001.parquet.*disappeared"):
        again.read(1, [0])


def test_a_missing_bucket_or_key_names_the_dataset_and_the_uri(endpoint, tmp_path):
    upload(endpoint, "present", tmp_path / "local", counts=(3,))
    with pytest.raises(FileNotFoundError, match="'web': s3://absent-bucket/data does not exist"):
        Dataset.from_path("web", "s3://absent-bucket/data")
    with pytest.raises(FileNotFoundError, match="'web': s3://present/no-such-prefix does not exist"):
        Dataset.from_path("web", "s3://present/no-such-prefix")
    with pytest.raises(ValueError, match="'web'.*s3://present holds no"):
        Dataset.from_path("web", "s3://present")


def test_a_refused_credential_names_the_dataset_and_the_uri(tmp_path):
    import urllib.request

    def require_auth_after(requests: str) -> None:  # moto's switch is process-wide: every server obeys it
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset-auth", data=requests.encode(),
                                                      method="POST", headers={"Content-Type": "text/plain"}))

    server, url = start_server()
    try:
        s3_client(url).create_dir("locked")
        require_auth_after("0")
        fs = pafs.S3FileSystem(endpoint_override=url, access_key="nobody", secret_key="wrong", region="us-east-1")
        with pytest.raises(OSError, match="'web'.*locked/data.*ACCESS_DENIED.*credentials"):
            Dataset.from_path("web", "s3://locked/data", filesystem=fs)
    finally:
        require_auth_after("inf")  # the later modules' servers take the test keys again
        server.stop()
