"""zephon random-access benchmark: exact length and sample_id_at over a 10**6-chunk stream.

``python bench/random_access.py`` (``--quick`` for a smoke run). The stream is the core
benchmark's configuration (bench/core.py) made finite with ``stop_after_passes=492``: about
10**6 global chunks of 16384 pointers (1.6·10**10 samples). Medians of repeats; targets are
informational and the script always exits 0.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _common import Row, table
from core import CHUNK_SIZE, SEED, SHARDS, WEIGHTS

from zephon import Dataset, StaticMixtureWorkSource

PASSES = 492  # the slowest dataset (b) needs 2034 chunks a pass: about 10**6 chunks in all


def make_source() -> StaticMixtureWorkSource:
    """The template over the core benchmark's datasets, finite after PASSES passes."""
    datasets = [Dataset.from_counts(name, np.full(shards, rows, dtype=np.int64))
                for name, (shards, rows) in SHARDS.items()]
    return StaticMixtureWorkSource(datasets, WEIGHTS, chunk_size=CHUNK_SIZE, seed=SEED,
                                   stop_after_passes=PASSES)


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def length_rows(repeats: int) -> list[Row]:
    """Time of len() on a fresh source (the index walk), and the index size."""
    samples, source = [], None
    for _ in range(repeats):
        source = make_source()
        samples.append(timed(lambda: len(source)))
    index = source._stream_index()
    return [
        Row(f"len() over {index.chunks:,} chunks", statistics.median(samples), "s", "<1 s", None,
            statistics.median(samples) < 1.0, samples),
        Row("index memory per chunk (bytes)", index.nbytes / index.chunks, "B", "<=16", None,
            index.nbytes / index.chunks <= 16),
    ]


def lookup_rows(repeats: int, singles: int, batch: int) -> list[Row]:
    """Random lookups, one at a time and in one batched call."""
    source = make_source()
    length = len(source)
    rng = np.random.default_rng(0)
    single, batched = [], []
    for _ in range(repeats):
        indices = rng.integers(0, length, singles).tolist()
        single.append(singles / timed(lambda: [source.sample_id_at(i) for i in indices]))
        many = rng.integers(0, length, batch)
        batched.append(batch / timed(lambda: source.sample_ids_at(many)))
    return [
        Row("random sample_id_at, one at a time", statistics.median(single), "1/s", ">=200k/s", None,
            statistics.median(single) >= 2e5, single),
        Row(f"random sample_ids_at, batches of {batch:,}", statistics.median(batched), "1/s", ">=5M/s",
            None, statistics.median(batched) >= 5e6, batched),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    quick = parser.parse_args().quick
    repeats = 3 if quick else 7
    print(f"zephon random-access benchmark ({'quick' if quick else 'full'}): {repeats} repeats, medians; "
          f"core configuration with stop_after_passes={PASSES}")
    print(table(length_rows(repeats) + lookup_rows(repeats, 2000 if quick else 20000, 100_000 if quick else 1_000_000)))


if __name__ == "__main__":
    main()
