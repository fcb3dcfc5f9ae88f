"""zephon remote-storage benchmark: readahead against a filesystem with 20 ms per request.

``python bench/remote.py`` runs the full benchmark (about a minute, plus a few seconds of data
generation on the first run); ``--quick`` a smoke run; ``--json PATH`` also writes the
results. Figures are medians of at least five repeats (three with ``--quick``); ratios are
medians of per-repeat ratios whose sides ran back to back in the same repeat. Targets are
informational: the script always exits 0. Needs the ``zephon-mixtures[torch]`` extra.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Row, median_ratio, paired, table  # noqa: E402

import zephon.torch as zt  # noqa: E402
from zephon import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon.io.faults import faulty_filesystem  # noqa: E402

LATENCY_S = 0.020  # added to every request: stat, list, open, each read
DATA = {"rows": 8192, "row_group": 512}  # per file: id int64 + 100-300 bytes of text per row
CHUNK_SIZE, BATCH, SEED = 65536, 1024, 11  # a chunk spans 8 shards
PREFETCH_BYTES, THREADS = 64 << 20, 32


@dataclass(frozen=True)
class Settings:
    repeats: int
    files: int  # Parquet files (shards) read per pass


FULL = Settings(repeats=5, files=32)
QUICK = Settings(repeats=3, files=16)


def make_data(root: Path, files: int) -> Path:
    """``files`` Parquet files (generated once, reused while they match ``DATA``)."""
    directory = root / f"parquet-{files}x{DATA['rows']}-rg{DATA['row_group']}"
    if directory.exists() and len(list(directory.glob("*.parquet"))) == files:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = np.array(["storage", "latency", "request", "object", "shard", "chunk", "lane", "bucket", "zephon"])
    for i in range(files):
        ids = np.arange(i * DATA["rows"], (i + 1) * DATA["rows"])
        text = [" ".join(rng.choice(words, size=int(rng.integers(14, 40)))) for _ in ids]
        pq.write_table(pa.table({"id": ids, "text": text}), directory / f"part-{i:05d}.parquet",
                       row_group_size=DATA["row_group"])
    return directory


class _Peaks(logging.Handler):
    """Collects the readahead's closing statistics from the ``zephon`` logger."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.stats: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "readahead"):
            self.stats.append(record.readahead)


def one_pass(directory: Path, files: int, fs: Any, prefetch: int, catalog_dir: Path) -> float:
    """Rows per second of one pass of a within-shard shuffled stream through the DataLoader.

    The dataset is opened (its catalog loaded, the directory listed) outside the timed region."""
    dataset = Dataset.from_path("web", str(directory), filesystem=fs, catalog_dir=catalog_dir)
    source = StaticMixtureWorkSource([dataset], {"web": 1}, chunk_size=CHUNK_SIZE, seed=SEED,
                                     shuffle_within_shard=True)
    loader = zt.DataLoader(Pipeline(source, prefetch_bytes=prefetch, prefetch_threads=THREADS), batch_size=BATCH)
    rows, limit = 0, files * DATA["rows"]
    start = time.perf_counter()
    for batch in loader:
        rows += len(batch["id"])
        if rows >= limit:
            break
    elapsed = time.perf_counter() - start
    del loader
    return rows / elapsed


def run(settings: Settings, data_dir: Path) -> list[Row]:
    directory = make_data(data_dir, settings.files)
    catalog_dir = data_dir / "catalogs"
    slow, _ = faulty_filesystem(pafs.LocalFileSystem(), latency_s=LATENCY_S)
    peaks = _Peaks()
    logging.getLogger("zephon").addHandler(peaks)
    logging.getLogger("zephon").setLevel(logging.INFO)
    local, plain, ahead = paired(
        settings.repeats,
        lambda: one_pass(directory, settings.files, None, 0, catalog_dir),
        lambda: one_pass(directory, settings.files, slow, 0, catalog_dir),
        lambda: one_pass(directory, settings.files, slow, PREFETCH_BYTES, catalog_dir))
    gc.collect()  # closes the last readaheads (their statistics are logged)
    peak = max(s["peak_bytes"] for s in peaks.stats) if peaks.stats else 0.0
    median = statistics.median
    vs_local, vs_plain = median_ratio(ahead, local), median_ratio(ahead, plain)
    return [
        Row("local disk, no added latency", median(local), "rows/s", samples=local),
        Row("20 ms/request, no readahead", median(plain), "rows/s", samples=plain),
        Row("20 ms/request, readahead", median(ahead), "rows/s", target=">= 50% of local", ratio=vs_local,
            ok=vs_local >= 0.5, samples=ahead),
        Row("readahead / no readahead", vs_plain, "n", target=">= 5x", ok=vs_plain >= 5.0),
        Row("peak prefetch memory", peak / 2**20, "MB", target=f"<= {PREFETCH_BYTES >> 20} MB",
            ratio=peak / PREFETCH_BYTES, ok=peak <= PREFETCH_BYTES, samples=[s["peak_bytes"] for s in peaks.stats]),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (fewer files and repeats)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows (with raw samples) here")
    parser.add_argument("--data-dir", type=Path,
                        default=Path(os.environ.get("ZEPHON_BENCH_DATA", "/tmp/zephon-bench-io")) / "remote")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    rows = run(settings, args.data_dir)
    print(f"zephon remote benchmark: {settings.files} Parquet files x {DATA['rows']:,} rows, row groups of "
          f"{DATA['row_group']:,}, {LATENCY_S * 1e3:.0f} ms per request, chunk_size={CHUNK_SIZE}, batch {BATCH}, "
          f"prefetch_bytes={PREFETCH_BYTES >> 20} MiB, {THREADS} threads, {settings.repeats} repeats")
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
