"""zephon torch benchmark: DataLoader throughput (pointers, Parquet, mixture loaders), checkpoints.

``python bench/torch_loader.py`` runs the full benchmark (a few minutes, plus one to two minutes of
data generation on the first run); ``--quick`` a smoke run; ``--only SECTION`` (repeatable)
runs only ``pointers``, ``parquet``, ``checkpoints`` or ``mixture``; ``--json PATH`` also writes the
results. Figures are medians of at least five repeats; ratios are medians of per-repeat
ratios whose two sides ran back to back in the same repeat. Targets are informational: the
script always exits 0. Needs the ``zephon-mixtures[torch]`` extra.
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Row, arguments, median_ratio, paired, table  # noqa: E402

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
MIXTURE = {"web": 0.6, "code": 0.3, "math": 0.1}  # component: share (they sum to 1)
MIXTURE_ROWS, MIXTURE_ROW_GROUP = 16_384, 4096  # per file; id int64 + text + component
MIXTURE_WORDS = (14, 52)  # 14-51 Zipf words per text: about 50-200 bytes


@dataclass(frozen=True)
class Settings:
    repeats: int  # repeats per figure (the median is reported)
    batches: int  # pointer batches timed per repeat ...
    warmup: int  # ... after this many untimed (the readers' first bundles; the direct side skips as many samples)
    parquet_files: int  # Parquet files read per repeat (of PARQUET["files"])
    lanes_for_size: int  # lanes of the checkpoint-size figure
    mixture_files: dict[str, int]  # files of MIXTURE_ROWS rows per component
    mixture_batches: int  # batches timed per repeat and mixture loader ...
    mixture_warmup: int  # ... after this many untimed (see ``drain``)


FULL = Settings(repeats=7, batches=40_000, warmup=8192, parquet_files=24, lanes_for_size=1024,  # mixture: 2,998,272 rows
                mixture_files={"web": 110, "code": 55, "math": 18}, mixture_batches=3000, mixture_warmup=1000)
QUICK = Settings(repeats=5, batches=8_000, warmup=2048, parquet_files=8, lanes_for_size=1024,  # mixture: 311,296 rows
                 mixture_files={"web": 11, "code": 6, "math": 2}, mixture_batches=600, mixture_warmup=300)


# -- pointers --------------------------------------------------------------------------------


def count_source() -> StaticMixtureWorkSource:
    datasets = [Dataset.from_counts(name, np.full(shards, rows, dtype=np.int64))
                for name, (shards, rows) in SHARDS.items()]
    return StaticMixtureWorkSource(datasets, WEIGHTS, chunk_size=CHUNK_SIZE, seed=SEED, stop_after_passes=None,
                                   exhausted_policy="repeat")


def source_rate(samples: int, warmup: int) -> float:
    """Iterating the source directly: lane 0 of 1, each chunk's read order as arrays, timed
    after ``warmup`` samples."""
    lane = count_source().clone_for_lane(0, 1)
    n = 0
    while n < warmup:
        n += len(lane.next_chunk().read_order()[0])
    start, n = time.perf_counter(), 0
    while n < samples:
        pointers, _ = lane.next_chunk().read_order()
        n += len(pointers)
    return n / (time.perf_counter() - start)


def loader_rate(batches: int, warmup: int, workers: int, default_lanes: bool = False) -> float:
    """zt.DataLoader(batch_size=256) over count-only datasets; timed after ``warmup`` batches.

    One lane per reader, or (``default_lanes``) the default ``canonical_replicas`` (8 per reader)."""
    loader = zt.DataLoader(Pipeline(count_source()), batch_size=BATCH, num_workers=workers,
                           canonical_replicas=None if default_lanes else max(1, workers))
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        n += next(it)["_sample_id"].shape[0]
    return n / (time.perf_counter() - start)


def pointer_rows(cfg: Settings) -> list[Row]:
    samples = cfg.batches * BATCH
    w2, lanes, w0, direct = paired(cfg.repeats, lambda: loader_rate(cfg.batches, cfg.warmup, 2),
                                   lambda: loader_rate(cfg.batches, cfg.warmup, 2, default_lanes=True),
                                   lambda: loader_rate(cfg.batches, cfg.warmup, 0),
                                   lambda: source_rate(samples, cfg.warmup * BATCH))
    lanes_ratio = median_ratio(lanes, w2)
    return [
        Row("pointers, DataLoader workers=2, batch 256", statistics.median(w2), "samples/s", ">= 60% of direct",
            median_ratio(w2, direct), median_ratio(w2, direct) >= 0.6, w2),
        Row("  same, default canonical_replicas (16 lanes)", statistics.median(lanes), "samples/s",
            ">= 80% of 2 lanes", lanes_ratio, lanes_ratio >= 0.8, lanes),
        Row("pointers, DataLoader workers=0, batch 256", statistics.median(w0), "samples/s", "",
            median_ratio(w0, direct), None, w0),
        Row("pointers, source directly (read_order)", statistics.median(direct), "samples/s", "(ratio base)",
            None, None, direct),
    ]


# -- Parquet ------------------------------------------------------------------------------------


def generated(name: str, write: Callable[[Path], None]) -> Path:
    """``$ZEPHON_BENCH_DATA`` (default the temp dir)/zephon-bench-torch/``name``, written by ``write`` once."""
    root = Path(os.environ.get("ZEPHON_BENCH_DATA", tempfile.gettempdir())) / "zephon-bench-torch"
    directory = root / name
    if not (directory / "done").exists():
        directory.mkdir(parents=True, exist_ok=True)
        write(directory)
        (directory / "done").touch()
    return directory


def write_parquet(directory: Path, files: int, rows: int, row_group: int, words: tuple[int, int], *, seed: int = 0,
                  first_id: int = 0, component: str | None = None) -> None:
    """``files`` Parquet files of ``rows`` rows: ``id`` (int64, from ``first_id`` on) and ``text``, ``words``
    (low, high) Zipf-distributed words per row, plus a constant ``component`` column when given."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i}" for i in range(5000)])
    for f in range(files):
        ids = np.arange(first_id + f * rows, first_id + (f + 1) * rows, dtype=np.int64)
        lengths = rng.integers(*words, size=len(ids))
        columns = {"id": ids, "text": [" ".join(vocabulary[rng.zipf(1.3, n) % len(vocabulary)]) for n in lengths]}
        if component is not None:
            columns["component"] = [component] * rows
        pq.write_table(pa.table(columns), directory / f"{f:04d}.parquet", row_group_size=row_group)


