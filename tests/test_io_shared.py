"""The store of decoded pieces that DataLoader workers share: across real processes each piece
is decoded once and every process gets it whole; a publisher that died, a piece that cannot be
written and a full store cost a second decoding at most, counted and said; the loader's batches
are the same with the store as without it, and the store is gone when the iteration ends."""
from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon.io import _shared
from zephon.io import PieceStore
from zephon.io._shared import COUNTERS, piece_name

NAMES = [f"piece{i}" for i in range(12)]


def _table(name: str) -> pa.Table:
    n = int(name[5:]) + 1
    return pa.table({"id": np.arange(n, dtype=np.int64), "text": [f"{name}:{i}" * (i % 3) for i in range(n)]})


def _read_all(store: PieceStore, reader: int, log: str, order_seed: int) -> bool:
    """What a worker does: get every piece (in its own order), logging each load it runs;
    whether each piece it got is the one loaded."""
    pieces = store.open(reader)

    def load(name: str):
        with open(log, "a") as file:
            file.write(name + "\n")
        table = _table(name)
        return table, table.nbytes

    order = np.random.default_rng(order_seed).permutation(len(NAMES))
    return all(pieces.get(NAMES[k], lambda k=k: load(NAMES[k]))[0].equals(_table(NAMES[k])) for k in order)


def _worker(store: PieceStore, reader: int, log: str, out) -> None:
    out.put((reader, _read_all(store, reader, log, reader)))


