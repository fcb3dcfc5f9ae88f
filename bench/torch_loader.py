"""zephon torch benchmark: DataLoader throughput (pointers, Parquet), checkpoint size and restore time.

``python bench/torch_loader.py`` runs the full benchmark (a minute or two, plus about 20 s of
data generation on the first run); ``--quick`` a smoke run; ``--json PATH`` also writes the
results. Figures are medians of at least five repeats; ratios are medians of per-repeat
ratios whose two sides ran back to back in the same repeat. Targets are informational: the
script always exits 0. Needs the ``zephon[torch]`` extra.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Row, median_ratio, paired, table  # noqa: E402

import zephon.torch as zt  # noqa: E402
from zephon import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon.runtime import make_state  # noqa: E402
from zephon.runtime._state import dataset_fingerprints  # noqa: E402

CHUNK_SIZE = 16384
SEED = 7
BATCH = 256
SHARDS = {"a": (1000, 10_000), "b": (500, 20_000), "c": (200, 5_000)}  # name: (shards, rows), as bench/core.py
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}
PARQUET = {"files": 24, "rows": 12_000, "row_group": 4096}  # id int64 + 200-999 bytes of text per row


@dataclass(frozen=True)
class Settings:
    repeats: int  # repeats per figure (the median is reported)
    batches: int  # pointer batches timed per repeat
    parquet_files: int  # Parquet files read per repeat (of PARQUET["files"])
    lanes_for_size: int  # lanes of the checkpoint-size figure


FULL = Settings(repeats=7, batches=40_000, parquet_files=24, lanes_for_size=1024)
QUICK = Settings(repeats=5, batches=8_000, parquet_files=8, lanes_for_size=1024)


# -- pointers --------------------------------------------------------------------------------


def count_source() -> StaticMixtureWorkSource:
    datasets = [Dataset.from_counts(name, np.full(shards, rows, dtype=np.int64))
                for name, (shards, rows) in SHARDS.items()]
    return StaticMixtureWorkSource(datasets, WEIGHTS, chunk_size=CHUNK_SIZE, seed=SEED, stop_after_passes=None,
                                   exhausted_policy="repeat")


def source_rate(samples: int) -> float:
    """Iterating the source directly: lane 0 of 1, each chunk's read order as arrays."""
    lane = count_source().clone_for_lane(0, 1)
    start, n = time.perf_counter(), 0
    while n < samples:
        pointers, _ = lane.next_chunk().read_order()
        n += len(pointers)
    return n / (time.perf_counter() - start)


def loader_rate(batches: int, workers: int, default_lanes: bool = False) -> float:
    """zt.DataLoader(batch_size=256) over count-only datasets; timed from the first batch on.

    One lane per reader, or (``default_lanes``) the default ``canonical_replicas`` (8 per reader)."""
    loader = zt.DataLoader(Pipeline(count_source()), batch_size=BATCH, num_workers=workers,
                           canonical_replicas=None if default_lanes else max(1, workers))
    it = iter(loader)
    next(it)
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        n += next(it)["_sample_id"].shape[0]
    return n / (time.perf_counter() - start)


def pointer_rows(cfg: Settings) -> list[Row]:
    samples = cfg.batches * BATCH
    w2, lanes, w0, direct = paired(cfg.repeats, lambda: loader_rate(cfg.batches, 2),
                                   lambda: loader_rate(cfg.batches, 2, default_lanes=True),
                                   lambda: loader_rate(cfg.batches, 0), lambda: source_rate(samples))
    lanes_ratio = median_ratio(lanes, w2)
    return [
        Row("pointers, DataLoader workers=2, batch 256", statistics.median(w2), "samples/s", ">= 5e6 samples/s",
            median_ratio(w2, direct), statistics.median(w2) >= 5e6, w2),
        Row("  same, default canonical_replicas (16 lanes)", statistics.median(lanes), "samples/s",
            ">= 80% of 2 lanes", lanes_ratio, lanes_ratio >= 0.8, lanes),
        Row("pointers, DataLoader workers=0, batch 256", statistics.median(w0), "samples/s", "",
            median_ratio(w0, direct), None, w0),
        Row("pointers, source directly (read_order)", statistics.median(direct), "samples/s", "(ratio base)",
            None, None, direct),
    ]


# -- Parquet ------------------------------------------------------------------------------------


