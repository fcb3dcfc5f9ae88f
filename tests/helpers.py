"""Small builders shared by the tests."""
from __future__ import annotations

import json
import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.testing import collect, source_configs
from zephon.work import Phase, PhasedMixtureWorkSource


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


@st.composite
def phased_configs(draw, max_phases: int = 3):
    """Keyword arguments of a finite phased source: a static config whose mixture is replaced by
    1..max_phases phases, each over a random non-empty subset of the datasets."""
    kwargs = draw(source_configs(num_datasets=st.integers(1, 3)))
    names = [d.name for d in kwargs["datasets"]]
    count = draw(st.integers(1, max_phases))
    phases = []
    for k in range(count):
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
        mixture = {n: draw(st.floats(0.05, 1.0)) for n in chosen}
        if k == count - 1:
            phases.append(Phase(mixture))
        elif draw(st.booleans()):
            phases.append(Phase(mixture, until_chunk=draw(st.integers(1, 6)) * (k + 1)))
        else:
            phases.append(Phase(mixture, until_sample=draw(st.integers(1, 60)) * (k + 1)))
    del kwargs["mixture"]
    kwargs["phases"] = phases
    try:
        PhasedMixtureWorkSource(**kwargs).clone_for_lane(0, 1).next_chunk()
    except ValueError:
        assume(False)
    return kwargs


def write_jsonl(directory, shards):
    """One JSONL file of ``{"text": doc}`` lines per shard in a new ``directory``."""
    directory.mkdir()
    for i, docs in enumerate(shards):
        (directory / f"part-{i:03d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return directory