def parquet_dir() -> Path:
    return generated(f"parquet-{PARQUET['files']}x{PARQUET['rows']}",
                     lambda directory: write_parquet(directory, PARQUET["files"], PARQUET["rows"], PARQUET["row_group"],
                                                     (40, 200)))


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


# -- mixture loaders -------------------------------------------------------------------------------


def mixture_dir(files: dict[str, int]) -> Path:
    """One directory of Parquet files per component, ids running on across components, generated once."""
    rows, row_group, words = MIXTURE_ROWS, MIXTURE_ROW_GROUP, MIXTURE_WORDS

    def write(directory: Path) -> None:
        first = 0
        for seed, (component, count) in enumerate(files.items()):
            write_parquet(directory / component, count, rows, row_group, words, seed=seed, first_id=first,
                          component=component)
            first += count * rows

    layout = "-".join(f"{component}{count}" for component, count in files.items())
    return generated(f"mixture-{layout}x{rows}-rg{row_group}-w{words[0]}-{words[1]}", write)


def component_files(directory: Path) -> dict[str, list[str]]:
    """Each component's files in shard order (sorted names, as ``Dataset.from_path`` numbers them)."""
    return {component: [str(p) for p in sorted((directory / component).glob("*.parquet"))] for component in MIXTURE}


def mixture_pipeline(directory: Path) -> Pipeline:
    """The mixture over one path dataset per component, rows shuffled within shards, repeating forever."""
    datasets = [Dataset.from_path(component, directory / component, catalog_dir=directory / "catalog")
                for component in MIXTURE]
    source = StaticMixtureWorkSource(datasets, MIXTURE, chunk_size=CHUNK_SIZE, seed=SEED, shuffle_within_shard=True,
                                     stop_after_passes=None, exhausted_policy="repeat")
    return Pipeline(source, columns=["text"])


