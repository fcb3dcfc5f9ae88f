"""zephon core benchmark: chunk throughput, lane scaling, read order, checkpoints, memory.

``python bench/core.py`` runs the full benchmark (about a minute, a few on a busy machine);
``--quick`` a smoke run of well under 30 s; ``--json PATH`` also writes the results. Every figure is the median of at least five
repeats, and every ratio is the median of per-repeat ratios whose two sides were measured
back to back in the same repeat. Targets are informational: the script always exits 0.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Row, median_ratio, paired, table  # noqa: E402

from zephon import Dataset, StaticMixtureWorkSource, WorkChunk  # noqa: E402

CHUNK_SIZE = 16384
SEED = 7
SHARDS = {"a": (1000, 10_000), "b": (500, 20_000), "c": (200, 5_000)}  # name: (shards, rows)
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}
INFINITE = {"stop_after_passes": None, "exhausted_policy": "repeat"}
SHUFFLES = {
    "default": {},
    "auto": {"shuffle_within_shard": True, "shuffle_block_size": "auto"},
    "global": {"shuffle_within_shard": True, "shuffle_block_size": "global"},
}
FLAT = 1.5  # a checkpoint round trip is "flat" if it is at most this much slower after 10,000 chunks
BASELINE = (
    "numpy baseline: per chunk, out = np.empty((16384, 3), np.int64); out[:, 0] = d; "
    "out[:, 1] = s; out[:, 2] = np.arange(o, o + 16384), in this process"
)


@dataclass(frozen=True)
class Settings:
    """How much to measure: repeats of each figure and the work done in one repeat."""

    repeats: int  # repeats per figure (the median is reported)
    chunks: int  # chunks per throughput / read-order repeat
    iter_chunks: int  # chunks iterated as Python tuples per repeat
    round_trips: int  # checkpoint round trips averaged in one repeat
    billion_runs: int  # fresh subprocesses for the 10**9-sample dataset


FULL = Settings(repeats=11, chunks=1000, iter_chunks=40, round_trips=500, billion_runs=7)
QUICK = Settings(repeats=5, chunks=200, iter_chunks=10, round_trips=100, billion_runs=5)


# -- sources and baselines ---------------------------------------------------------------


def make_lane(replicas: int, shuffles: str, pass_tail: str = "carry") -> StaticMixtureWorkSource:
    """Lane 0 of ``replicas`` over the three benchmark datasets, streaming forever."""
    datasets = [Dataset.from_counts(name, np.full(shards, rows, dtype=np.int64))
                for name, (shards, rows) in SHARDS.items()]
    source = StaticMixtureWorkSource(datasets, WEIGHTS, chunk_size=CHUNK_SIZE, seed=SEED,
                                     **SHUFFLES[shuffles], **INFINITE, pass_tail=pass_tail)
    return source.clone_for_lane(0, replicas)


def baseline_rate(chunks: int) -> float:
    """Pointers/s of numpy writing ``chunks`` fresh (CHUNK_SIZE, 3) int64 pointer arrays."""
    start = time.perf_counter()
    for i in range(chunks):
        out = np.empty((CHUNK_SIZE, 3), np.int64)
        out[:, 0] = i % 3
        out[:, 1] = i
        out[:, 2] = np.arange(i * CHUNK_SIZE, (i + 1) * CHUNK_SIZE)
    return chunks * CHUNK_SIZE / (time.perf_counter() - start)


def lane_rate(lane: StaticMixtureWorkSource, chunks: int) -> float:
    """Pointers/s the lane receives over its next ``chunks`` chunks."""
    pointers = 0
    start = time.perf_counter()
    for _ in range(chunks):
        pointers += len(lane.next_chunk())
    return pointers / (time.perf_counter() - start)


def chunk_templates(lane: StaticMixtureWorkSource, count: int) -> list[tuple]:
    """``count`` source chunks as ``(names, buffer, counts, seed)``, each buffer one copy."""
    templates = []
    for _ in range(count):
        chunk = lane.next_chunk()
        buffer = np.concatenate(list(chunk.components.values()))
        templates.append((chunk.component_names, buffer, list(chunk.counts.values()), chunk.seed))
    return templates


def fresh_chunks(templates: list[tuple], count: int) -> list[WorkChunk]:
    """``count`` new WorkChunks wrapping the template buffers without copying; no cached orders."""
    made = []
    for i in range(count):
        names, buffer, counts, seed = templates[i % len(templates)]
        made.append(WorkChunk.from_buffer(names, buffer, counts, seed=seed))
    return made


def read_order_rate(chunks: list[WorkChunk]) -> float:
    """Pointers/s of ``read_order()`` (weighted round robin) on fresh chunks, consumed one by one."""
    pointers = sum(len(chunk) for chunk in chunks)
    start = time.perf_counter()
    while chunks:
        chunks.pop().read_order()
    return pointers / (time.perf_counter() - start)


def iteration_rate(chunks: list[WorkChunk]) -> float:
    """Pointers/s of ``for x in chunk`` over fresh chunks (their first, uncached iteration)."""
    pointers = sum(len(chunk) for chunk in chunks)
    start = time.perf_counter()
    while chunks:
        for _ in chunks.pop():
            pass
    return pointers / (time.perf_counter() - start)


def yield_all(items: list[tuple]) -> Iterator[tuple]:
    """A bare Python generator over prebuilt items."""
    for item in items:
        yield item


def generator_rate(items: list[tuple], times: int) -> float:
    """Pointers/s of iterating ``yield_all(items)`` ``times`` times."""
    start = time.perf_counter()
    for _ in range(times):
        for _ in yield_all(items):
            pass
    return len(items) * times / (time.perf_counter() - start)


def round_trip_seconds(lane: StaticMixtureWorkSource, trips: int) -> float:
    """Mean seconds of one ``state_dict()`` + ``load_state_dict()`` round trip."""
    start = time.perf_counter()
    for _ in range(trips):
        lane.load_state_dict(lane.state_dict())
    return (time.perf_counter() - start) / trips


# -- measurement sections -----------------------------------------------------------------


def rate_row(figure: str, samples: list[float], base: list[float], target: str,
             bound: float) -> Row:
    """A pointers/s row whose ratio to ``base`` must reach ``bound``."""
    ratio = median_ratio(samples, base)
    return Row(figure, statistics.median(samples), "ptr/s", target, ratio, ratio >= bound,
               samples)


def throughput_rows(cfg: Settings) -> list[Row]:
    """Chunk throughput of the three shuffle settings (R=1) and of lane 0 at R=64, R=1024."""
    lanes = {"default": make_lane(1, "default"), "auto": make_lane(1, "auto"),
             "global": make_lane(1, "global"), "R=64": make_lane(64, "default"),
             "R=1024": make_lane(1024, "default")}
    measures = [lambda: baseline_rate(cfg.chunks)]
    measures += [lambda lane=lane: lane_rate(lane, cfg.chunks) for lane in lanes.values()]
    base, *rates = paired(cfg.repeats, *measures)
    got = dict(zip(lanes, rates))
    return [
        Row("numpy baseline", statistics.median(base), "ptr/s", samples=base),
        rate_row("default shuffles, R=1", got["default"], base, ">=25% numpy", 0.25),
        rate_row("within-shard + block 'auto', R=1", got["auto"], base, ">=10% numpy", 0.10),
        rate_row("within-shard + block 'global', R=1", got["global"], base, ">=10% numpy", 0.10),
        rate_row("lane 0 of R=64 (default)", got["R=64"], got["default"], ">=50% R=1", 0.5),
        rate_row("lane 0 of R=1024 (default)", got["R=1024"], got["default"], ">=50% R=1", 0.5),
    ]


def pass_tail_rows(cfg: Settings) -> list[Row]:
    """pass_tail="carry" (the default) against "drop", per shuffle setting: the two lanes run
    back to back, the first of them alternating between repeats (``paired``)."""
    rows = []
    for shuffles, figure in (("default", "default shuffles"), ("auto", "within-shard + 'auto'")):
        carry, drop = (make_lane(1, shuffles, tail) for tail in ("carry", "drop"))
        carried, dropped = paired(cfg.repeats, lambda: lane_rate(carry, cfg.chunks),
                                  lambda: lane_rate(drop, cfg.chunks))
        rows.append(rate_row(f"{figure}, pass_tail carry / drop", carried, dropped, ">=95% drop", 0.95))
    return rows


def chunk_read_rows(cfg: Settings) -> list[Row]:
    """``read_order()`` against numpy, and ``for x in chunk`` against a bare generator."""
    lane = make_lane(1, "default")
    templates = chunk_templates(lane, 8)
    items = list(fresh_chunks(templates, 1)[0])
    base, orders = paired(
        cfg.repeats, lambda: baseline_rate(cfg.chunks),
        lambda: read_order_rate(fresh_chunks(templates, cfg.chunks)),
    )
    generated, iterated = paired(
        cfg.repeats, lambda: generator_rate(items, cfg.iter_chunks),
        lambda: iteration_rate(fresh_chunks(templates, cfg.iter_chunks)),
    )
    return [
        rate_row("chunk.read_order() (fresh chunks)", orders, base, ">=25% numpy", 0.25),
        rate_row("for x in chunk (fresh chunks)", iterated, generated, ">=30% generator", 0.30),
    ]


def checkpoint_rows(cfg: Settings) -> list[Row]:
    """``state_dict()`` + ``load_state_dict()`` after 10 and after 10,000 chunks (R=1)."""
    early, late = make_lane(1, "default"), make_lane(1, "default")
    for lane, chunks in ((early, 10), (late, 10_000)):
        for _ in range(chunks):
            lane.next_chunk()
    after_10, after_10k = paired(cfg.repeats, lambda: round_trip_seconds(early, cfg.round_trips),
                                 lambda: round_trip_seconds(late, cfg.round_trips))
    median_10, median_10k = statistics.median(after_10), statistics.median(after_10k)
    flat = median_ratio(after_10k, after_10)
    return [
        Row("checkpoint round trip @10 chunks", median_10, "s", "<1 ms", None, median_10 < 1e-3,
            after_10),
        Row("checkpoint round trip @10,000 chunks", median_10k, "s", f"<1 ms, <={FLAT:.0%} @10",
            flat, median_10k < 1e-3 and flat <= FLAT, after_10k),
    ]


def proc_status_mb(key: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in MB (Linux only)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def billion_child() -> None:
    """Subprocess body: build the 10**9-sample source, take one chunk, print JSON figures.

    The RSS figure is the peak RSS afterwards (``VmHWM``) minus the RSS before construction
    (``VmRSS``): a plain ``ru_maxrss`` delta reads 0 when the import-time peak is higher.
    """
    rss_before = proc_status_mb("VmRSS")
    start = time.perf_counter()
    lane = billion_lane()
    built = time.perf_counter()
    lane.next_chunk()
    first = time.perf_counter()
    rss_peak = proc_status_mb("VmHWM")
    del lane
    tracemalloc.start()
    billion_lane().next_chunk()
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps({"construct": built - start, "first_chunk": first - built,
                      "to_first_chunk": first - start, "rss_delta": rss_peak - rss_before,
                      "traced_peak": traced_peak / 2**20}))


def billion_lane() -> StaticMixtureWorkSource:
    """Lane 0 of 1 over one dataset of 100,000 shards x 10,000 rows, block shuffle 'global'."""
    dataset = Dataset.from_counts("big", np.full(100_000, 10_000, dtype=np.int64))
    source = StaticMixtureWorkSource([dataset], {"big": 1.0}, chunk_size=CHUNK_SIZE, seed=SEED,
                                     shuffle_block_size="global", **INFINITE)
    return source.clone_for_lane(0, 1)


def billion_rows(cfg: Settings) -> list[Row]:
    """Cold start of the 10**9-sample dataset, one fresh subprocess per repeat."""
    runs = []
    for _ in range(cfg.billion_runs):
        out = subprocess.run([sys.executable, __file__, "--billion-child"], check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out))
    samples = {key: [run[key] for run in runs] for key in runs[0]}

    def row(figure: str, key: str, unit: str, limit: float | None, target: str = "") -> Row:
        """One figure of the child runs, checked against ``limit`` when given."""
        median = statistics.median(samples[key])
        ok = None if limit is None else median < limit
        return Row(figure, median, unit, target, None, ok, samples[key])

    return [
        row("1e9 global: construction", "construct", "s", None),
        row("1e9 global: first next_chunk()", "first_chunk", "s", 0.05, "<50 ms"),
        row("1e9 global: construction -> first chunk", "to_first_chunk", "s", 0.05, "<50 ms"),
        row("1e9 global: peak RSS increase", "rss_delta", "MB", 100, "<100 MB"),
        row("1e9 global: tracemalloc peak", "traced_peak", "MB", 100, "<100 MB"),
    ]


def construct_million(counts: np.ndarray) -> tuple[float, float]:
    """Seconds to build a dataset of ``counts`` and its source, then to take the first chunk."""
    start = time.perf_counter()
    dataset = Dataset.from_counts("m", counts)
    source = StaticMixtureWorkSource([dataset], {"m": 1.0}, chunk_size=CHUNK_SIZE, seed=SEED,
                                     **INFINITE)
    built = time.perf_counter()
    source.clone_for_lane(0, 1).next_chunk()
    return built - start, time.perf_counter() - built


def construction_rows(cfg: Settings) -> list[Row]:
    """10**6 shards of 1,000 rows (default shuffles): construction, then the first chunk."""
    counts = np.full(1_000_000, 1_000, dtype=np.int64)
    construct_million(counts)  # warm-up
    built, first = zip(*(construct_million(counts) for _ in range(cfg.repeats)))
    median = statistics.median(built)
    return [
        Row("1e6 shards: from_counts + source", median, "s", "<1 s", None, median < 1.0,
            list(built)),
        Row("1e6 shards: first next_chunk()", statistics.median(first), "s", samples=list(first)),
    ]


def one_shard_datasets(n: int) -> list[Dataset]:
    return [Dataset.from_counts(f"d{i}", [100]) for i in range(n)]


def construct_mixture(datasets: list[Dataset]) -> float:
    """Seconds to build a source mixing ``datasets`` equally (the datasets already exist)."""
    start = time.perf_counter()
    StaticMixtureWorkSource(datasets, {d.name: 1.0 for d in datasets}, chunk_size=CHUNK_SIZE, seed=SEED, **INFINITE)
    return time.perf_counter() - start


def timed_datasets(n: int) -> float:
    start = time.perf_counter()
    one_shard_datasets(n)
    return time.perf_counter() - start


def many_datasets_rows(cfg: Settings) -> list[Row]:
    """Construction is O(n log n) in datasets: a source over 100,000 one-shard datasets, its ratio
    to 10,000 (about 10 when linear, 100 when quadratic), and building the datasets themselves."""
    large, small = one_shard_datasets(100_000), one_shard_datasets(10_000)
    repeats = max(3, cfg.repeats // 2)
    big, little = paired(repeats, lambda: construct_mixture(large), lambda: construct_mixture(small))
    building = paired(repeats, lambda: timed_datasets(100_000))[0]
    median = statistics.median(big)
    return [
        Row("1e5 one-shard datasets: source construction", median, "s", "<2 s", None, median < 2.0, big),
        Row("1e5 / 1e4 datasets: source construction ratio", median_ratio(big, little), "n", "~10 (linear)",
            samples=little),
        Row("1e5 one-shard datasets: Dataset.from_counts", statistics.median(building), "s", samples=building),
    ]


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- output --------------------------------------------------------------------------------


def header(cfg: Settings, quick: bool) -> str:
    """What was measured and how, printed above the table."""
    datasets = ", ".join(f"{name}: {s} x {r:,} rows (w {WEIGHTS[name]})"
                         for name, (s, r) in SHARDS.items())
    return "\n".join([
        f"zephon core benchmark ({'quick' if quick else 'full'}): {cfg.repeats} repeats, "
        f"{cfg.chunks} chunks per repeat, medians shown",
        f"datasets {datasets}; chunk_size={CHUNK_SIZE}, seed={SEED}, lane 0, "
        "stop_after_passes=None, exhausted_policy='repeat'",
        BASELINE,
        "ratio = median of per-repeat ratios, both sides measured back to back; read_order and "
        "iteration run on fresh WorkChunk.from_buffer copies of source chunks (no cached order); "
        "1e9 rows: one fresh subprocess per repeat",
    ])


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (well under 30 s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--billion-child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    """Run every section, print the table and optionally write JSON."""
    args = parse_args()
    if args.billion_child:
        billion_child()
        return
    cfg = QUICK if args.quick else FULL
    print(header(cfg, args.quick), flush=True)
    rows = throughput_rows(cfg) + pass_tail_rows(cfg) + chunk_read_rows(cfg) + checkpoint_rows(cfg)
    rows.append(Row("peak RSS, main benchmark (rows above)", peak_rss_mb(), "MB"))
    rows += billion_rows(cfg) + construction_rows(cfg) + many_datasets_rows(cfg)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "mode": "quick" if args.quick else "full", "settings": asdict(cfg),
            "baseline": BASELINE, "rows": [asdict(row) for row in rows],
        }, indent=2))


if __name__ == "__main__":
    main()
