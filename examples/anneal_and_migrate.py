"""Anneal the last 10 % of a run to a new mixture, checkpoint, migrate, resume on another world size.

Runs on a laptop in a few seconds (count-only datasets, ranks simulated in one process):

1. a curriculum: ``web`` and ``code`` for 90 % of the planned samples, then an anneal phase that
   adds the high-quality ``books`` data (``PhasedMixtureWorkSource``);
2. two ranks train into the anneal phase and save one global checkpoint;
3. the plan changes mid-anneal: ``books`` gets more weight and a new ``math`` dataset joins.
   ``zephon.torch.migrate_checkpoint`` continues every dataset's pass where it stood, lists
   the samples the ranks had been handed but not read, and re-serves them first
   (``requeue=True``);
4. four ranks resume from the migrated checkpoint; no sample is read twice in a pass.

Usage: ``python examples/anneal_and_migrate.py [--planned-samples N]``
"""
from __future__ import annotations

import argparse
import json

import torch

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.work import Phase, PhasedMixtureWorkSource

SETTINGS = {"chunk_size": 64, "seed": 2024, "exhausted_policy": "repeat"}
BATCH = 16


def datasets() -> list[Dataset]:
    return [Dataset.from_counts("web", [4000] * 8), Dataset.from_counts("code", [1500] * 6),
            Dataset.from_counts("books", [900] * 4)]


def curriculum(planned: int) -> PhasedMixtureWorkSource:
    """90 % pretraining mixture, then the anneal mixture (books joins, web steps back)."""
    phases = [Phase({"web": 3, "code": 1}, until_sample=planned * 9 // 10),
              Phase({"web": 1, "code": 1, "books": 2})]
    return PhasedMixtureWorkSource(datasets(), phases, **SETTINGS)


def train(loaders: list[zt.DataLoader], steps: int, seen: list[tuple]) -> None:
    """``steps`` batches on every rank; records every sample read as (dataset name, shard, row)."""
    iterators = [iter(loader) for loader in loaders]
    for _ in range(steps):
        for iterator in iterators:
            batch = next(iterator)
            seen.extend(zip(batch["_component"], *batch["_sample_id"].T.tolist()))


def main(planned: int) -> dict:
    torch.manual_seed(0)
    source = curriculum(planned)
    ranks = [zt.DataLoader(Pipeline(source), batch_size=BATCH, canonical_replicas=4, rank=r, world_size=2)
             for r in range(2)]
    seen: list[tuple] = []
    train(ranks, planned * 95 // 100 // (BATCH * 2), seen)  # into the anneal phase
    checkpoint = zt.merge_states([json.loads(json.dumps(loader.state_dict())) for loader in ranks])

    anneal = StaticMixtureWorkSource(datasets() + [Dataset.from_counts("math", [700] * 3)],
                                     {"web": 1, "code": 1, "books": 3, "math": 1}, **SETTINGS)
    migration = zt.migrate_checkpoint(checkpoint, Pipeline(anneal), canonical_replicas=8, requeue=True)
    report = migration.report
    resumed = [zt.DataLoader(Pipeline(anneal), batch_size=BATCH, rank=r, world_size=4) for r in range(4)]
    for loader in resumed:
        loader.load_state_dict(migration.state)
    before = len(seen)
    train(resumed, planned // 20 // (BATCH * 4), seen)

    passes_open = {name: entry["cut"]["pass"] for name, entry in report["datasets"].items() if entry["cut"]}
    assert all(p == 0 for p in passes_open.values()), "this example stays inside every dataset's first pass"
    assert len(set(seen)) == len(seen), "a sample was read twice"
    summary = {
        "phase_starts": source.phase_starts(),
        "read_before": before,
        "read_after": len(seen) - before,
        "cut_chunk": report["cut_chunk"],
        "unread_at_cut": {n: e["unread_count"] for n, e in report["datasets"].items()},
        "continues_at": {n: e["continues_at"] for n, e in report["datasets"].items()},
    }
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planned-samples", type=int, default=20000, help="samples the run plans to read")
    main(parser.parse_args().planned_samples)