def parquet_dir() -> Path:
    root = Path(os.environ.get("ZEPHON_BENCH_DATA", tempfile.gettempdir())) / "zephon-bench-torch"
    directory = root / f"parquet-{PARQUET['files']}x{PARQUET['rows']}"
    if (directory / "done").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(5000)])
    for f in range(PARQUET["files"]):
        ids = np.arange(f * PARQUET["rows"], (f + 1) * PARQUET["rows"], dtype=np.int64)
        lengths = rng.integers(40, 200, size=len(ids))
        texts = [" ".join(words[rng.zipf(1.3, n) % len(words)]) for n in lengths]
        pq.write_table(pa.table({"id": ids, "text": texts}), directory / f"{f:04d}.parquet",
                       row_group_size=PARQUET["row_group"])
    (directory / "done").touch()
    return directory


def parquet_pipeline(directory: Path, files: int) -> Pipeline:
    dataset = Dataset.from_path("p", directory, cache_dir=directory.parent / "catalog")
    if files < dataset.shard_count():  # a prefix of the files: a count-limited dataset over the same shards
        dataset = _prefix(dataset, files)
    return Pipeline(StaticMixtureWorkSource([dataset], {"p": 1}, chunk_size=CHUNK_SIZE, seed=SEED,
                                            shuffle_within_shard=True))


def _prefix(dataset: Dataset, files: int) -> Dataset:
    directory = Path(dataset.catalog.directory)
    subset = directory.parent / f"{directory.name}-first{files}"
    if not subset.exists():
        subset.mkdir()
        for name in sorted(p.name for p in directory.glob("*.parquet"))[:files]:
            os.symlink(directory / name, subset / name)
    return Dataset.from_path("p", subset, cache_dir=directory.parent / "catalog")


class PyarrowRows(torch.utils.data.Dataset):
    """The hand-written baseline: a map-style Dataset over the same rows in the same order.

    ``order`` holds the ``(dataset, shard, offset)`` pointers in the order to read;
    ``__getitems__`` reads a batch with pyarrow (the shard's table cached, one ``take``)
    and returns it already batched, as fast a hand-written dataset as we could write.
    """

    def __init__(self, files: list[str], order: np.ndarray):
        self.files, self.order = files, order
        self._shard, self._table = -1, None

    def __len__(self) -> int:
        return len(self.order)

    def __getitems__(self, indices: list[int]) -> dict:
        pointers = self.order[indices]
        pieces = []
        for shard, a, b in _runs(pointers[:, 1]):
            if shard != self._shard:
                self._shard, self._table = shard, pq.read_table(self.files[shard])
            pieces.append(self._table.take(pa.array(pointers[a:b, 2])))
        table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        return {"id": torch.from_numpy(table.column("id").to_numpy().copy()),
                "text": table.column("text").to_pylist()}


def _runs(shards: np.ndarray) -> list[tuple[int, int, int]]:
    """``(shard, start, stop)`` of the runs of equal shard ids."""
    cuts = np.flatnonzero(shards[1:] != shards[:-1]) + 1
    starts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [len(shards)]])
    return [(int(shards[a]), int(a), int(b)) for a, b in zip(starts, stops)]


def _unbatched(batch: Any) -> Any:
    return batch


def zephon_parquet(pipeline: Pipeline, record: list | None = None) -> float:
    loader = zt.DataLoader(pipeline, batch_size=BATCH, num_workers=2, canonical_replicas=2)
    it = iter(loader)
    first = next(it)
    if record is not None:
        record.append(first["_sample_id"].numpy())
    start, rows = time.perf_counter(), 0
    for batch in it:
        rows += len(batch["id"])
        if record is not None:
            record.append(batch["_sample_id"].numpy())
    return rows / (time.perf_counter() - start)


def baseline_parquet(files: list[str], order: np.ndarray) -> float:
    loader = torch.utils.data.DataLoader(PyarrowRows(files, order), batch_size=BATCH, num_workers=2,
                                         collate_fn=_unbatched)
    it = iter(loader)
    next(it)
    start, rows = time.perf_counter(), 0
    for batch in it:
        rows += len(batch["id"])
    return rows / (time.perf_counter() - start)


