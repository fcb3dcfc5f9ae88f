"""Data parallelism inside tensor / pipeline parallel jobs, on real gloo ranks with a DeviceMesh:
the ranks of a replica read identical batches, replicas disjoint ones, their union is the
data-parallel stream; checkpoints are one file per data-parallel rank, written once, and a
job cut mid-run resumes on another layout reading every lane on exactly."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ranks import finish, start_ranks
from torch.distributed.device_mesh import init_device_mesh

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.runtime import merge_states, parse_state
from zephon.runtime._state import missing_lanes
from zephon.testing import assert_parallel_reads, batch_digest

ROOT = Path(__file__).resolve().parents[1]
LANES, BATCH, SAVED_AT, LOST = 8, 4, 3, 2  # the first leg saves after batch 3, reads 2 more, dies


def pipeline() -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_counts("a", [40] * 6), Dataset.from_counts("b", [30] * 4)],
                                     {"a": 0.6, "b": 0.4}, chunk_size=8, seed=4)
    return Pipeline(source)


def samples(batch) -> list[list[int]]:
    return batch["_sample_id"].tolist()


def leg(rank, world, shape, names, dp_dims, directory, state):
    """One rank of a job: its topology, every batch it reads (digest and samples), the step
    folder's files; a first leg (no ``state``) saves after batch ``SAVED_AT`` (a checkpoint
    directory and DCP) and stops ``LOST`` batches later, as if killed; a later leg resumes
    from ``state``, or from DCP (``state == "dcp"``)."""
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    loader = zt.DataLoader(pipeline(), batch_size=BATCH, canonical_replicas=LANES, device_mesh=mesh,
                           dp_dims=dp_dims, even_batches=False)
    if state == "dcp":
        dcp.load({"data": loader}, checkpoint_id=f"{directory}.dcp")
    elif state is not None:
        loader.load_state_dict(state)
    read = []
    for batch in loader:
        read.append((batch_digest(batch), samples(batch)))
        if state is None and len(read) == SAVED_AT:
            zt.save_checkpoint_dir(directory, loader, step=SAVED_AT)
            dcp.save({"data": loader}, checkpoint_id=f"{directory}.dcp")
            if not loader.topology.writes:  # alone, a peer writes nothing
                assert zt.save_checkpoint_dir(f"{directory}.peers", loader, step=SAVED_AT) is False
            gathered = zt.all_gather_state(loader.state_dict())  # the world gathers each replica's lanes once per peer
        if state is None and len(read) == SAVED_AT + LOST:
            break
    dist.barrier()
    files = sorted(name for folder in os.listdir(directory) for name in os.listdir(os.path.join(directory, folder)))
    top = loader.topology
    return {"dp": [top.rank, top.world_size, top.peers, top.writes], "read": read, "files": files,
            "gathered": missing_lanes(parse_state(gathered), range(LANES)) if state is None else None}


def reference(dp_size, state=None):
    """What each data-parallel rank reads, one process per rank (explicit ``dp_rank`` / ``dp_size``)."""
    out = []
    for r in range(dp_size):
        loader = zt.DataLoader(pipeline(), batch_size=BATCH, canonical_replicas=LANES, dp_rank=r, dp_size=dp_size,
                               even_batches=False)
        if state is not None:
            loader.load_state_dict(state)
        out.append([[batch_digest(b), samples(b)] for b in loader])
    return out


def replicas(results, dp_size):
    """Global ranks grouped by the data-parallel rank they reported."""
    return [[g for g, r in enumerate(results) if r["dp"][0] == k] for k in range(dp_size)]


LAYOUTS = [((2, 2), ("dp", "tp"), "dp"), ((2, 2, 2), ("pp", "dp", "tp"), ("dp",)),
           ((2, 2, 2), ("dp_replicate", "dp_shard", "tp"), ("dp_replicate", "dp_shard"))]


@pytest.mark.parametrize("shape, names, dp_dims", LAYOUTS, ids=["dp2xtp2", "pp2xdp2xtp2", "hsdp2x2xtp2"])
def test_replicas_read_alike_within_and_apart_across_and_a_cut_job_resumes_on_another_layout(
        tmp_path, shape, names, dp_dims):
    world = math.prod(shape)
    dims = (dp_dims,) if isinstance(dp_dims, str) else dp_dims
    dp_size = math.prod(shape[names.index(d)] for d in dims)
    directory = str(tmp_path / "ckpt")
    results = finish(*start_ranks(leg, world, tmp_path, shape, names, dp_dims, directory, None, tag="first"))
    assert sorted(r["dp"][:2] for r in results) == sorted([k, dp_size] for k in range(dp_size)
                                                         for _ in range(world // dp_size))
    assert all(r["dp"][2] == world // dp_size for r in results)
    groups = replicas(results, dp_size)
    assert [sum(results[g]["dp"][3] for g in group) for group in groups] == [1] * dp_size  # one writer each
    whole = reference(dp_size)
    reads = {g: [d for d, _ in r["read"]] for g, r in enumerate(results)}
    assert_parallel_reads(reads, groups, [d for rank in whole for d, _ in rank[:SAVED_AT + LOST]])
    files = results[0]["files"]
    assert files[0] == "complete.ckpt" and [f[:19] for f in files[1:]] == [f"rank-{k:05d}-of-{dp_size:05d}"
                                                                          for k in range(dp_size)]
    assert not os.path.exists(f"{directory}.peers")
    assert all(r["gathered"] == [] for r in results)  # every lane, though peers sent theirs twice over

    state = zt.load_checkpoint_dir(directory)
    first = [s for group in groups for _, batch in results[group[0]]["read"][:SAVED_AT] for s in batch]
    everything = [s for rank in whole for _, batch in rank for s in batch]
    for after in (2, 4):  # DP 2 x TP 1 and DP 4 x TP 1
        resumed = finish(*start_ranks(leg, after, tmp_path, (after, 1), ("dp", "tp"), "dp", directory, state,
                                      tag=f"dp{after}"))
        assert [r["read"] for r in sorted(resumed, key=lambda r: r["dp"][0])] == reference(after, state)
        from_dcp = finish(*start_ranks(leg, after, tmp_path, (after, 1), ("dp", "tp"), "dp", directory, "dcp",
                                       tag=f"dcp{after}"))
        assert sorted(r["read"] for r in from_dcp) == sorted(r["read"] for r in resumed)
        second = [s for r in resumed for _, batch in r["read"] for s in batch]
        assert sorted(first + second) == sorted(everything)  # nothing lost, nothing read twice


def test_a_layout_is_named_when_it_is_wrong():
    with pytest.raises(ValueError, match="device_mesh"):
        zt.DataLoader(pipeline(), device_mesh=object())
    with pytest.raises(ValueError, match="one of"):
        zt.DataLoader(pipeline(), dp_rank=0, dp_size=2, rank=0, world_size=2)
    with pytest.raises(ValueError, match="do not fit"):
        zt.DataLoader(pipeline(), dp_rank=2, dp_size=2)


def _example():
    spec = importlib.util.spec_from_file_location("train_parallel", ROOT / "examples" / "train_parallel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torchrun(world, *args, check=True):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(world), str(ROOT / "examples" / "train_parallel.py"), *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 or not check, done.stderr[-3000:]


def _seen(folder, world):
    return {rank: (folder / f"seen.{rank}").read_text().splitlines() for rank in range(world)}


def test_torchrun_jobs_with_tensor_and_pipeline_parallelism_read_per_replica_and_resume_elastically(tmp_path):
    """The example under torchrun: DP 2 x TP 2 to the end; PP 2 x DP 2 x TP 2 killed at step 6
    (checkpoint at step 4); resumed on DP 2 x TP 1 and DP 4 x TP 1, each to the end."""
    example = _example()

    def loaders(dp_size, state=None):
        for r in range(dp_size):
            loader = zt.DataLoader(example.pipeline(), batch_size=8, canonical_replicas=16, dp_rank=r, dp_size=dp_size)
            if state is not None:
                loader.load_state_dict(state)
            yield loader

    def reference(dp_size, state=None):
        return [[json.dumps(batch["_sample_id"].tolist()) for batch in loader] for loader in loaders(dp_size, state)]

    def after_four_steps():
        states = []
        for loader in loaders(2):
            batches = iter(loader)
            for _ in range(4):
                next(batches)
            states.append(loader.state_dict())
        return merge_states(states)

    _torchrun(4, "--mesh", "dp=2,tp=2", "--out", str(tmp_path / "whole"))
    whole = reference(2)
    assert_parallel_reads(_seen(tmp_path / "whole", 4), [[0, 1], [2, 3]], [b for rank in whole for b in rank])
    _torchrun(8, "--mesh", "pp=2,dp=2,tp=2", "--out", str(tmp_path / "cut"), "--crash-at", "6", check=False)
    cut = _seen(tmp_path / "cut", 8)
    replicas = [[0, 1, 4, 5], [2, 3, 6, 7]]  # rank = 4 pp + 2 dp + tp
    assert_parallel_reads(cut, replicas, [b for rank in whole for b in rank[:6]])
    state = zt.load_checkpoint_dir(tmp_path / "cut" / "ckpt")
    assert parse_state(state).topology["world_size"] == 2  # a state per data-parallel rank
    assert state == after_four_steps()  # the lanes where the job stood at step 4, every one
    for dp in (2, 4):
        _torchrun(dp, "--mesh", f"dp={dp},tp=1", "--out", str(tmp_path / f"dp{dp}"), "--resume",
                  str(tmp_path / "cut" / "ckpt"))
        resumed = _seen(tmp_path / f"dp{dp}", dp)
        assert [resumed[r] for r in range(dp)] == reference(dp, state)  # each lane continues from there


def test_explicit_data_parallel_numbers_take_the_rest_of_the_world_as_peers(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert zt.detect_topology(dp_rank=1, dp_size=2) == zt.Topology(1, 2, 1, "explicit", peers=4, writes=True)
    assert zt.detect_topology() == zt.Topology(5, 8, 1, "environment")
    loader = zt.DataLoader(pipeline(), batch_size=BATCH, canonical_replicas=LANES, dp_rank=1, dp_size=2)
    assert loader.lanes() == [4, 5, 6, 7]  # the second half, as rank 1 of 2


def replicated(rank, world, replicate, workers):
    """A DP 2 x TP 2 rank reading with ``replicate``: its batches' digests, its state after
    batch 3 and at the end, and its stats."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    loader = zt.DataLoader(pipeline(), batch_size=BATCH, canonical_replicas=LANES, device_mesh=mesh,
                           replicate=replicate, num_workers=workers)
    read, states = [], []
    for batch in loader:
        read.append(batch_digest(batch))
        if len(read) == 3:
            states.append(loader.state_dict())
    return {"read": read, "states": [*states, loader.state_dict()], "stats": loader.stats()}


