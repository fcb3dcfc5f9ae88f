"""``python -m zephon``: a demo of a mixture over synthetic datasets, end to end.

Builds three count-only datasets, shows the first chunks of lane 0, the mixture every lane
receives, and a checkpoint/resume round trip through JSON.

``zephon catalog build URI [--out PATH]`` builds the shard catalog of a dataset directory
(local or in object storage) and publishes it next to the data, or writes it to ``PATH``.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from itertools import islice

from zephon import Dataset, StaticMixtureWorkSource

WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}


def demo_datasets() -> list[Dataset]:
    """Three synthetic datasets of different shapes (shard counts and sizes)."""
    return [
        Dataset.from_counts("web", [10_000] * 1000),
        Dataset.from_counts("code", [20_000] * 500),
        Dataset.from_counts("math", [5_000] * 200),
    ]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m zephon", description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=4, help="canonical replicas (default 4)")
    parser.add_argument("--chunk-size", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--chunks", type=int, default=25, help="chunks per lane to draw (default 25)")
    return parser.parse_args(argv)


def _show_first_chunks(lane: StaticMixtureWorkSource) -> None:
    print("First chunks of lane 0 (counts per component, first pointers in read order):")
    for _ in range(3):
        chunk = lane.next_chunk()
        assert chunk is not None  # the demo's datasets repeat forever
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


def catalog_main(argv: list[str]) -> int:
    """``zephon catalog build URI [--out PATH]``: build and publish a dataset's catalog."""
    from zephon.io import build_catalog

    parser = argparse.ArgumentParser(prog="zephon catalog", description="Shard catalogs of dataset directories.")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build the catalog of URI and publish it next to the data",
                                description="Build the catalog of a dataset directory (a path, s3://, gs://, "
                                            "abfs://, hdfs:// URI) and publish it as URI/.zephon-catalog.json, "
                                            "or write it to --out.")
    build.add_argument("uri", help="the dataset directory")
    build.add_argument("--out", default=None, help="write the catalog to this local path instead")
    build.add_argument("--format", default=None, dest="fmt", help="parquet, jsonl or arrow (default: detect)")
    args = parser.parse_args(argv)
    try:
        written = build_catalog(args.uri, args.out, fmt=args.fmt, progress=None)
    except (ValueError, OSError) as error:
        print(f"zephon catalog build: error: {error}", file=sys.stderr)
        return 2
    print(f"zephon: catalog of {args.uri} written to {written}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["catalog"]:
        return catalog_main(argv[1:])
    args = _arguments(argv)
    template = StaticMixtureWorkSource(demo_datasets(), WEIGHTS, chunk_size=args.chunk_size, seed=args.seed,
                                       shuffle_within_shard=True, shuffle_block_size="auto")
    print(f"zephon demo: {', '.join(f'{d.name} ({d.shard_count()} shards, {d.total()} samples)' for d in demo_datasets())}")
    print(f"chunk_size={args.chunk_size}, seed={args.seed}, lanes={args.lanes}\n")
    _show_first_chunks(template.clone_for_lane(0, args.lanes))
    _show_lane_shares(template, args.lanes, args.chunks)
    _show_resume(template)
    return 0
