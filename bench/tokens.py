"""zephon token benchmark: token-mode chunk production against sample mode, priming, and packed tokens/s.

``python bench/tokens.py`` (``--quick`` for a smoke run). Chunk production uses the core
benchmark's datasets (bench/core.py) with byte sizes and pinned ratios, lane 0 of 1, infinite
streams; both modes run back to back in each repeat and the ratio is the median of per-repeat
ratios. Priming measures four JSONL datasets (generated once under a temporary directory)
with a whitespace tokenizer and no node cache. Packing: the same four datasets, as Parquet, through
``Pipeline.tokenize(bpe).pack(1024)`` and a DataLoader with 2 workers (batches of 8), against
tokenizing the same documents, already in memory, one ``encode`` at a time in a plain loop,
in tokens/s, back to back. Targets are informational; exit status is 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import Row, median_ratio, paired, table
from core import CHUNK_SIZE, SEED, SHARDS, WEIGHTS

from zephon import Dataset, StaticMixtureWorkSource
from zephon.work import TokenEstimation

BYTES_PER_ROW = {"a": 900, "b": 2400, "c": 300}


def lane(tokens: bool) -> StaticMixtureWorkSource:
    """Lane 0 of 1 over the core datasets (with byte sizes), streaming forever."""
    datasets = [Dataset.from_counts(name, np.full(shards, rows), raw_bytes=np.full(shards, rows * BYTES_PER_ROW[name]))
                for name, (shards, rows) in SHARDS.items()]
    estimation = TokenEstimation(primer=0.25) if tokens else None
    return StaticMixtureWorkSource(datasets, WEIGHTS, chunk_size=CHUNK_SIZE, seed=SEED, stop_after_passes=None,
                                   exhausted_policy="repeat", token_estimation=estimation).clone_for_lane(0, 1)


def rate(source: StaticMixtureWorkSource, chunks: int) -> float:
    start = time.perf_counter()
    for _ in range(chunks):
        source.next_chunk()
    return chunks * CHUNK_SIZE / (time.perf_counter() - start)


def production_rows(repeats: int, chunks: int) -> list[Row]:
    samples, tokens = lane(False), lane(True)
    rate(samples, 5), rate(tokens, 5)
    pairs = [(rate(samples, chunks), rate(tokens, chunks)) for _ in range(repeats)]
    ratio = statistics.median(t / s for s, t in pairs)
    return [Row("sample-mode chunks", statistics.median(s for s, _ in pairs), "ptr/s"),
            Row("token-mode chunks (pinned ratios)", statistics.median(t for _, t in pairs), "ptr/s",
                ">=25% sample mode", ratio, ratio >= 0.25)]


def write_datasets(root: Path) -> list[Path]:
    """Four JSONL datasets of 16 shards x 2,000 documents, 5 to 80 words each."""
    rng = np.random.default_rng(0)
    vocabulary = np.array("the of and to in is was for on that with as by at from it".split())
    paths = []
    for d, words in enumerate((5, 20, 40, 80)):
        path = root / f"set{d}"
        path.mkdir()
        for shard in range(16):
            lines = (json.dumps({"text": " ".join(rng.choice(vocabulary, words))}) for _ in range(2000))
            (path / f"part-{shard:02d}.jsonl").write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def priming_rows(repeats: int) -> list[Row]:
    times = []
    with tempfile.TemporaryDirectory() as root:
        paths = write_datasets(Path(root))
        for repeat in range(repeats):
            os.environ["ZEPHON_CACHE_DIR"] = str(Path(root) / f"cache{repeat}")  # a cold node cache
            datasets = [Dataset.from_path(p.name, p) for p in paths]
            source = StaticMixtureWorkSource(datasets, {p.name: 1.0 for p in paths}, chunk_size=1024,
                                             token_estimation=TokenEstimation(tokenizer=str.split))
            start = time.perf_counter()
            source.prime(progress=False)
            times.append(time.perf_counter() - start)
    return [Row("priming 4 JSONL datasets (2,048 samples each)", statistics.median(times), "s", samples=times)]


def train_bpe(paths: list[Path]) -> Any:
    """A 2,000-token byte-pair tokenizer trained on the datasets (``tokenizers``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["[PAD]", "[EOS]", "[UNK]"], show_progress=False)
    tokenizer.train_from_iterator(texts(paths), trainer)
    return tokenizer


def texts(paths: list[Path]) -> list[str]:
    return [json.loads(line)["text"] for p in paths for f in sorted(p.glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def as_parquet(paths: list[Path]) -> list[Path]:
    """The JSONL datasets again as Parquet files (one per shard), the usual form of a pretraining corpus."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = []
    for path in paths:
        target = path.with_name(path.name + "-parquet")
        target.mkdir()
        for f in sorted(path.glob("*.jsonl")):
            rows = [json.loads(line)["text"] for line in f.read_text().splitlines()]
            pq.write_table(pa.table({"text": rows}), target / f"{f.stem}.parquet")
        out.append(target)
    return out


def packing_rows(repeats: int) -> list[Row]:
    import zephon.torch as zt
    from zephon import Pipeline

    with tempfile.TemporaryDirectory() as root:
        paths = write_datasets(Path(root))
        tokenizer = train_bpe(paths)
        documents = texts(paths)
        files = as_parquet(paths)
        source = StaticMixtureWorkSource([Dataset.from_path(p.name, p) for p in files], {p.name: 1.0 for p in files},
                                         chunk_size=1024, exhausted_policy="stop")
        pipeline = Pipeline(source).tokenize(tokenizer, eos_id=1).pack(1024, pad_id=0)

        def plain() -> float:
            start = time.perf_counter()
            tokens = sum(len(tokenizer.encode(text).ids) + 1 for text in documents)
            return tokens / (time.perf_counter() - start)

        def loader() -> float:
            start, tokens = time.perf_counter(), 0
            for batch in zt.DataLoader(pipeline, batch_size=8, num_workers=2, even_batches=False):
                tokens += int((batch["segment_ids"] > 0).sum())
            return tokens / (time.perf_counter() - start)
        ours, base = paired(repeats, loader, plain)
    ratio = median_ratio(ours, base)
    return [Row("tokenize, plain loop (1 process)", statistics.median(base), "tok/s", samples=base),
            Row("tokenize + pack, DataLoader (2 workers)", statistics.median(ours), "tok/s", ">=80% plain loop",
                ratio, ratio >= 0.8, samples=ours)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    quick = parser.parse_args().quick
    repeats = 3 if quick else 7
    print(f"zephon token benchmark ({'quick' if quick else 'full'}): {repeats} repeats, medians")
    print(table(production_rows(repeats, 20 if quick else 100) + priming_rows(repeats)
                + packing_rows(3 if quick else 5)))


if __name__ == "__main__":
    main()
