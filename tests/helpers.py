"""Small builders shared by the tests."""
from __future__ import annotations

import json
import subprocess
import sys
import numpy as np
from hypothesis import assume, strategies as st

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


MEGATRON_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}


def write_megatron(prefix, docs, dtype="uint16", split=1):
    """A Megatron ``prefix.bin`` / ``prefix.idx`` of ``docs`` (token lists), each written as up to
    ``split`` sequences (an empty document as none); returns the two paths."""
    import struct

    dtype = np.dtype(dtype).newbyteorder("<")
    sequences, starts = [], [0]
    for doc in docs:
        if len(doc):
            sequences.extend(np.array_split(np.asarray(doc, dtype=dtype), min(split, len(doc))))
        starts.append(len(sequences))
    lengths = np.array([len(s) for s in sequences], dtype="<i4")
    pointers = (np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64))) * dtype.itemsize).astype("<i8")
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, MEGATRON_CODES[dtype.name], len(sequences), len(starts))
    bin_path, idx_path = f"{prefix}.bin", f"{prefix}.idx"
    with open(bin_path, "wb") as out:
        out.write(np.concatenate(sequences).astype(dtype).tobytes() if sequences else b"")
    with open(idx_path, "wb") as out:
        out.write(head + lengths.tobytes() + pointers[:len(lengths)].tobytes() + np.array(starts, "<i8").tobytes())
    return bin_path, idx_path


def write_datatrove(path, docs, token_size=2):
    """A datatrove ``path`` (``.ds``) and ``path.index`` of ``docs``."""
    dtype = np.dtype({2: "<u2", 4: "<u4"}[token_size])
    with open(path, "wb") as out:
        out.write(b"".join(np.asarray(d, dtype=dtype).tobytes() for d in docs))
    with open(f"{path}.index", "wb") as out:
        out.write(np.cumsum([len(d) for d in docs], dtype=np.int64).astype("<u8").tobytes())
    return path


def json_leaves(value, path=()):
    """The paths to every scalar and empty container of a JSON value."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from json_leaves(item, path + (key,))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from json_leaves(item, path + (index,))
    else:
        yield path


@st.composite
def accumulator_states(draw, n: int) -> tuple[float, ...]:
    """``n`` accumulators a checkpoint may hold: each >= -1, summing to a value in [-1, 1)
    (here [-0.5, 0.5], clear of the bounds the rounding of later chunks could cross), some above 1;
    or quarters summing to 0 (on the grids where the kernel skips chunks in closed form)."""
    if draw(st.booleans()):
        quarters = draw(st.lists(st.integers(-4, 8), min_size=n - 1, max_size=n - 1))
        assume(sum(quarters) <= 4)
        return tuple(k / 4 for k in quarters) + (-sum(quarters) / 4,)
    parts = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n).filter(any))
    total = n + draw(st.floats(-0.5, 0.5))
    return tuple(-1.0 + p / sum(parts) * total for p in parts)
