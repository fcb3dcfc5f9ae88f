"""zephon scale benchmark: counting, lane skipping, checkpoints and construction as the job grows.

``python bench/scale.py`` runs the full benchmark (a few minutes); ``--quick`` a smoke run;
``--json PATH`` also writes the results. Each figure is the median of several repeats; the
counting figures are fitted to ``a + b·R + c·G`` (``R`` lanes, ``G`` global chunks) and
extrapolated to 2,048 GPUs x 8 workers with the default 8 lanes per reader (131,072 lanes) on
10^12 samples at ``chunk_size=16384`` (6.1·10^7 chunks). Targets are informational: the script
always exits 0. Needs the ``zephon-mixtures[torch]`` extra.
"""
from __future__ import annotations

import gc
import json
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import Row, arguments, table  # noqa: E402

import zephon.torch as zt  # noqa: E402
from zephon import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon.work import Phase, PhasedMixtureWorkSource  # noqa: E402
from zephon.runtime import make_state, merge_states, parse_state, split_state  # noqa: E402
from zephon.runtime._book import SEALING_SOURCES  # noqa: E402
from zephon.runtime._state import dataset_fingerprints  # noqa: E402
from zephon.core.phases import phase_end  # noqa: E402
from zephon.core.cache import scheduler  # noqa: E402
from zephon.core.schedule import initial_state, state_arrays  # noqa: E402
from zephon.limits import MAX_PASSES  # noqa: E402

WEIGHTS = {"web": 0.6, "code": 0.3, "books": 0.1}
BIG_R, BIG_G = 2048 * 8 * 8, 10**12 // 16384  # the extrapolation's job


@dataclass(frozen=True)
class Settings:
    repeats: int
    counting: tuple[tuple[int, int], ...]  # (lanes, global chunks)
    lanes: tuple[int, ...]  # lane counts for skipping and checkpoints
    datasets: tuple[int, ...]


FULL = Settings(3, ((1024, 10**5), (4096, 10**5), (16384, 10**5), (16384, 10**6)), (1024, 4096, 16384),
                (100, 1000, 10_000, 100_000))
QUICK = Settings(2, ((256, 10**4), (1024, 10**4), (1024, 10**5)), (256, 1024), (100, 1000))


