"""zephon io benchmark: fetch rate against a sequential pyarrow scan, cache memory, catalog times.

``python bench/datasets.py`` runs the full benchmark (a few minutes; the first run also generates
about 1.4 GB of Parquet and 200,000 tiny files under ``--data-dir``, default
``$ZEPHON_BENCH_DATA`` or ``/tmp/zephon-bench-io``, reused afterwards); ``--quick`` a smaller
smoke run; ``--json PATH`` also writes the results. Every figure is the median of several
repeats and every ratio the median of per-repeat ratios whose two sides ran back to back in
the same repeat. Targets are informational: the script always exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Row, median_ratio, paired, table  # noqa: E402

from zephon import StaticMixtureWorkSource  # noqa: E402
from zephon.io import Dataset, block_span, catalog, fetch, fetch_table  # noqa: E402

SEED = 11
MODES = {"within": {"shuffle_within_shard": True},
         "auto": {"shuffle_within_shard": True, "shuffle_block_size": "auto"}}
TARGETS = {"within": 0.5, "auto": 0.3}


@dataclass(frozen=True)
class Settings:
    """The data set and how much to measure."""

    files: int  # Parquet shards
    rows: int  # rows per shard
    row_group: int  # rows per row group
    repeats: int  # repeats per figure (medians reported)
    tiny: int  # tiny files for the catalog figures
    builds: int  # fresh catalog builds timed


FULL = Settings(files=64, rows=32_000, row_group=4096, repeats=5, tiny=100_000, builds=3)
QUICK = Settings(files=16, rows=8_000, row_group=2048, repeats=3, tiny=10_000, builds=2)


# -- data ------------------------------------------------------------------------------------


def text_pool(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` bytes of lowercase words (Zipf-distributed over a 30,000-word vocabulary)."""
    vocabulary = 30_000
    lengths = rng.integers(2, 11, vocabulary)
    letters = rng.integers(97, 123, int(lengths.sum())).astype(np.uint8)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    words = np.minimum(rng.zipf(1.2, size // 5) - 1, vocabulary - 1)
    word_lengths = lengths[words] + 1  # + a space
    total = int(word_lengths.sum())
    pool = np.full(total, 32, dtype=np.uint8)
    out_starts = np.concatenate(([0], np.cumsum(word_lengths)[:-1]))
    within = np.arange(total) - np.repeat(out_starts, word_lengths)
    word_of = np.repeat(np.arange(len(words)), word_lengths)
    letter = within < lengths[words][word_of]
    pool[letter] = letters[starts[words][word_of][letter] + within[letter]]
    return pool[:size]


def text_column(rng: np.random.Generator, pool: np.ndarray, n: int) -> pa.Array:
    """``n`` strings of 768..1279 bytes (about 1 KiB), each a random slice of ``pool``."""
    lengths = rng.integers(768, 1280, n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    offsets[1:] = np.cumsum(lengths)
    starts = rng.integers(0, len(pool) - 1280, n)
    data = pool[np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])]
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def ensure_parquet(folder: Path, cfg: Settings) -> Path:
    """The benchmark dataset (generated once): ``cfg.files`` files of ``cfg.rows`` rows (id, text)."""
    marker = folder / "done.json"
    spec = {"files": cfg.files, "rows": cfg.rows, "row_group": cfg.row_group, "seed": SEED}
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return folder
    print(f"generating {cfg.files} x {cfg.rows:,} rows of ~1 KiB text in {folder} (once)...", file=sys.stderr)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    pool = text_pool(rng, 16 << 20)
    for i in range(cfg.files):
        ids = np.arange(i * cfg.rows, (i + 1) * cfg.rows, dtype=np.int64)
        table = pa.table({"id": ids, "text": text_column(rng, pool, cfg.rows)})
        pq.write_table(table, folder / f"part-{i:05d}.parquet", row_group_size=cfg.row_group)
    marker.write_text(json.dumps(spec))
    return folder


def ensure_tiny(folder: Path, count: int, fmt: str) -> Path:
    """``count`` one-record files (generated once)."""
    marker = folder / "done.json"
    if marker.exists() and json.loads(marker.read_text()) == {"count": count, "fmt": fmt}:
        return folder
    print(f"generating {count:,} tiny {fmt} files in {folder} (once)...", file=sys.stderr)
    folder.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    for i in range(count):
        path = folder / f"part-{i:06d}.{fmt}"
        if fmt == "parquet":
            pq.write_table(pa.table({"id": [i], "text": [f"tiny record {i}"]}, schema=schema), path)
        else:
            path.write_text(json.dumps({"id": i, "text": f"tiny record {i}"}) + "\n")
    marker.write_text(json.dumps({"count": count, "fmt": fmt}))
    time.sleep(catalog.RACY_NS / 1e9)  # let the newest files age past the catalog's "racy" window
    return folder


# -- fetch -----------------------------------------------------------------------------------


def pointer_chunks(dataset: Dataset, mode: str) -> tuple[list[np.ndarray], int]:
    """One pass of ``StaticMixtureWorkSource([dataset], ...)`` as pointer arrays, and the block size."""
    source = StaticMixtureWorkSource([dataset], {dataset.name: 1}, seed=SEED, **MODES[mode])
    lane = source.clone_for_lane(0, 1)
    chunks = []
    while (chunk := lane.next_chunk()) is not None:
        chunks.append(np.ascontiguousarray(chunk.components[dataset.name]))
    return chunks, lane.config.datasets[0].block_size


def size_cache(dataset: Dataset, mode: str, block_size: int) -> int:
    """Bound the cache for the shuffle level (one shard, or the shards a block spans)."""
    shards = block_span(dataset.counts(), block_size if mode == "auto" else None)
    dataset.configure_cache(max_shards=shards, max_bytes=None)
    dataset.clear_cache()
    return shards


def scan_rate(files: list[Path], records: bool) -> float:
    """Rows/s of reading every file in order with ``ParquetFile.read()`` (``to_pylist()`` too if ``records``)."""
    rows = 0
    start = time.perf_counter()
    for path in files:
        table = pq.ParquetFile(path).read()
        if records:
            table.to_pylist()
        rows += table.num_rows
    return rows / (time.perf_counter() - start)


def fetch_rate(dataset: Dataset, chunks: list[np.ndarray], records: bool) -> float:
    """Rows/s of fetching every chunk (``fetch`` for dicts, else ``fetch_table``), from a cold cache."""
    dataset.clear_cache()
    datasets = {0: dataset}
    rows = 0
    start = time.perf_counter()
    for pointers in chunks:
        rows += len(fetch(datasets, pointers) if records else fetch_table(datasets, pointers))
    return rows / (time.perf_counter() - start)


def fetch_rows(cfg: Settings, folder: Path) -> list[Row]:
    """Fetch rates of both shuffle modes against the scan, as Arrow tables and as dicts."""
    dataset = Dataset.from_path("bench", folder)
    files = [Path(dataset.path(int(i))) for i in dataset.ids()]
    plans = {mode: pointer_chunks(dataset, mode) for mode in MODES}
    rows = []
    for records, label in ((False, "Arrow"), (True, "dicts")):
        measures = [lambda: scan_rate(files, records)]
        for mode, (chunks, block) in plans.items():
            def measure(chunks=chunks, mode=mode, block=block) -> float:
                size_cache(dataset, mode, block)
                return fetch_rate(dataset, chunks, records)
            measures.append(measure)
        base, *rates = paired(cfg.repeats, *measures)
        rows.append(Row(f"sequential scan ({label})", statistics.median(base), "rows/s", samples=base))
        for mode, samples in zip(MODES, rates):
            ratio = median_ratio(samples, base)
            target = TARGETS[mode]
            rows.append(Row(f"fetch, {mode} ({label})", statistics.median(samples), "rows/s",
                            f">={target:.0%} scan", ratio, ratio >= target, samples))
    return rows


def proc_status_mb(key: str) -> float:
    """A ``/proc/self/status`` memory field in MB (Linux only)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def decoded_bytes(path: str) -> int:
    """Arrow buffer bytes of a file's row groups decoded one by one (as the cache holds them)."""
    file = pq.ParquetFile(path)
    return sum(file.read_row_group(i).get_total_buffer_size() for i in range(file.metadata.num_row_groups))


def memory_child(folder: Path, mode: str) -> None:
    """Subprocess body: one pass of fetch_table in ``mode``; prints the cache and process peaks.

    The bound (``max_shards`` x the largest decoded shard) is computed after the pass, so
    that its reads do not move the RSS baseline.
    """
    dataset = Dataset.from_path("bench", folder)
    if mode == "scan":
        rss_before = proc_status_mb("VmRSS")
        scan_rate([Path(dataset.path(int(i))) for i in dataset.ids()], False)
        print(json.dumps({"rss": proc_status_mb("VmHWM") - rss_before,
                          "pool_peak": pa.default_memory_pool().max_memory() / 2**20}))
        return
    chunks, block = pointer_chunks(dataset, mode)
    shards = size_cache(dataset, mode, block)
    rss_before = proc_status_mb("VmRSS")
    pool_before = pa.total_allocated_bytes()
    for pointers in chunks:
        fetch_table({0: dataset}, pointers)
    info = dataset.cache_info()
    pool_peak = (pa.default_memory_pool().max_memory() - pool_before) / 2**20
    rss = proc_status_mb("VmHWM") - rss_before
    decoded = max(decoded_bytes(dataset.path(int(i))) for i in dataset.ids())
    print(json.dumps({"shards": shards, "bound": shards * decoded / 2**20, "peak": info["peak_bytes"] / 2**20,
                      "pool_peak": pool_peak, "rss": rss, "hits": info["hits"], "misses": info["misses"]}))


def memory_rows(folder: Path, quick: bool) -> list[Row]:
    """Cache peak (its own accounting), the bound it obeys, and process peaks, per mode and for the scan."""
    rows = []
    for mode in ["scan", *MODES]:
        command = [sys.executable, __file__, "--memory-child", mode, "--data-dir", str(folder.parent)]
        child = subprocess.run(command + (["--quick"] if quick else []), capture_output=True, text=True)
        if child.returncode:
            raise RuntimeError(f"memory child ({mode}) failed:\n{child.stderr[-3000:]}")
        got = json.loads(child.stdout.strip().splitlines()[-1])
        if mode == "scan":
            rows += [Row("Arrow pool peak, sequential scan", got["pool_peak"], "MB"),
                     Row("process RSS increase, sequential scan", got["rss"], "MB")]
            continue
        rows += [
            Row(f"cache peak, {mode} (max_shards={got['shards']})", got["peak"], "MB",
                f"<= {got['bound']:.0f} MB bound", None, got["peak"] <= got["bound"]),
            Row(f"Arrow pool peak, {mode}", got["pool_peak"], "MB"),
            Row(f"process RSS increase, {mode}", got["rss"], "MB"),
            Row(f"row groups decoded / hits, {mode}", got["misses"], "n", f"hits {got['hits']:,}"),
        ]
    return rows


# -- catalog ---------------------------------------------------------------------------------


def catalog_rows(cfg: Settings, root: Path) -> list[Row]:
    """Build (fresh cache directory each time) and reuse times of the tiny-file catalogs."""
    rows = []
    for fmt in ("parquet", "jsonl"):
        folder = ensure_tiny(root / f"tiny-{fmt}-{cfg.tiny}", cfg.tiny, fmt)
        with tempfile.TemporaryDirectory() as scratch:
            builds = []
            for b in range(cfg.builds):
                start = time.perf_counter()
                Dataset.from_path("tiny", folder, cache_dir=Path(scratch) / str(b))
                builds.append(time.perf_counter() - start)
            cache = Path(scratch) / str(cfg.builds - 1)
            Dataset.from_path("tiny", folder, cache_dir=cache)  # warm-up (also settles racy entries)
            reuses, rescanned = [], 0
            for _ in range(max(cfg.repeats, 5)):
                start = time.perf_counter()
                reused = Dataset.from_path("tiny", folder, cache_dir=cache)
                reuses.append(time.perf_counter() - start)
                rescanned += reused.catalog.scanned
            if rescanned:
                print(f"note: {rescanned} files were scanned again during the reuse runs", file=sys.stderr)
        rows.append(Row(f"catalog build, {cfg.tiny:,} tiny {fmt}", statistics.median(builds), "s", samples=builds))
        median = statistics.median(reuses)
        rows.append(Row(f"catalog reuse, {cfg.tiny:,} tiny {fmt}", median, "s", "well under 1 s", None,
                        median < 0.5, reuses))
    return rows


# -- output ------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller smoke run")
    parser.add_argument("--data-dir", default=os.environ.get("ZEPHON_BENCH_DATA", "/tmp/zephon-bench-io"),
                        help="where generated data is kept between runs (outside the repository)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--skip-catalog", action="store_true", help="skip the tiny-file catalog figures")
    parser.add_argument("--memory-child", choices=["scan", *MODES], help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    cfg = QUICK if args.quick else FULL
    root = Path(args.data_dir)
    folder = root / f"parquet-{cfg.files}x{cfg.rows}"
    if args.memory_child:
        memory_child(folder, args.memory_child)
        return
    ensure_parquet(folder, cfg)
    size = sum(f.stat().st_size for f in folder.glob("*.parquet"))
    print(f"zephon io benchmark ({'quick' if args.quick else 'full'}): {cfg.files} Parquet files x "
          f"{cfg.rows:,} rows (id int64, text ~1 KiB), row groups of {cfg.row_group:,} rows, "
          f"{size / 2**20:,.0f} MB on disk (snappy); {cfg.repeats} repeats, medians", flush=True)
    print("pointer order: one pass of StaticMixtureWorkSource([ds], {name: 1}, chunk_size=16384, "
          "shuffle_within_shard=True) [+ shuffle_block_size='auto']; cache max_shards = 1 (within) or "
          "block_span(counts, block) (auto), cold at the start of every repeat", flush=True)
    print("scan = ParquetFile(f).read() for every file in order (dicts: + to_pylist()); fetch = "
          "fetch_table (Arrow) or fetch (dicts) per chunk; ratio = median of per-repeat ratios\n", flush=True)
    rows = fetch_rows(cfg, folder)
    print(table(rows), flush=True)
    rows += memory_rows(folder, args.quick)
    if not args.skip_catalog:
        rows += catalog_rows(cfg, root)
    print("\n" + table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