def hf_datasets() -> Any:
    """Hugging Face ``datasets``, or None when it is not installed (``bench/datasets.py`` is not it)."""
    here, path = Path(__file__).resolve().parent, sys.path[:]
    sys.path[:] = [entry for entry in path if Path(entry or ".").resolve() != here]
    try:
        return importlib.import_module("datasets")
    except ImportError:
        return None
    finally:
        sys.path[:] = path


def hf_mixture(files: dict[str, list[str]], cache_dir: Path) -> Any:
    """``datasets.interleave_datasets`` of one ``Dataset.from_parquet`` per component, as Python values.

    The Arrow cache ``from_parquet`` builds lives in ``cache_dir`` (built on the first run). The
    ``"python"`` format reads these string rows faster than ``"numpy"`` (74 k vs 53 k rows/s here)."""
    hf = hf_datasets()
    hf.disable_progress_bars()
    hf.logging.set_verbosity_error()
    parts = [hf.Dataset.from_parquet(paths, columns=["text", "component"], cache_dir=str(cache_dir))
             for paths in files.values()]
    mixed = hf.interleave_datasets(parts, probabilities=list(MIXTURE.values()), seed=SEED,
                                   stopping_strategy="first_exhausted")
    return mixed.with_format("python")


def hf_collate(rows: list[dict[str, Any]]) -> dict[str, list]:
    """The rows ``Dataset.__getitems__`` returns as one columnar batch."""
    return {"text": [row["text"] for row in rows], "component": [row["component"] for row in rows]}


class MixtureRows(torch.utils.data.Dataset):
    """The hand-written mixture baseline: a global index over every component's files.

    Index ``i`` is a row of one row group of one file (files in ``files`` order, rows in file
    order). ``__getitems__`` groups a batch by row group, reads each group's ``text`` with
    pyarrow (the last decoded row group of each component cached), takes the rows and restores
    the batch's order with one ``take``.
    """

    def __init__(self, files: dict[str, list[str]]):
        self.groups: list[tuple[str, str, int]] = []  # (component, path, row group), index order
        sizes = []
        for component, paths in files.items():
            for path in paths:
                metadata = pq.ParquetFile(path).metadata
                self.groups += [(component, path, g) for g in range(metadata.num_row_groups)]
                sizes += [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes)])  # group k holds indices starts[k]:starts[k + 1]
        self._cache: dict[str, tuple[int, pa.Table]] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def group_indices(self, k: int) -> np.ndarray:
        """The indices of row group ``k``'s rows."""
        return np.arange(self.starts[k], self.starts[k + 1])

    def _group(self, k: int) -> pa.Table:
        component, path, g = self.groups[k]
        cached = self._cache.get(component)
        if cached is None or cached[0] != k:
            cached = self._cache[component] = (k, pq.ParquetFile(path).read_row_group(g, columns=["text"]))
        return cached[1]

    def __getitems__(self, indices: list[int]) -> dict[str, list]:
        """The batch at ``indices``: its ``text`` and each row's ``component``, in ``indices`` order."""
        index = np.asarray(indices, dtype=np.int64)
        group = np.searchsorted(self.starts, index, side="right") - 1
        order = np.argsort(group, kind="stable")
        pieces = [self._group(k).take(pa.array(index[order[a:b]] - self.starts[k]))
                  for k, a, b in _runs(group[order])]
        table = pa.concat_tables(pieces).take(pa.array(np.argsort(order)))
        return {"text": table.column("text").to_pylist(), "component": [self.groups[k][0] for k in group]}


def mixture_order(rows: MixtureRows, rng: np.random.Generator) -> np.ndarray:
    """The baseline's sampler: indices mixing the components by weight, to the first exhausted.

    Each component's row groups come in a random order, each group's rows shuffled; every
    position draws its component at random with the mixture weights (as ``interleave_datasets``)."""
    streams: dict[str, list[np.ndarray]] = {component: [] for component in MIXTURE}
    for k in rng.permutation(len(rows.groups)):
        streams[rows.groups[k][0]].append(rng.permutation(rows.group_indices(k)))
    picks = rng.choice(len(MIXTURE), size=len(rows), p=list(MIXTURE.values()))
    order, end = np.empty(len(rows), dtype=np.int64), len(rows)
    for c, parts in enumerate(streams.values()):
        stream, where = np.concatenate(parts), np.flatnonzero(picks == c)
        if len(where) > len(stream):
            end = min(end, int(where[len(stream)]))
        order[where[:len(stream)]] = stream[:len(where)]
    return order[:end]


