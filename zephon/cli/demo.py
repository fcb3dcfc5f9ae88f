"""``zephon demo`` (and ``python -m zephon``): a mixture over synthetic datasets, end to end.

Builds three count-only datasets, shows the first chunks of lane 0, the mixture every lane
receives, and a checkpoint/resume round trip through JSON.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from itertools import islice

from zephon import Dataset, StaticMixtureWorkSource

NAME = "demo"
HELP = "show a mixture over synthetic datasets: first chunks, shares per lane, a checkpoint round trip"
WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}


def demo_datasets() -> list[Dataset]:
    """Three synthetic datasets of different shapes (shard counts and sizes)."""
    return [
        Dataset.from_counts("web", [10_000] * 1000),
        Dataset.from_counts("code", [20_000] * 500),
        Dataset.from_counts("math", [5_000] * 200),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options."""
    parser.add_argument("--lanes", type=int, default=4, help="canonical replicas (default 4)")
    parser.add_argument("--chunk-size", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--chunks", type=int, default=25, help="chunks per lane to draw (default 25)")


def _show_first_chunks(lane: StaticMixtureWorkSource) -> None:
    print("First chunks of lane 0 (counts per component, first pointers in read order):")
    for _ in range(3):
        chunk = lane.next_chunk()
        assert chunk is not None  # the demo's stream is long
        head = ", ".join(f"{name}{ptr}" for ptr, name in list(chunk)[:3])
        print(f"  chunk {lane.state.chunk_index - 1}: {chunk.counts}  {head}, ...")


def _show_lane_shares(template: StaticMixtureWorkSource, lanes: int, chunks: int) -> None:
    print(f"\nMixture per lane over {chunks} chunks (target {WEIGHTS}):")
    for lane_id in range(lanes):
        counts: Counter[str] = Counter()
        lane = template.clone_for_lane(lane_id, lanes)
        for chunk in islice(iter(lane.next_chunk, None), chunks):
            counts.update(chunk.counts)
        total = sum(counts.values())
        shares = "  ".join(f"{n}={counts[n] / total:.5f}" for n in WEIGHTS)
        print(f"  lane {lane_id}: {total} pointers  {shares}")


def _show_resume(template: StaticMixtureWorkSource) -> None:
    lane = template.clone_for_lane(0, 1)
    for _ in range(10):
        lane.next_chunk()
    saved = json.dumps(lane.state_dict())
    expected = [lane.next_chunk() for _ in range(5)]
    resumed = template.clone_for_lane(0, 1)
    resumed.load_state_dict(json.loads(saved))
    same = [resumed.next_chunk() for _ in range(5)] == expected
    print(f"\nCheckpoint after 10 chunks: {len(saved)} bytes of JSON; "
          f"resumed stream equals the uninterrupted one: {same}")


def run(args: argparse.Namespace) -> int:
    """Print the demo; returns the exit status."""
    template = StaticMixtureWorkSource(demo_datasets(), WEIGHTS, chunk_size=args.chunk_size, seed=args.seed,
                                       shuffle_within_shard=True, shuffle_block_size="auto")
    print(f"zephon demo: {', '.join(f'{d.name} ({d.shard_count()} shards, {d.total()} samples)' for d in demo_datasets())}")
    print(f"chunk_size={args.chunk_size}, seed={args.seed}, lanes={args.lanes}\n")
    _show_first_chunks(template.clone_for_lane(0, args.lanes))
    _show_lane_shares(template, args.lanes, args.chunks)
    _show_resume(template)
    return 0