def parquet_rows(cfg: Settings) -> list[Row]:
    pipeline = parquet_pipeline(parquet_dir(), cfg.parquet_files)
    dataset = pipeline.datasets_by_id[0]
    files = [dataset.path(int(s)) for s in dataset.ids()]
    record: list = []
    zephon_parquet(pipeline, record)  # the order zephon's loader yields: the baseline reads the same
    order = np.concatenate(record)
    z, base = paired(cfg.repeats, lambda: zephon_parquet(pipeline), lambda: baseline_parquet(files, order))
    ratio = median_ratio(z, base)
    label = f"{len(order):,} rows"
    return [
        Row(f"Parquet, zt.DataLoader workers=2 ({label})", statistics.median(z), "rows/s", ">= 80% of baseline",
            ratio, ratio >= 0.8, z),
        Row("Parquet, pyarrow map-style Dataset workers=2", statistics.median(base), "rows/s", "(ratio base)",
            None, None, base),
    ]


# -- checkpoints ------------------------------------------------------------------------------------


def checkpoint_rows(cfg: Settings) -> list[Row]:
    """A global checkpoint of 1024 lanes, each in its own chunk and mid-chunk.

    Lane ``l`` stands at the start of its chunk ``1 + l mod 5`` with ``(37 l) mod 16384``
    samples of it consumed: the entries a loader records (``zephon.runtime.make_state``),
    built directly because reading 1024 lanes that far through loaders would take minutes.
    """
    lanes = cfg.lanes_for_size
    pipeline = Pipeline(count_source())
    entries = {}
    for lane in range(lanes):
        clone = pipeline.source.clone_for_lane(lane, lanes)
        for _ in range(lane % 5):
            clone.next_chunk()
        entries[lane] = (clone.state_dict(), (37 * lane) % CHUNK_SIZE, 0)
    merged = make_state(lanes, entries, dataset_fingerprints(pipeline.datasets_by_id),
                        {"world_size": lanes, "ranks": list(range(lanes)), "mapping": "contiguous",
                         "num_workers": 0})
    path = Path(tempfile.mkdtemp()) / "checkpoint"
    zt.save_checkpoint(path, merged)
    size = path.stat().st_size

    def load_file() -> float:
        start = time.perf_counter()
        zt.load_checkpoint(path)
        return time.perf_counter() - start

    def restore(world: int) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            state = zt.load_checkpoint(path)
            loader = zt.DataLoader(pipeline, batch_size=BATCH, rank=0, world_size=world)
            loader.load_state_dict(state)
            next(iter(loader))
            return time.perf_counter() - start
        return run

    def validate_all() -> float:
        state = zt.load_checkpoint(path)
        loader = zt.DataLoader(pipeline, batch_size=BATCH)
        start = time.perf_counter()
        loader.load_state_dict(state)
        return time.perf_counter() - start

    read, one_lane, eight_lanes, everything = paired(cfg.repeats, load_file, restore(lanes), restore(lanes // 8),
                                                     validate_all)
    return [
        Row(f"checkpoint file, {lanes} lanes (global)", size, "B", "size ∝ lanes", None, None, [size]),
        Row("  per lane", size / lanes, "B", "", None, None, [size / lanes]),
        Row("load_checkpoint (read + verify)", statistics.median(read), "s", "", None, None, read),
        Row("restore: 1-lane rank, to first batch", statistics.median(one_lane), "s", "", None, None, one_lane),
        Row("restore: 8-lane rank, to first batch", statistics.median(eight_lanes), "s", "", None, None,
            eight_lanes),
        Row(f"load_state_dict, one rank, {lanes} lanes", statistics.median(everything), "s", "", None, None,
            everything),
    ]


# -- output -------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    print(f"zephon torch benchmark ({'quick' if args.quick else 'full'}): {cfg.repeats} repeats, medians; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs", flush=True)
    print(f"pointers: datasets {SHARDS}, weights {WEIGHTS}, chunk_size={CHUNK_SIZE}, repeat forever; "
          f"loaders use canonical_replicas = workers; ratio = loader / source iterated directly", flush=True)
    print(f"Parquet: {PARQUET} (first {cfg.parquet_files} files), shuffle_within_shard=True, one pass; "
          "baseline reads zephon's exact row order; ratio = zephon / baseline", flush=True)
    rows = pointer_rows(cfg) + parquet_rows(cfg) + checkpoint_rows(cfg)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": "quick" if args.quick else "full", "settings": asdict(cfg),
                                               "rows": [asdict(row) for row in rows]}, indent=2))


if __name__ == "__main__":
    main()
