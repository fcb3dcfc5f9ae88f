"""zephon soak benchmark: a long repeating run stays flat in memory, file descriptors and threads.

``python bench/soak.py`` runs a ``zephon.torch.DataLoader`` with two workers over a repeating
mixture for ``--seconds`` (default 300) or ``--batches`` (default 10**6), whichever comes first,
taking a checkpoint (``state_dict()``) every 1,000 batches. Every ``--every`` seconds it samples
the RSS, open file descriptors and threads of the trainer and of each worker (Linux ``/proc``).
File descriptors are counted apart: those of tensors in flight (torch shares a batch's tensors
through ``/dev/shm`` descriptors, so their number jitters by a bundle's worth and is bounded by
the prefetch) and all the others (files, pipes, sockets: any growth is a leak). After the
warm-up (the first fifth of the run) the samples are split in two halves; growth is the median
of the second half less the median of the first (a leak moves the median; the jitter of
batches in flight does not).
``--quick`` is a 40 s smoke run; ``--json PATH`` also writes every sample. Informational: the
script prints the figures against their bounds and always exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zephon.torch as zt  # noqa: E402
from zephon import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402

BATCH = 256
RSS_BOUND_MB = 16.0  # growth after warm-up per process, the figure the README reports against
FD_BOUND = 0  # open file descriptors may not grow
THREAD_BOUND = 0  # nor may threads


def make_loader() -> zt.DataLoader:
    """Three datasets repeating forever, records through a map step (the unit path) and collate."""
    datasets = [Dataset.from_counts("a", np.full(400, 5_000, dtype=np.int64)),
                Dataset.from_counts("b", np.full(200, 3_000, dtype=np.int64)),
                Dataset.from_records("r", [[{"x": i, "text": "t" * (i % 97)} for i in range(500)]] * 8)]
    source = StaticMixtureWorkSource(datasets, {"a": 0.5, "b": 0.3, "r": 0.2}, chunk_size=4096, seed=3,
                                     exhausted_policy="repeat", shuffle_within_shard=True)
    pipeline = Pipeline(source).map(_uniform).filter(_keep)
    return zt.DataLoader(pipeline, batch_size=BATCH, num_workers=2)


def _uniform(item: dict) -> dict:
    return {"x": item.get("x", -1), "length": len(item.get("text", ""))}


def _keep(item: dict) -> bool:
    return item["x"] % 11 != 5


def probe(pid: int) -> dict[str, float]:
    """RSS (MB), open file descriptors (apart from tensors in flight) and threads of ``pid``."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    shared = other = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed since the listing
        if target.startswith("/dev/shm/"):
            shared += 1
        else:
            other += 1
    return {"rss_mb": int(fields["VmRSS"][0]) / 1024, "fds": other, "shm_fds": shared,
            "threads": int(fields["Threads"][0])}


def soak(seconds: float, max_batches: int, every: float) -> dict[str, Any]:
    loader = make_loader()
    it = iter(loader)
    next(it)
    workers = {f"worker {k}": w.pid for k, w in enumerate(it._base._workers)}
    processes = {"trainer": os.getpid(), **workers}
    samples: list[dict] = []
    start = last = time.monotonic()
    batches = 1
    while batches < max_batches and time.monotonic() - start < seconds:
        next(it)
        batches += 1
        if batches % 1000 == 0:
            json.dumps(loader.state_dict())
        now = time.monotonic()
        if now - last >= every:
            last = now
            samples.append({"t": now - start, "batches": batches,
                            **{name: probe(pid) for name, pid in processes.items()}})
    elapsed = time.monotonic() - start
    return summary(samples, elapsed, batches, processes, loader.stats())


def summary(samples: list[dict], elapsed: float, batches: int, processes: dict[str, int], stats: dict) -> dict:
    """The run's figures: median of the second half after warm-up less the median of the first."""
    warm = [s for s in samples if s["t"] >= elapsed / 5] or samples
    first, second = warm[:len(warm) // 2] or warm, warm[len(warm) // 2:]
    growth = {name: {key: statistics.median(s[name][key] for s in second) - statistics.median(
                     s[name][key] for s in first)
                     for key in ("rss_mb", "fds", "shm_fds", "threads")} for name in processes}
    peaks = {name: max(s[name]["shm_fds"] for s in warm) for name in processes}
    return {"seconds": elapsed, "batches": batches, "rate": batches * BATCH / elapsed, "growth": growth,
            "shm_fd_peaks": peaks,
            "final": {name: samples[-1][name] for name in processes} if samples else {},
            "stats": {k: v for k, v in stats.items() if k in ("batches", "samples", "filtered")},
            "samples": samples}


def report(result: dict[str, Any]) -> str:
    lines = [f"{result['batches']:,} batches of {BATCH} in {result['seconds']:.0f} s "
             f"({result['rate'] / 1e3:,.0f} k samples/s); growth after warm-up (medians, second half less first):",
             f"{'process':<10} {'RSS MB':>9} {'growth MB':>10} {'fds':>5} {'growth':>7} {'threads':>8} "
             f"{'growth':>7} {'shm fds peak':>13}  ok"]
    for name, growth in result["growth"].items():
        final = result["final"][name]
        ok = growth["rss_mb"] <= RSS_BOUND_MB and growth["fds"] <= FD_BOUND and growth["threads"] <= THREAD_BOUND
        lines.append(f"{name:<10} {final['rss_mb']:>9.1f} {growth['rss_mb']:>+10.1f} {final['fds']:>5} "
                     f"{growth['fds']:>+7} {final['threads']:>8} {growth['threads']:>+7} "
                     f"{result['shm_fd_peaks'][name]:>13}  {'PASS' if ok else 'MISS'}")
    lines.append(f"bounds: RSS growth <= {RSS_BOUND_MB} MB per process, fds (other than tensors in flight) "
                 "and threads do not grow")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--batches", type=int, default=10**6)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--quick", action="store_true", help="a 40 s smoke run")
    parser.add_argument("--json", type=Path, help="also write the result and every sample here")
    args = parser.parse_args()
    seconds = 40.0 if args.quick else args.seconds
    result = soak(seconds, args.batches, min(args.every, seconds / 20))
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