def in_memory_table(files: dict[str, list[str]]) -> pa.Table:
    """Every component's ``text`` and ``component`` in memory, rows in :class:`MixtureRows` index order."""
    return pa.concat_tables([pq.read_table(path, columns=["text", "component"])
                             for paths in files.values() for path in paths]).combine_chunks()


def in_memory_batches(table: pa.Table, order: np.ndarray) -> Iterator[dict[str, list]]:
    """The hand-written in-memory loop: per batch one ``take`` of the table and its columns as lists."""
    for a in range(0, len(order) - BATCH + 1, BATCH):
        rows = table.take(pa.array(order[a:a + BATCH]))
        yield {"text": rows.column("text").to_pylist(), "component": rows.column("component").to_pylist()}


def drain(loader: Iterable[dict], batches: int, key: str, errors: list[list[float]], warmup: int) -> float:
    """Samples/s of ``batches`` batches after ``warmup`` untimed ones; appends the timed batches'
    composition errors (``batch[key]`` holds a batch's components) to ``errors``.

    The warm-up lets a run reach its steady state: with ``shuffle_within_shard`` each lane
    decodes a shard whole when it first reads from it, so zephon's first batches (16 lanes x 3
    datasets x a shard of 16,384 rows decoded for the first few hundred thousand rows) are
    slower than the rest of a run."""
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    start, seen = time.perf_counter(), []
    for _ in range(batches):
        seen.append(next(it)[key])
    elapsed = time.perf_counter() - start
    errors.append([composition_error(components) for components in seen])
    return sum(map(len, seen)) / elapsed


def composition_error(components: list[str]) -> float:
    """The largest ``|count - share x B|`` of any component in a batch of ``B`` rows."""
    counts = Counter(components)
    return max(abs(counts[c] - share * len(components)) for c, share in MIXTURE.items())


def _text_length(item: dict[str, Any]) -> dict[str, Any]:
    """A per-item map step of the kind users write: one derived field."""
    return {**item, "length": len(item["text"])}


def zephon_mixture(pipeline: Pipeline, workers: int, lanes: int | None, batches: int,
                   errors: list[list[float]], warmup: int) -> float:
    """``zt.DataLoader`` over the mixture, the fetch caches emptied first (``workers=0`` reads in this process)."""
    for dataset in pipeline.datasets_by_id.values():
        dataset.clear_cache()
    loader = zt.DataLoader(pipeline, batch_size=BATCH, num_workers=workers, canonical_replicas=lanes)
    return drain(loader, batches, "_component", errors, warmup)