def three(total: int) -> list[Dataset]:
    """Three datasets sized as WEIGHTS, ``total`` samples in all."""
    return [Dataset.from_counts(name, np.full(shards, max(1, int(total * w) // shards), dtype=np.int64))
            for (name, w), shards in zip(WEIGHTS.items(), (600, 300, 100))]


def mixture(total: int, chunk_size: int, **kwargs: Any) -> StaticMixtureWorkSource:
    """:func:`three` datasets in WEIGHTS, one pass unless ``kwargs`` say otherwise."""
    kwargs.setdefault("stop_after_passes", 1)
    return StaticMixtureWorkSource(three(total), WEIGHTS, chunk_size=chunk_size, seed=7, **kwargs)


def timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


# -- counting ---------------------------------------------------------------------------------


def counting_rows(cfg: Settings) -> list[Row]:
    """``len(loader)`` with ``even_batches`` on rank 0 of R / 8 ranks: every lane counted."""
    rows, points = [], []
    for lanes, chunks in cfg.counting:
        source = mixture(chunks * 16, 16)

        def count() -> None:
            len(zt.DataLoader(Pipeline(source), batch_size=4, canonical_replicas=lanes, rank=0,
                              world_size=max(1, lanes // 8), even_batches=True))
        samples = timed(count, cfg.repeats)
        points.append((lanes, chunks, statistics.median(samples)))
        rows.append(Row(f"len(loader), {lanes} lanes x {chunks:.0e} chunks", statistics.median(samples), "s",
                        "<= 10 s at 16384 x 1e6" if (lanes, chunks) == (16384, 10**6) else "", None,
                        statistics.median(samples) <= 10 if (lanes, chunks) == (16384, 10**6) else None, samples))
    most = max(g for _, g in cfg.counting)
    config = mixture(most * 16, 16).config
    walks = timed(lambda: walk(config, most), cfg.repeats)
    c = statistics.median(walks) / most
    a, b = np.linalg.lstsq(np.array([[1.0, r] for r, _, _ in points]), np.array([t - c * g for _, g, t in points]),
                           rcond=None)[0]
    rows.append(Row(f"  the walk alone, {most:.0e} chunks", statistics.median(walks), "s",
                    samples=walks))
    rows.append(Row(f"  fit: {a * 1e3:.0f} ms + {b * 1e6:.1f} us/lane + {c * 1e9:.1f} ns/chunk (the walk's)", 0.0, "s"))
    rows.append(Row(f"  extrapolated, {BIG_R} lanes x {BIG_G:.1e} chunks", a + b * BIG_R + c * BIG_G, "s"))
    return rows


def walk(config: Any, chunks: int) -> None:
    """The counting kernel's one walk of ``chunks`` global chunks for 16,384 lanes (no lane states)."""
    acc, epochs, positions, tails = state_arrays(initial_state(config), len(config.datasets))
    starts, totals = np.zeros(16384, dtype=np.int64), np.zeros(16384, dtype=np.int64)
    scheduler(config).count_lanes(0, acc, epochs, positions, tails, 16384, config.routing.code, config.lane_key,
                                  starts, totals, chunks)


# -- lane skipping ----------------------------------------------------------------------------


def busy(stop_after_passes: int | None = None, small_shards: int = 200, **limits: int) -> StaticMixtureWorkSource:
    """bench/core.py's workload: chunks of 16,384 over 10^7, 10^7 and 10^6 samples (``small_shards``
    of 5,000), so that some dataset ends a pass about every 100 chunks. Repeating forever, or with
    ``stop_after_passes`` (passes counted, each dataset's checked where a chunk starts) or the
    ``max_repeats`` of ``limits``."""
    datasets = [Dataset.from_counts(name, np.full(shards, rows, dtype=np.int64))
                for name, shards, rows in (("a", 1000, 10_000), ("b", 500, 20_000), ("c", small_shards, 5_000))]
    return StaticMixtureWorkSource(datasets, {"a": 0.5, "b": 0.3, "c": 0.2}, chunk_size=16384, seed=7,
                                   exhausted_policy="repeat", stop_after_passes=stop_after_passes, **limits)


def counted() -> StaticMixtureWorkSource:
    """:func:`busy` with its passes counted, to the most a run may count (none ends in the bench)."""
    return busy(MAX_PASSES)


def limited() -> StaticMixtureWorkSource:
    """:func:`busy` with its repeats limited, to the most a run may allow (none ends in the bench)."""
    return busy(max_repeats=MAX_PASSES)


def small_counted() -> StaticMixtureWorkSource:
    """:func:`counted` with a third dataset of 10^5 samples: one of its passes ends about every 30 chunks."""
    return busy(MAX_PASSES, small_shards=20)


def lane_rate(lanes: int, chunks: int = 200, make: Callable[[], StaticMixtureWorkSource] | None = None) -> float:
    """Samples/s of lane 0 of ``lanes`` (default shuffles), each chunk's read order as arrays."""
    source = make() if make else mixture(10**10, 4096, exhausted_policy="repeat", stop_after_passes=None)
    lane = source.clone_for_lane(0, lanes)
    lane.next_chunk()
    start, n = time.perf_counter(), 0
    for _ in range(chunks):
        chunk = lane.next_chunk()
        assert chunk is not None  # repeats forever, or (counted) for more passes than a run here makes
        n += len(chunk.read_order()[0])
    return n / (time.perf_counter() - start)


def skipping_rows(cfg: Settings) -> list[Row]:
    one = [lane_rate(1) for _ in range(cfg.repeats)]
    rows = [Row("lane 0 of 1, chunk 4096", statistics.median(one), "samples/s", "(ratio base)", None, None, one)]
    for lanes in cfg.lanes:
        rates = [lane_rate(lanes) for _ in range(cfg.repeats)]
        ratio = statistics.median(rates) / statistics.median(one)
        target = lanes == 16384
        rows.append(Row(f"lane 0 of {lanes}", statistics.median(rates), "samples/s", ">= 50% of 1 lane" if target
                        else "", ratio, ratio >= 0.5 if target else None, rates))
    for name, make, targeted in (("busy", busy, True), ("busy, passes counted", counted, False),
                                 ("busy, repeats limited", limited, False),
                                 ("small, passes counted", small_counted, False)):
        rates = {lanes: [] for lanes in (1, *cfg.lanes)}  # interleaved: the machine's noise falls on each alike
        for _ in range(cfg.repeats):
            for lanes, samples in rates.items():
                samples.append(lane_rate(lanes, 300, make))
        base = statistics.median(rates[1])
        rows.append(Row(f"{name}: lane 0 of 1, chunk 16384", base, "samples/s", "(ratio base)", None, None, rates[1]))
        for lanes in cfg.lanes:
            ratio, target = statistics.median(rates[lanes]) / base, targeted and lanes == 16384
            rows.append(Row(f"{name}: lane 0 of {lanes}", statistics.median(rates[lanes]), "samples/s",
                            ">= 80% of 1 lane" if target else "", ratio, ratio >= 0.8 if target else None,
                            rates[lanes]))
    return rows


# -- checkpoints ------------------------------------------------------------------------------


def phased(total: int, chunk_size: int) -> PhasedMixtureWorkSource:
    """:func:`three` datasets in two phases (WEIGHTS for 10^7 chunks, then web and code
    alike), repeating forever."""
    return PhasedMixtureWorkSource(three(total), [Phase(WEIGHTS, until_chunk=10**7), Phase({"web": 1, "code": 1})],
                                   chunk_size=chunk_size, seed=7, exhausted_policy="repeat", stop_after_passes=None)


def global_state(lanes: int, make: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Every lane a chunk or two in, mid-chunk: what ``merge_states`` of all ranks gives (of
    :func:`mixture`'s source repeating forever, or of ``make()``)."""
    source = make() if make else mixture(10**10, 4096, exhausted_policy="repeat", stop_after_passes=None)
    entries = {}
    for lane in range(lanes):
        clone = source.clone_for_lane(lane, lanes)
        for _ in range(lane % 2 + 1):
            clone.next_chunk()
        entries[lane] = (clone.state_dict(), (lane * 7919) % 4096, lane % 2)
    state: dict[str, Any] = json.loads(json.dumps(make_state(lanes, entries, dataset_fingerprints(
        source.datasets_by_id), {}, run=None, sealed_by_source=True, nested=SEALING_SOURCES[type(source)])))
    return state


def checkpoint_rows(cfg: Settings) -> list[Row]:
    rows = []
    source = mixture(10**10, 4096, exhausted_policy="repeat", stop_after_passes=None)
    for lanes in cfg.lanes:
        state = global_state(lanes)
        text = json.dumps(state)
        parse = timed(lambda: parse_state(json.loads(text)), cfg.repeats)

        ranks = max(1, lanes // 8)

        def loader(world: int) -> Any:
            return zt.DataLoader(Pipeline(source), batch_size=4, canonical_replicas=lanes, rank=0, world_size=world)

        def load(world: int) -> Callable[[], None]:
            return lambda: loader(world).load_state_dict(json.loads(text))

        everything, first_rank = loader(1), loader(ranks)
        everything.load_state_dict(json.loads(text))
        everything.state_dict()  # the first one seals each lane's loaded state (timed on its own)
        first_rank.load_state_dict(json.loads(text))
        split = split_state(state)
        per_rank = json.loads(json.dumps([merge_states(split[lane] for lane in range(r * 8, min(lanes, r * 8 + 8)))
                                          for r in range(ranks)]))
        target = lanes == 16384
        phased_bytes = len(json.dumps(global_state(lanes, lambda: phased(10**10, 4096)))) / lanes
        rows += [Row(f"checkpoint, {lanes} lanes, per lane", len(text) / lanes, "B", "<= 120 B" if target else "",
                     None, len(text) / lanes <= 120 if target else None, [len(text) / lanes]),
                 Row("  the same of a phased source (two phases)", phased_bytes, "B", "", None, None, [phased_bytes]),
                 Row("  parse and verify (json.loads + parse_state)", statistics.median(parse), "s",
                     "<= 0.5 s" if target else "", None, statistics.median(parse) <= 0.5 if target else None, parse),
                 _seconds(f"  load_state_dict on rank 0 of {ranks}", timed(load(ranks), cfg.repeats), 0.3, target),
                 _seconds("  state_dict() on that rank", timed(first_rank.state_dict, cfg.repeats), 0.3, target),
                 _seconds(f"  merge_states of the {ranks} ranks' states", timed(lambda: merge_states(per_rank),
                                                                                 cfg.repeats), None, target),
                 _seconds("  load_state_dict on one process of every lane", timed(load(1), cfg.repeats), 0.3,
                          target),
                 _seconds("  the first state_dict() after that load", [first_save(loader(1), text)
                                                                      for _ in range(cfg.repeats)], None, target),
                 _seconds("  state_dict() on that process again", timed(everything.state_dict, cfg.repeats), 0.3,
                          target)]
    return rows


def first_save(loader: Any, text: str) -> float:
    """Seconds of the first ``state_dict()`` after ``load_state_dict``: it makes and seals each
    lane's source state from the loaded columns."""
    loader.load_state_dict(json.loads(text))
    start = time.perf_counter()
    loader.state_dict()
    return time.perf_counter() - start


def _seconds(figure: str, samples: list[float], limit: float | None, targeted: bool) -> Row:
    """A row of seconds, with a target of at most ``limit`` where ``targeted``."""
    median = statistics.median(samples)
    aimed = targeted and limit is not None
    return Row(figure, median, "s", f"<= {limit} s" if aimed else "", None, median <= limit if aimed else None,
               samples)


# -- one process reading every lane ----------------------------------------------------------


def reading_run(lanes: int, chunk_size: int = 4096, make: Callable[[int], Any] | None = None) -> dict[str, float]:
    """A loader reading all ``lanes`` in one process (batch 256, no workers) of :func:`mixture`'s
    source repeating forever (or of ``make(chunk_size)``): seconds to its first batch; samples/s
    over every lane's second chunk (the lanes take turns, so they reach the ends of their chunks
    together: the window holds a chunk's making and reading per lane); then the seconds of
    ``state_dict()`` there and of a new loader's ``load_state_dict`` and first batch."""
    def loader() -> Any:
        source = make(chunk_size) if make else mixture(10**10, chunk_size, exhausted_policy="repeat",
                                                       stop_after_passes=None)
        return zt.DataLoader(Pipeline(source), batch_size=256, canonical_replicas=lanes)

    gc.collect()  # each run starts from a collected heap, whatever the runs before it left to the collector
    first_loader, out = loader(), {}
    start = time.perf_counter()
    batches = iter(first_loader)
    next(batches)
    out["first"] = time.perf_counter() - start
    count = max(lanes * chunk_size // 256, 20_000)
    for _ in range(lanes * chunk_size // 256 - 1):  # the rest of the first chunks
        next(batches)
    start = time.perf_counter()
    for _ in range(count):
        next(batches)
    out["rate"] = count * 256 / (time.perf_counter() - start)
    start = time.perf_counter()
    state = first_loader.state_dict()
    out["save"] = time.perf_counter() - start
    resumed = loader()
    start = time.perf_counter()
    resumed.load_state_dict(state)
    out["load"] = time.perf_counter() - start
    next(iter(resumed))
    out["resumed first"] = time.perf_counter() - start - out["load"]
    return out


def ending_run(lanes: int, policy: str, chunk_size: int = 256) -> float:
    """Seconds to read to its end, in one process (batch 256, no workers), a stream of
    :func:`three` datasets that holds two chunks a lane and ends by ``policy``: the lanes end
    one by one within the last rounds, and each one's end is walked (where the stream stands
    at its end) and counted."""
    source = mixture(2 * lanes * chunk_size, chunk_size, exhausted_policy=policy, stop_after_passes=None)
    loader = zt.DataLoader(Pipeline(source), batch_size=256, canonical_replicas=lanes)
    gc.collect()
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def reading_rows(cfg: Settings) -> list[Row]:
    runs: dict[int, list[dict[str, float]]] = {lanes: [] for lanes in (8, *cfg.lanes)}
    phased_runs: dict[int, list[dict[str, float]]] = {lanes: [] for lanes in cfg.lanes}
    for _ in range(cfg.repeats):  # interleaved: the machine's noise falls on each alike
        for lanes, samples in runs.items():
            samples.append(reading_run(lanes))
        for lanes, samples in phased_runs.items():
            samples.append(reading_run(lanes, make=lambda chunk_size: phased(10**10, chunk_size)))
    base = [run["rate"] for run in runs[8]]
    rows = [Row("one process, 8 lanes: samples/s", statistics.median(base), "samples/s", "(ratio base)", None, None,
                base)]
    for lanes in cfg.lanes:
        target = lanes == 16384
        figure: Callable[[str], list[float]] = lambda key: [run[key] for run in runs[lanes]]  # noqa: E731
        phased_figure: Callable[[str], list[float]] = lambda key: [run[key] for run in phased_runs[lanes]]  # noqa: E731
        rows += [Row(f"one process, {lanes} lanes: samples/s", statistics.median(figure("rate")), "samples/s", "",
                     statistics.median(figure("rate")) / statistics.median(base), None, figure("rate")),
                 _seconds("  first batch", figure("first"), None, target),
                 _seconds("  state_dict() once every lane moved on", figure("save"), 0.3, target),
                 _seconds("  load_state_dict of it", figure("load"), 0.3, target),
                 _seconds("  then the first batch", figure("resumed first"), None, target),
                 _seconds("  phased (two phases): state_dict() as above", phased_figure("save"), 0.3, target),
                 _seconds("  phased: load_state_dict of it", phased_figure("load"), 0.3, target),
                 _seconds("  phased: then the first batch", phased_figure("resumed first"), None, target)]
    fresh = iter([phased(10**10, 4096) for _ in range(cfg.repeats)])  # each resolves its phases once
    walk = timed(lambda: phase_end(next(fresh).config, 0), cfg.repeats)
    rows.append(_seconds("phased: where phase 0 ends (10^7 chunks), once", walk, None, False))
    for lanes in cfg.lanes:
        for policy in ("stop", "redistribute"):
            samples = [ending_run(lanes, policy) for _ in range(cfg.repeats)]
            rows.append(_seconds(f"{lanes} lanes: two chunks a lane to the end, {policy}", samples, None, False))
    return rows


# -- construction -----------------------------------------------------------------------------


def construction_rows(cfg: Settings) -> list[Row]:
    """Build and first-chunk times untraced; the memory in a second, traced build (tracing slows it)."""
    rows = []
    for count in cfg.datasets:
        datasets = [Dataset.from_counts(f"d{k}", np.full(4, 1000, dtype=np.int64)) for k in range(count)]
        weights = {d.name: 1.0 + k % 7 for k, d in enumerate(datasets)}

        def build() -> StaticMixtureWorkSource:
            return StaticMixtureWorkSource(datasets, weights, chunk_size=max(16384, 2 * count), seed=1)
        start = time.perf_counter()
        source = build()
        built = time.perf_counter() - start
        source.clone_for_lane(0, 1).next_chunk()
        first = time.perf_counter() - start
        tracemalloc.start()
        build().clone_for_lane(0, 1).next_chunk()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows += [Row(f"{count} datasets x 4 shards: build", built, "s"),
                 Row("  to the first chunk", first, "s"),
                 Row("  peak memory (traced) per dataset", peak / count, "B")]
    return rows


SECTIONS: dict[str, Callable[[Settings], list[Row]]] = {
    "counting": counting_rows, "skipping": skipping_rows, "checkpoints": checkpoint_rows,
    "reading": reading_rows, "construction": construction_rows}


def main() -> None:
    args = arguments(__doc__, SECTIONS)
    cfg = QUICK if args.quick else FULL
    print(f"zephon scale benchmark ({'quick' if args.quick else 'full'}): {cfg.repeats} repeats, medians; "
          f"mixture {WEIGHTS}", flush=True)
    rows = [row for section in (args.only or list(SECTIONS)) for row in SECTIONS[section](cfg)]
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([row.__dict__ for row in rows], indent=1))


if __name__ == "__main__":
    main()
