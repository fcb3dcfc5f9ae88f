"""zephon token-file benchmark: opening a 10⁹-document Megatron index, packed tokens/s, and token shares.

``python bench/token_files.py`` (``--quick`` for a smoke run). **Open**: ``Dataset.from_megatron``
on a sparse 10⁹-document ``.idx`` (20 GB apparent, its arrays' ends written) with a fresh
catalog directory per repeat. **Throughput**: four datasets of four Megatron pairs each
(uint16, documents of 20–8,000 tokens), packed into ``(8, 2048)`` batches by
``Pipeline(...).pack(2048).ensure_mixture("strict")`` through ``zt.DataLoader(num_workers=2)``,
against a hand-written loop through a torch ``DataLoader`` with 2 workers whose workers cut
random 2,049-token windows of the same memory-mapped ``.bin`` files (what a memmap loader
does), back to back in each repeat. Megatron's GPTDataset is measured when ``megatron.core``
is importable. **Shares**: the realized token share of each dataset on every 1 % prefix of
the packed stream. Targets are informational; exit status is 0.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import Row, arguments, median_ratio, paired, table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import write_megatron  # noqa: E402

import zephon.torch as zt  # noqa: E402
from zephon import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon.work import TokenEstimation  # noqa: E402

SECTIONS = ("open", "throughput", "shares")
LENGTHS = {"web": (50, 800), "code": (200, 3000), "books": (1000, 8000), "math": (20, 400)}
WEIGHTS = {"web": 0.5, "code": 0.2, "books": 0.2, "math": 0.1}
SEQ_LEN, BATCH = 2048, 8


def sparse_index(prefix: Path, documents: int) -> None:
    """A valid ``.idx`` / ``.bin`` pair of ``documents`` one-sequence documents, written only at the arrays' ends."""
    sequences, tokens = documents, 4 * documents
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, sequences, documents + 1)
    with open(f"{prefix}.idx", "wb") as out:
        out.write(head)
        out.truncate(34 + 12 * sequences + 8 * (documents + 1))
        out.seek(34 + 4 * (sequences - 1))
        out.write(struct.pack("<i", 4))
        out.seek(34 + 4 * sequences + 8 * (sequences - 1))
        out.write(struct.pack("<q", 2 * (tokens - 4)))
        out.seek(34 + 12 * sequences + 8 * documents)
        out.write(struct.pack("<q", sequences))
    with open(f"{prefix}.bin", "wb") as out:
        out.truncate(2 * tokens)


def open_rows(root: Path, repeats: int) -> list[Row]:
    sparse_index(root / "huge_text_document", 10**9)
    times = []
    for k in range(repeats):
        os.environ["ZEPHON_CACHE_DIR"] = str(root / f"catalog-{k}")
        start = time.perf_counter()
        dataset = Dataset.from_megatron("huge", root / "huge_text_document")
        times.append(time.perf_counter() - start)
        assert dataset.total() == 10**9
    times.sort()
    return [Row("open a 1e9-document Megatron index", times[len(times) // 2], "s", "< 1 s", None, times[len(times) // 2] < 1,
                times)]


def write_corpus(root: Path, documents: int) -> list[Dataset]:
    rng = np.random.default_rng(0)
    for name, (low, high) in LENGTHS.items():
        for part in range(4):
            docs = [rng.integers(1, 60000, rng.integers(low, high)) for _ in range(documents)]
            write_megatron(root / f"{name}_{part}_text_document", docs)
    return [Dataset.from_megatron(name, root / f"{name}_*") for name in LENGTHS]


def pipeline(datasets: list[Dataset]) -> Pipeline:
    source = StaticMixtureWorkSource(datasets, WEIGHTS, chunk_size=256, seed=1, exhausted_policy="repeat",
                                     token_estimation=TokenEstimation())
    return Pipeline(source).pack(SEQ_LEN, pad_id=0).ensure_mixture("strict")


class Windows(torch.utils.data.IterableDataset):
    """The memmap baseline: random ``SEQ_LEN + 1``-token windows of the ``.bin`` files, ``BATCH`` per batch."""

    def __init__(self, paths: list[str]):
        self.paths = paths

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        rng = np.random.default_rng(0 if info is None else info.id)
        arrays = [np.memmap(p, dtype=np.uint16, mode="r") for p in self.paths]
        while True:
            tokens = arrays[int(rng.integers(len(arrays)))]
            starts = rng.integers(0, len(tokens) - SEQ_LEN - 1, BATCH)
            yield torch.from_numpy(np.stack([tokens[s:s + SEQ_LEN + 1] for s in starts]).astype(np.int64))


def rate(iterator, batches: int) -> float:
    next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * BATCH * SEQ_LEN / (time.perf_counter() - start)


def throughput_rows(root: Path, datasets: list[Dataset], repeats: int, batches: int) -> list[Row]:
    ours = iter(zt.DataLoader(pipeline(datasets), batch_size=BATCH, num_workers=2))
    windows = Windows(sorted(str(p) for p in root.glob("*_text_document.bin")))
    memmap = iter(torch.utils.data.DataLoader(windows, batch_size=None, num_workers=2))
    zephon_rates, memmap_rates = paired(repeats, lambda: rate(ours, batches), lambda: rate(memmap, batches))
    ratio = median_ratio(zephon_rates, memmap_rates)
    rows = [Row("memmap windows, DataLoader 2 workers", float(np.median(memmap_rates)), "tok/s", "", None, None,
                memmap_rates),
            Row("zephon packed strict, DataLoader 2 workers", float(np.median(zephon_rates)), "tok/s", ">=80% memmap",
                ratio, ratio >= 0.8, zephon_rates)]
    try:
        import megatron.core  # noqa: F401
        rows.append(Row("Megatron GPTDataset: importable, not yet measured", 0.0, "n"))
    except ImportError:
        rows.append(Row("Megatron GPTDataset (megatron.core not installed)", 0.0, "n"))
    return rows


def share_rows(datasets: list[Dataset], batches: int) -> list[Row]:
    loader = iter(zt.DataLoader(pipeline(datasets), batch_size=BATCH))
    per_row = []
    for _ in range(batches):
        batch = next(loader)
        per_row.append(np.stack([batch["_tokens"][name].numpy() for name in WEIGHTS], axis=1))
    placed = np.cumsum(np.concatenate(per_row), axis=0)
    cuts = np.linspace(len(placed) / 100, len(placed), 100).astype(int) - 1
    shares = placed[cuts] / placed[cuts].sum(axis=1, keepdims=True)
    error = float(np.abs(shares - np.array(list(WEIGHTS.values()))).max())
    return [Row(f"worst share error (points), 1% prefixes, {len(placed):,} seqs", error * 100, "x", "< 1 point", None,
                error < 0.01)]


def main() -> None:
    args = arguments(__doc__, SECTIONS)
    only = set(args.only or SECTIONS)
    repeats, batches = (3, 30) if args.quick else (5, 200)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="zephon-token-files-") as folder:
        root = Path(folder)
        os.environ["ZEPHON_CACHE_DIR"] = str(root / "catalog")
        if "open" in only:
            rows += open_rows(root, repeats)
        if only & {"throughput", "shares"}:
            datasets = write_corpus(root, 200 if args.quick else 1500)
            if "throughput" in only:
                rows += throughput_rows(root, datasets, repeats, batches)
            if "shares" in only:
                rows += share_rows(datasets, 100 if args.quick else 1000)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([row.__dict__ for row in rows], indent=1))


if __name__ == "__main__":
    main()