def torch_mixture(dataset: torch.utils.data.Dataset, batches: int, errors: list[list[float]], warmup: int,
                  **kwargs: Any) -> float:
    """A plain torch DataLoader, map-style, 2 workers, ``batch_size=256``."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2, **kwargs)
    return drain(loader, batches, "component", errors, warmup)


def mixture_rows(cfg: Settings) -> list[Row]:
    directory = mixture_dir(cfg.mixture_files)
    pipeline, files = mixture_pipeline(directory), component_files(directory)
    hf_rows, arrow_rows = hf_mixture(files, directory / "hf-cache"), MixtureRows(files)
    order = mixture_order(arrow_rows, np.random.default_rng(SEED))
    table = in_memory_table(files)
    n, w = cfg.mixture_batches, cfg.mixture_warmup
    loaders: dict[str, Callable[[list[list[float]]], float]] = {
        "zephon default (16 lanes), workers=2": lambda e: zephon_mixture(pipeline, 2, None, n, e, w),
        "zephon one lane per reader, workers=2": lambda e: zephon_mixture(pipeline, 2, 2, n, e, w),
        "zephon default (8 lanes), workers=0": lambda e: zephon_mixture(pipeline, 0, None, n, e, w),
        "zephon default + per-item map, workers=2":
            lambda e: zephon_mixture(pipeline.map(_text_length), 2, None, n, e, w),
        "HF interleave_datasets, workers=2": lambda e: torch_mixture(hf_rows, n, e, w, collate_fn=hf_collate),
        "pyarrow map-style Dataset, workers=2": lambda e: torch_mixture(arrow_rows, n, e, w, sampler=order,
                                                                        collate_fn=_unbatched),
        "in-memory pyarrow take loop, one process": lambda e: drain(in_memory_batches(table, order), n, "component",
                                                                    e, w),
    }
    errors: list[list[list[float]]] = [[] for _ in loaders]  # per loader, per call, per batch
    rates = paired(cfg.repeats, *(functools.partial(measure, e) for measure, e in zip(loaders.values(), errors)))
    rows = []
    for label, rate, calls in zip(loaders, rates, errors):
        repeats, zephon = calls[1:], label.startswith("zephon")  # calls[0]: paired's warm-up round
        worst, mean = max(map(max, repeats)), statistics.fmean(e for repeat in repeats for e in repeat)
        rows += [Row(f"mixture, {label}", statistics.median(rate), "samples/s", "", None, None, rate),
                 Row("  batch composition error, max", worst, "samples", "<= 2" if zephon else "", None,
                     worst <= 2 if zephon else None, [max(repeat) for repeat in repeats]),
                 Row("  batch composition error, mean", mean, "samples", "", None, None,
                     [statistics.fmean(repeat) for repeat in repeats])]
    default, one_lane, single, mapped, hf_rate, arrow_rate, memory = rates
    for label, top, base, target, bound in (
            ("default lanes / one lane per reader", default, one_lane, ">= 90%", 0.9),
            ("per-item map / columnar (default)", mapped, default, ">= 60%", 0.6),
            ("default / HF map-style", default, hf_rate, ">= 2x", 2.0),
            ("default / pyarrow map-style", default, arrow_rate, ">= 50%", 0.5),
            ("workers=0 / in-memory take loop", single, memory, ">= 50%", 0.5),
            ("workers=2 / workers=0", default, single, ">= 1.6x", 1.6)):
        ratio = median_ratio(top, base)
        rows.append(Row(f"  {label}", ratio, "x", target, ratio, ratio >= bound, [d / b for d, b in zip(top, base)]))
    return rows


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


SECTIONS: dict[str, Callable[[Settings], list[Row]]] = {"pointers": pointer_rows, "parquet": parquet_rows,
                                                        "checkpoints": checkpoint_rows, "mixture": mixture_rows}


def notes(cfg: Settings) -> dict[str, str]:
    """The workload line printed before each section runs (none for checkpoints)."""
    return {
        "pointers": f"pointers: datasets {SHARDS}, weights {WEIGHTS}, chunk_size={CHUNK_SIZE}, repeat forever; "
                    "loaders use canonical_replicas = workers; ratio = loader / source iterated directly",
        "parquet": f"Parquet: {PARQUET} (first {cfg.parquet_files} files), shuffle_within_shard=True, one pass; "
                   "baseline reads zephon's exact row order; ratio = zephon / baseline",
        "mixture": f"mixture: {MIXTURE}, files {cfg.mixture_files} x {MIXTURE_ROWS} rows (row groups of "
                   f"{MIXTURE_ROW_GROUP}), column text, batch {BATCH}, {cfg.mixture_batches} batches per repeat "
                   f"after {cfg.mixture_warmup} untimed; composition error = max over components of "
                   "|count - share x B| per batch",
    }


def main() -> None:
    args = arguments(__doc__, SECTIONS)
    cfg = QUICK if args.quick else FULL
    sections = args.only or list(SECTIONS)
    print(f"zephon torch benchmark ({'quick' if args.quick else 'full'}): {cfg.repeats} repeats, medians; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs", flush=True)
    if "mixture" in sections and hf_datasets() is None:
        print("mixture: skipped, it needs the datasets package (the test extra)")
        sections.remove("mixture")
    lines = notes(cfg)
    for section in sections:
        if section in lines:
            print(lines[section], flush=True)
    rows = [row for section in sections for row in SECTIONS[section](cfg)]
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": "quick" if args.quick else "full", "sections": sections,
                                               "settings": asdict(cfg), "rows": [asdict(row) for row in rows]},
                                              indent=2))


if __name__ == "__main__":
    main()
