"""Small builders shared by the tests."""
from __future__ import annotations

import json
import subprocess
import sys
import numpy as np

from zephon import Dataset, StaticMixtureWorkSource
from zephon.testing import collect


def pointers_of(chunks, name=None) -> list[tuple[int, int, int]]:
    """All pointers of ``chunks`` in storage order (of one component, if ``name``)."""
    out = []
    for chunk in chunks:
        for component, array in chunk.components.items():
            if name is None or component == name:
                out.extend(map(tuple, array.tolist()))
    return out


def lane_stream(kwargs: dict, lane: int = 0, replicas: int = 1, max_chunks: int = 1000):
    return collect(StaticMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas), max_chunks)


def three_datasets(scale: int = 1) -> list[Dataset]:
    return [
        Dataset.from_counts("web", [100 * scale] * 10),
        Dataset.from_counts("code", [40 * scale] * 5 + [0, 7]),
        Dataset.from_counts("math", np.arange(1, 9) * scale),
    ]


def lane_streams(source, replicas: int) -> dict[int, list[tuple[int, int, int]]]:
    """Every lane's whole stream of pointers, in read order."""
    out = {}
    for lane in range(replicas):
        clone, pointers = source.clone_for_lane(lane, replicas), []
        while (chunk := clone.next_chunk()) is not None:
            pointers.extend(map(tuple, chunk.read_order()[0].tolist()))
        out[lane] = pointers
    return out


def write_jsonl(directory, shards):
    """One JSONL file of ``{"text": doc}`` lines per shard in a new ``directory``."""
    directory.mkdir()
    for i, docs in enumerate(shards):
        (directory / f"part-{i:03d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return directory


def finite_mixture():
    """Three datasets mixed 5:3:2 that stop when one runs out: no sample repeats, so a pointer names its lane."""
    datasets = [Dataset.from_counts("web", [60] * 6), Dataset.from_counts("code", [45] * 4),
                Dataset.from_counts("math", [30] * 2)]
    return StaticMixtureWorkSource(datasets, {"web": 0.5, "code": 0.3, "math": 0.2}, chunk_size=16, seed=21,
                                   exhausted_policy="stop")


def sample_ids(batch) -> list[tuple[int, int, int]]:
    """The pointers of a loader's batch."""
    return list(map(tuple, batch["_sample_id"].tolist()))


def run_inspect(path) -> list[str]:
    """``zephon inspect path``'s lines, run as a user runs it (it must exit 0)."""
    done = subprocess.run([sys.executable, "-m", "zephon", "inspect", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()
