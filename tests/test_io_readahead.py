"""Readahead: the same stream, every piece loaded ahead is read, memory under the bound."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon import Pipeline, StaticMixtureWorkSource
from zephon.io import Dataset
from zephon.io.faults import faulty_filesystem
from zephon.runtime._stream import ItemStream, initial_entries

FS, CALLS = faulty_filesystem(pafs.LocalFileSystem())  # not a local disk: pieces are ranged reads


def write(directory, counts, fmt):
    os.makedirs(directory, exist_ok=True)
    start = 0
    for i, count in enumerate(counts):
        ids = np.arange(start, start + count)
        data = pa.table({"id": ids, "text": [f"{i}:{j}" * 3 for j in ids]})
        path = os.path.join(directory, f"{i:03d}.{fmt}")
        if fmt == "parquet":
            pq.write_table(data, path, row_group_size=6)
        elif fmt == "arrow":
            with pa.ipc.new_stream(path, data.schema) as writer:
                for batch in data.to_batches(max_chunksize=5):
                    writer.write_batch(batch)
        else:
            with open(path, "w") as file:
                file.writelines(json.dumps(r) + "\n" for r in data.to_pylist())
        start += count
    return str(directory)


def stream(pipeline, lanes, replicas, entries=None):
    entries = entries or initial_entries(pipeline.source, lanes, replicas)
    return ItemStream(pipeline, lanes, replicas, entries, block=7)


@settings(max_examples=20, deadline=None)
@given(counts=st.lists(st.integers(25, 40), min_size=1, max_size=4), fmt=st.sampled_from(["parquet", "arrow", "jsonl"]),
       chunk=st.integers(3, 25), replicas=st.integers(1, 3), bound=st.sampled_from([600, 4000, 1 << 20]),
       cut=st.integers(0, 60), seed=st.integers(0, 9))
def test_readahead_changes_nothing_reads_all_it_loads_and_stays_under_its_bound(
        tmp_path_factory, counts, fmt, chunk, replicas, bound, cut, seed):
    from zephon.io import _jsonl

    root = tmp_path_factory.mktemp("r")
    directory = write(root / "d", counts, fmt)
    old, _jsonl.PIECE_BYTES = _jsonl.PIECE_BYTES, 200  # several spans per JSONL file
    try:
        dataset = Dataset.from_path("d", directory, filesystem=FS, catalog_dir=root / "c")
        source = StaticMixtureWorkSource([dataset], {"d": 1}, chunk_size=chunk, seed=seed, shuffle_within_shard=True)
        plain, ahead = Pipeline(source, prefetch_bytes=0), Pipeline(source, prefetch_bytes=bound, prefetch_threads=3)
        lanes = list(range(replicas))
        expected = list(stream(plain, lanes, replicas))
        first = stream(ahead, lanes, replicas)
        head = [next(first) for _ in range(min(cut, len(expected)))]
        first._mux.readahead.close()  # a stream given up: what it loaded ahead is withdrawn
        assert first._mux.readahead.stats()["bytes_held"] == 0
        resumed = stream(ahead, lanes, replicas, first.entries())
        got = head + list(resumed)
    finally:
        _jsonl.PIECE_BYTES = old
    assert got == expected
    stats = resumed._mux.readahead.stats()
    assert stats["pieces"] == stats["used"] and stats["errors"] == 0  # loaded ahead = read from there
    assert stats["peak_bytes"] <= bound and stats["bytes_held"] == 0


def test_readahead_is_on_for_remote_data_only_unless_asked(tmp_path):
    directory = write(tmp_path / "d", [10], "parquet")
    local = Dataset.from_path("d", directory, catalog_dir=tmp_path / "c")
    remote = Dataset.from_path("d", directory, filesystem=FS, catalog_dir=tmp_path / "c")
    source = StaticMixtureWorkSource([local], {"d": 1}, chunk_size=4)
    assert Pipeline(source).prefetch_bytes == 0 and Pipeline(source).readahead() is None
    assert Pipeline(source, prefetch_bytes=1000).prefetch_bytes == 1000
    assert Pipeline(StaticMixtureWorkSource([remote], {"d": 1}, chunk_size=4)).prefetch_bytes > 0
    for bad in ({"prefetch_bytes": -1}, {"prefetch_threads": 0}, {"prefetch_bytes": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Pipeline(source, **bad)


EXIT_CHECK = """
import atexit, sys, threading
def check():  # registered before zephon's own handlers, so it runs after them
    from zephon.io import retry
    alive = [t.name for t in threading.enumerate() if t.name == "zephon-readahead"]
    print("readahead threads", len(alive), "reads running", retry._POOL._busy, flush=True)
atexit.register(check)
import pyarrow.fs as pafs
from zephon import Pipeline, StaticMixtureWorkSource
from zephon.io import Dataset
from zephon.io.faults import faulty_filesystem
from zephon.runtime._stream import ItemStream, initial_entries
fs, _ = faulty_filesystem(pafs.LocalFileSystem(), latency_s=0.05)
dataset = Dataset.from_path("d", sys.argv[1], filesystem=fs, catalog_dir=sys.argv[2])
source = StaticMixtureWorkSource([dataset], {"d": 1}, chunk_size=40, seed=0, shuffle_within_shard=True)
pipeline = Pipeline(source, prefetch_bytes=1 << 20, prefetch_threads=3)
stream = ItemStream(pipeline, [0, 1], 2, initial_entries(pipeline.source, [0, 1], 2), block=7)
next(stream)  # the readahead has its threads loading the lanes' next pieces
if sys.argv[3] == "dropped":
    import gc
    del stream
    gc.collect()  # the readahead is closed without waiting: its threads end their loads
"""


@pytest.mark.parametrize("stream", ["open", "dropped"])
def test_exit_waits_for_the_readahead_and_reads_in_progress(tmp_path, stream):
    """A daemon thread that comes back from pyarrow while the interpreter shuts down aborts the
    process: at exit every readahead's threads stop and the reads in progress end first."""
    import subprocess
    import sys

    directory = write(tmp_path / "d", [40] * 6, "parquet")
    done = subprocess.run([sys.executable, "-c", EXIT_CHECK, directory, str(tmp_path / "c"), stream],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "readahead threads 0 reads running 0"
