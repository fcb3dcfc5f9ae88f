"""Checkpoints without a collective, on real ranks (gloo): a checkpoint directory with a rank
killed during a save, and torch.distributed.checkpoint (saved on 2 ranks, loaded on 3).

Every job uses the default lane count (16 for the first job's 2 ranks x 1 worker), which the
checkpoint fixes; each resume reads to the end, so per lane the first job's batches up to the
checkpoint and the second job's must be the lane's whole uninterrupted stream.
"""
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers import finite_mixture as make_source
from helpers import lane_streams
from helpers import sample_ids as ids
from ranks import TIMEOUT, die_halfway_through_the_next_write, finish, run_ranks, start_ranks, wait

import zephon.torch as zt
from zephon import Pipeline

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning",
                                        "ignore:'set_vital' is deprecated:UserWarning")
EVERY, KILLED_AT, STEPS = 2, 6, 12


def saving_leg(rank, world, directory, seen_file):
    """Save every EVERY steps into the directory (no collective); rank 1 dies in its save of step KILLED_AT."""
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=1)
    seen = []
    for step, batch in enumerate(loader, start=1):
        seen.append(ids(batch))
        if step % EVERY == 0:
            if rank == 1 and step == KILLED_AT:
                Path(seen_file).write_text(json.dumps(seen))
                die_halfway_through_the_next_write()
            zt.save_checkpoint_dir(directory, loader, step=step)
        if step == STEPS:
            break
    return {"seen": seen}


def resuming_leg(rank, world, directory):
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=3, num_workers=2, even_batches=False)
    loader.load_state_dict(zt.load_checkpoint_dir(directory))
    return {"step": zt.complete_steps(directory)[-1], "replicas": loader.canonical_replicas,
            "seen": [p for batch in loader for p in ids(batch)]}


def assert_every_lane_exact(replicas, first, second):
    """Per lane, ``first`` (batches of the first job up to the checkpoint) then ``second`` are its whole stream."""
    reference = lane_streams(make_source(), replicas)
    owner = {p: lane for lane, pointers in reference.items() for p in pointers}
    per_lane = {lane: [] for lane in reference}
    for p in [tuple(p) for batches in first for batch in batches for p in batch] + [tuple(p) for p in second]:
        per_lane[owner[p]].append(p)
    assert per_lane == reference


def test_ranks_save_without_a_collective_and_a_rank_killed_mid_save_resumes_on_three(tmp_path):
    directory, seen_file = tmp_path / "ckpt", tmp_path / "rank1.seen"
    procs, outs = start_ranks(saving_leg, 2, tmp_path, str(directory), str(seen_file), tag="save")
    wait(procs[1], time.monotonic() + TIMEOUT)
    assert procs[1].exitcode == -signal.SIGKILL
    (rank0,) = finish(procs[:1], outs[:1])
    assert len(rank0["seen"]) == STEPS, "rank 0 went on saving: nothing waited for the dead rank"
    assert zt.complete_steps(directory) == [2, 4]
    steps = sorted(int(name[5:17]) for name in os.listdir(directory))
    assert steps == [2, 4, 6, 8, 10, 12], "rank 0's later steps are there, incomplete"
    second = run_ranks(resuming_leg, 3, tmp_path, str(directory), tag="resume")
    assert {r["step"] for r in second} == {4} and {r["replicas"] for r in second} == {16}
    rank1 = json.loads(seen_file.read_text())
    assert_every_lane_exact(16, [rank0["seen"][:4], rank1[:4]], [p for r in second for p in r["seen"]])


def dcp_saving_leg(rank, world, path, asynchronous):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=1)
    it = iter(loader)
    seen = [ids(next(it)) for _ in range(4 + rank)]  # the ranks stand at different steps
    state = {"model": model.state_dict(), "data": loader}
    if asynchronous:
        dcp.async_save(state, checkpoint_id=path).result()
    else:
        dcp.save(state, checkpoint_id=path)
    return {"seen": seen, "weight": model.weight.tolist()}


def dcp_loading_leg(rank, world, path):
    model = torch.nn.Linear(3, 1)
    torch.nn.init.zeros_(model.weight)
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=3, num_workers=2, even_batches=False)
    dcp.load({"model": model.state_dict(), "data": loader}, checkpoint_id=path)
    return {"replicas": loader.canonical_replicas, "weight": model.weight.tolist(),
            "seen": [p for batch in loader for p in ids(batch)]}


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_dcp_checkpoint_saved_on_two_ranks_loads_on_three_with_every_lane_exact(tmp_path, asynchronous):
    path = str(tmp_path / "dcp")
    first = run_ranks(dcp_saving_leg, 2, tmp_path, path, asynchronous, tag="dcp-save")
    second = run_ranks(dcp_loading_leg, 3, tmp_path, path, tag="dcp-load")
    assert {r["replicas"] for r in second} == {16}, "the lane count came from the checkpoint"
    assert all(r["weight"] == first[0]["weight"] for r in second), "the model loads beside the loader"
    assert_every_lane_exact(16, [r["seen"] for r in first], [p for r in second for p in r["seen"]])