def test_broadcast_replicas_receive_the_batches_computing_replicas_read(tmp_path):
    computed = finish(*start_ranks(replicated, 4, tmp_path, "compute", 0, tag="compute"))
    sent = finish(*start_ranks(replicated, 4, tmp_path, "broadcast", 1, tag="broadcast"))
    assert [r["read"] for r in sent] == [r["read"] for r in computed]
    for first, peer in ((0, 1), (2, 3)):  # rank = 2 dp + tp
        assert sent[peer]["states"] == sent[first]["states"] and sent[peer]["stats"] == sent[first]["stats"]
        assert [parse_state(s).entries for s in sent[first]["states"]] == \
            [parse_state(s).entries for s in computed[first]["states"]]
    with pytest.raises(ValueError, match="needs device_mesh"):
        zt.DataLoader(pipeline(), replicate="broadcast", dp_rank=0, dp_size=1)
    with pytest.raises(ValueError, match="replicate="):
        zt.DataLoader(pipeline(), replicate="scatter")


def replicated_text(rank, world, replicate, directory):
    """A DP 2 x TP 2 rank reading Parquet text in its own process with ``replicate``: its
    batches (a replica's first rank sends them still as bytes, made ``str`` where handed out)."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    datasets = [Dataset.from_path(name, Path(directory) / name, catalog_dir=Path(directory) / f"catalog{rank}")
                for name in ("a", "b")]
    source = StaticMixtureWorkSource(datasets, {"a": 0.6, "b": 0.4}, chunk_size=8, seed=4, shuffle_within_shard=True)
    loader = zt.DataLoader(Pipeline(source, columns=["text"]), batch_size=BATCH, canonical_replicas=LANES,
                           device_mesh=mesh, replicate=replicate, even_batches=False)
    texts = [batch["text"] for batch in loader]
    assert all(type(text) is list and all(type(t) is str for t in text) for text in texts)  # not bytes left unmade
    return texts


def test_broadcast_replicas_receive_the_text_computing_replicas_read(tmp_path):
    for name, rows in (("a", 60), ("b", 40)):
        (tmp_path / name).mkdir()
        for s in range(2):
            pq.write_table(pa.table({"text": [f"{name}{s}-{i}" for i in range(rows)]}),
                           tmp_path / name / f"{s}.parquet", row_group_size=16)
    computed = finish(*start_ranks(replicated_text, 4, tmp_path, "compute", str(tmp_path), tag="compute"))
    sent = finish(*start_ranks(replicated_text, 4, tmp_path, "broadcast", str(tmp_path), tag="broadcast"))
    assert sent == computed
    read = [t for batches in computed[0] + computed[2] for t in batches]  # the two replicas read every row once
    assert len(read) == len(set(read)) == 200


def broadcast_on_a_part(rank, world):
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    try:
        zt.DataLoader(pipeline(), device_mesh=mesh["dp", "tp"], replicate="broadcast")
    except ValueError as error:
        return str(error)
    return None


def test_broadcast_over_a_part_of_the_job_is_refused_on_every_rank(tmp_path):
    said = finish(*start_ranks(broadcast_on_a_part, 8, tmp_path, tag="part"))
    assert all(s is not None and "the mesh of the whole job (8 ranks), not a part of it (4 ranks)" in s for s in said)


def test_a_stream_dataset_reads_per_data_parallel_rank_too():
    whole = [item["_sample_id"] for item in pipeline().to_torch_dataset(canonical_replicas=LANES)]
    halves = [[item["_sample_id"] for item in pipeline().to_torch_dataset(canonical_replicas=LANES, dp_rank=r,
                                                                          dp_size=2)] for r in range(2)]
    places = [(t.rank, t.world_size) for t in (pipeline().to_torch_dataset(dp_rank=r, dp_size=2).topology
                                                for r in range(2))]
    assert places == [(0, 2), (1, 2)] and halves[0] != halves[1] and sorted(halves[0] + halves[1]) == sorted(whole)
