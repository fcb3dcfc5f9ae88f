"""zephon token-file benchmark: opening a 10⁹-document Megatron index, packed tokens/s, and token shares.

``python bench/token_files.py`` (``--quick`` for a smoke run). **Open**: ``Dataset.from_megatron``
on a sparse 10⁹-document ``.idx`` (20 GB apparent, its arrays' ends written) with a fresh
catalog directory per repeat. **Throughput**: four datasets of four Megatron pairs each
(uint16, documents of 20–8,000 tokens), packed into ``(8, 2048)`` batches by
``Pipeline(...).pack(2048).ensure_mixture("strict")`` through ``zt.DataLoader(num_workers=2)``,
against a hand-written loop through a torch ``DataLoader`` with 2 workers whose workers cut
random 2,049-token windows of the same memory-mapped ``.bin`` files (what a memmap loader
does), and, when ``megatron.core`` is importable (``pip install --no-deps megatron-core``),
Megatron's blend of GPTDatasets over the same files and weights through the same
``DataLoader``, back to back in each repeat. **Shares**: the realized token share of each dataset on every 1 % prefix of
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


class _Specials:
    """What Megatron's GPTDataset asks of a tokenizer when the tokens are already written."""

    vocab_size, eod, pad = 60000, 0, 0
    unique_identifiers = {"class": "pretokenized"}


def megatron_loader(root: Path, samples: int) -> torch.utils.data.DataLoader | None:
    """Megatron's blend of GPTDatasets over the same files and weights, or ``None`` without ``megatron.core``."""
    try:
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    except ImportError:
        return None
    prefixes, weights = [], []
    for name, weight in WEIGHTS.items():
        parts = sorted(str(p.with_suffix("")) for p in root.glob(f"{name}_*_text_document.bin"))
        prefixes += parts
        weights += [weight / len(parts)] * len(parts)
    config = GPTDatasetConfig(random_seed=1, sequence_length=SEQ_LEN, blend=(prefixes, weights), split="1,0,0",
                              tokenizer=_Specials(), reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False, create_attention_mask=False)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [samples, 0, 0], lambda: True, config).build()
    return torch.utils.data.DataLoader(train, batch_size=BATCH, num_workers=2)


def throughput_rows(root: Path, datasets: list[Dataset], repeats: int, batches: int) -> list[Row]:
    ours = iter(zt.DataLoader(pipeline(datasets), batch_size=BATCH, num_workers=2))
    windows = Windows(sorted(str(p) for name in LENGTHS for p in root.glob(f"{name}_*_text_document.bin")))
    memmap = iter(torch.utils.data.DataLoader(windows, batch_size=None, num_workers=2))
    measures = [lambda: rate(ours, batches), lambda: rate(memmap, batches)]
    megatron = megatron_loader(root, (repeats + 2) * (batches + 1) * BATCH)
    if megatron is not None:
        theirs = iter(megatron)
        measures.append(lambda: rate(theirs, batches))
    samples = paired(repeats, *measures)
    ratio = median_ratio(samples[0], samples[1])
    rows = [Row("memmap windows, DataLoader 2 workers", float(np.median(samples[1])), "tok/s", "", None, None,
                samples[1]),
            Row("zephon packed strict, DataLoader 2 workers", float(np.median(samples[0])), "tok/s", ">=80% memmap",
                ratio, ratio >= 0.8, samples[0])]
    if megatron is None:
        return rows + [Row("Megatron GPTDataset (megatron.core not installed)", 0.0, "n")]
    ahead = median_ratio(samples[0], samples[2])
    return rows + [Row("Megatron blended GPTDataset, 2 workers", float(np.median(samples[2])), "tok/s", "", None, None,
                       samples[2]),
                   Row("zephon / Megatron", ahead, "x", "> 1", None, ahead > 1)]


def share_rows(datasets: list[Dataset], batches: int) -> list[Row]:
    loader = iter(zt.DataLoader(pipeline(datasets), batch_size=BATCH))
    per_row = []
    for _ in range(batches):
        batch = next(loader)
        per_row.append(np.stack([batch["_tokens"][name].numpy() for name in WEIGHTS], axis=1))
    placed = np.cumsum(np.concatenate(per_row), axis=0)
    cuts = np.linspace(len(placed) / 100, len(placed), 100).astype(int) - 1
    shares = placed[cuts] / placed[cuts].sum(axis=1, keepdims=True)
    target = np.array(list(WEIGHTS.values()))
    points = float(np.abs(shares - target).max()) * 100
    relative = float((np.abs(shares - target) / target).max())
    run = f"1% prefixes of {len(placed) * SEQ_LEN / 1e6:.0f}M tokens"
    return [Row(f"worst share error (points), {run}", points, "x", "< 1 point", None, points < 1),
            Row(f"worst relative share error, {run}", relative, "x")]


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
                rows += share_rows(datasets, 100 if args.quick else 5000)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([row.__dict__ for row in rows], indent=1))


if __name__ == "__main__":
    main()