def test_processes_that_want_the_same_pieces_decode_each_once_and_all_get_it_whole(tmp_path):
    readers = 4
    store = PieceStore.make(readers, 1 << 30, root=str(tmp_path))
    assert store is not None
    log = str(tmp_path / "loads.log")
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    workers = [context.Process(target=_worker, args=(store, r, log, out)) for r in range(readers)]
    for worker in workers:
        worker.start()
    results = dict(out.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
    assert results == dict.fromkeys(range(readers), True)
    with open(log) as file:
        loads = file.read().split()
    assert sorted(loads) == sorted(NAMES)  # each piece decoded by exactly one process
    counts = store.counts()
    assert counts["published"] == len(NAMES) and counts["unshared"] == 0
    assert counts["shared"] == (readers - 1) * len(NAMES)
    for name in NAMES:  # what the others read is what was loaded
        assert _shared._read(os.path.join(store.directory, name + ".arrow"))[0].equals(_table(name))
    store.remove()
    assert not os.path.exists(store.directory) and store.counts() == {}


def test_a_publisher_that_died_holding_the_lock_costs_one_decoding(tmp_path):
    store = PieceStore.make(1, None, root=str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with open(os.path.join(store.directory, "p.arrow.lock"), "w") as file:
        file.write(dead.stdout.strip())
    table, _ = store.open(0).get("p", lambda: (_table("piece3"), 1))
    assert table.equals(_table("piece3"))
    assert store.counts()["waited"] == 1 and store.counts()["published"] == 1
    assert sorted(os.listdir(store.directory)) == ["counters", "p.arrow"]


@pytest.mark.parametrize("error, later, said", [(OSError(28, "No space left on device"), "unshared", True),
                                                (FileNotFoundError(2, "store removed"), "unshared", False),
                                                (pa.ArrowInvalid("no IPC for this type"), "published", True)])
def test_a_piece_that_cannot_be_written_stays_with_its_reader_counted_and_said(tmp_path, monkeypatch, caplog,
                                                                                 error, later, said):
    store = PieceStore.make(1, None, root=str(tmp_path))
    pieces = store.open(0)
    writer = pa.ipc.new_file

    def failing(sink, schema):
        monkeypatch.setattr(pa.ipc, "new_file", writer)  # the first write fails, later ones may run
        raise error

    monkeypatch.setattr(pa.ipc, "new_file", failing)
    with caplog.at_level(logging.WARNING, logger="zephon"):
        table, _ = pieces.get("a", lambda: (_table("piece4"), 7))
    assert table.equals(_table("piece4"))
    assert ("cannot share a decoded piece" in caplog.text) == said  # a removed store: the iteration ended
    assert sorted(os.listdir(store.directory)) == ["counters"]  # no part file, no lock left behind
    table, _ = pieces.get("b", lambda: (_table("piece5"), 7))
    assert table.equals(_table("piece5"))
    counts = store.counts()
    assert counts["unshared"] == (2 if later == "unshared" else 1)
    assert counts["published"] == (0 if later == "unshared" else 1)


def test_a_reader_removes_its_oldest_pieces_once_the_store_is_over_its_bound(tmp_path):
    store = PieceStore.make(2, 1, root=str(tmp_path))
    pieces = store.open(1)
    for name in NAMES[:5]:
        pieces.get(name, lambda name=name: (_table(name), 1))
    assert sorted(os.listdir(store.directory)) == ["counters", NAMES[4] + ".arrow"]  # the newest stays
    counts = store.counts()
    assert counts["published"] == 5
    assert counts["bytes"] - counts["evicted"] == os.path.getsize(os.path.join(store.directory, NAMES[4] + ".arrow"))
    assert pieces.counts[0].tolist() == [0] * len(COUNTERS)  # only its own row counts
    with pytest.raises(ValueError, match="reader 2 is not one of the store's 2"):
        store.open(2)


def test_stores_of_processes_that_ended_are_swept_and_a_missing_root_means_no_store(tmp_path, caplog):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"{_shared.PREFIX}{ended.stdout.strip()}-x"
    stale.mkdir()
    mine = PieceStore.make(2, None, root=str(tmp_path))
    assert not stale.exists() and mine is not None and os.path.isdir(mine.directory)
    assert PieceStore.make(2, None, root=str(tmp_path)) is not None  # a live process's stores stay
    assert os.path.isdir(mine.directory) and 0 < mine.max_bytes
    with caplog.at_level(logging.DEBUG, logger="zephon"):
        assert PieceStore.make(2, None, root=str(tmp_path / "absent")) is None
    assert "decode on their own" in caplog.text


@given(st.lists(st.one_of(st.text(max_size=4), st.integers(), st.none()), min_size=1, max_size=4),
       st.integers(0, 3))
def test_piece_names_are_file_names_that_differ_when_any_part_does(parts, k):
    name = piece_name(*parts)
    assert name == piece_name(*parts) and name.isalnum() and len(name) == 32
    changed = list(parts)
    changed[k % len(parts)] = ("x", changed[k % len(parts)])
    assert piece_name(*changed) != name


def test_loader_batches_are_the_same_with_the_store_and_it_goes_at_the_end(tmp_path, monkeypatch, caplog):
    pytest.importorskip("torch")
    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon.torch import _bundles

    for name, rows in (("a", 300), ("b", 200)):
        (tmp_path / name).mkdir()
        for s in range(3):
            pq.write_table(pa.table({"text": [f"{name}{s}-{i}" for i in range(rows)]}), tmp_path / name / f"{s}.parquet",
                           row_group_size=32)
    monkeypatch.setattr(_shared, "ROOT", str(tmp_path))

    def batches(workers: int, again: int = 0) -> tuple[list[tuple[list[str], list[list[int]]]], list[Any]]:
        """The batches, and ``stats()["shared_decoding"]`` after the 5th batch and at the end
        (``again``: from that batch on, a new ``iter(loader)`` goes on)."""
        datasets = [Dataset.from_path(n, tmp_path / n, cache_dir=tmp_path / "c") for n in "ab"]
        source = StaticMixtureWorkSource(datasets, {"a": 2, "b": 1}, chunk_size=64, shuffle_within_shard=True, seed=3)
        loader = zt.DataLoader(Pipeline(source, columns=["text"]), batch_size=16, num_workers=workers,
                               canonical_replicas=4)
        out, said = [], []
        for k, b in enumerate(itertools.islice(loader, again or None)):
            out.append((b["text"], b["_sample_id"].tolist()))
            if k == 4:
                said.append(loader.stats()["shared_decoding"])
        out += [(b["text"], b["_sample_id"].tolist()) for b in (loader if again else ())]
        return out, said + [loader.stats()["shared_decoding"]]

    with caplog.at_level(logging.DEBUG, logger="zephon"):
        shared, (early, counts) = batches(2)
    said = [r.getMessage() for r in caplog.records if "from each other's" in r.getMessage()]
    assert len(said) == 1 and "kept 0 unshared" in said[0] and " read 0 more" not in said[0], said
    assert f"decoded {counts['decoded']} row groups, read {counts['shared']} more" in said[0], (said, counts)
    groups = sum(pq.ParquetFile(f).num_row_groups for f in tmp_path.glob("?/*.parquet"))
    assert counts["decoded"] >= groups and counts["unshared"] == 0  # every row group at least once
    assert early is not None and all(early[k] <= counts[k] for k in counts), (early, counts)  # the live store's
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(_shared.PREFIX)]  # removed at the end
    # the first iteration's store is counted, and removed, when a second starts (which needs every row group)
    again, (_, both) = batches(2, again=9)
    assert again == shared
    assert both["decoded"] >= groups + early["decoded"], (both, early)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(_shared.PREFIX)]
    assert batches(0)[1] == [None, None]  # one reader: nothing to share, and stats() says so
    monkeypatch.setattr(_bundles.Plan, "share_pieces", lambda self, readers: None)
    assert batches(2) == (shared, [None, None])
