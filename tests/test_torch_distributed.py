"""Real multi-process runs over torch.distributed (gloo): elastic resume and crash-safe saves (issue #5).

Ranks are processes forked from the test (``multiprocessing`` "fork": no re-import of torch,
so a run costs well under a second); each rank runs a zephon DataLoader with real worker
processes and joins a gloo process group, exactly as under ``torchrun``.

Scenario: 2 ranks x 2 workers read a few batches, checkpoint mid-chunk (all_gather_state on
every rank, save_checkpoint on rank 0), then the run resumes from the file as 1 rank x 3
workers and, separately, as 4 ranks x 1 worker: each lane's stream must equal the
uninterrupted single-process run and the union over ranks must miss and repeat nothing.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import finite_mixture as make_source  # the name the torchrun script imports
from helpers import lane_streams
from helpers import sample_ids as ids
from ranks import TIMEOUT, run_ranks, start_ranks, wait

import zephon.torch as zt
from zephon import Pipeline
from zephon.runtime import parse_state, worker_lanes

REPLICAS = 4
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning",
                                        "ignore:'set_vital' is deprecated:UserWarning")


# -- rank programs (run inside the forked rank processes) ----------------------------------------


def first_leg(rank, world, path, batches):
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=2, canonical_replicas=REPLICAS)
    assert loader.topology.origin == "torch.distributed" and loader.topology.world_size == world
    it = iter(loader)
    seen = [p for _ in range(batches) for p in ids(next(it))]
    state = zt.all_gather_state(loader.state_dict())
    if rank == 0:
        zt.save_checkpoint(path, state)
    dist.barrier()
    return {"seen": seen, "lanes": loader.lanes(), "state": state}


def second_leg(rank, world, path, workers, mapping):
    state = zt.load_checkpoint(path)
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=3, num_workers=workers, mapping=mapping,
                           even_batches=False)
    loader.load_state_dict(state)
    seen = [p for batch in loader for p in ids(batch)]
    dist.barrier()
    return {"seen": seen, "lanes": loader.lanes(), "replicas": loader.canonical_replicas}


def saver_killed_mid_save(rank, world, path, marker):
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=2, canonical_replicas=REPLICAS)
    it = iter(loader)
    for _ in range(3):
        next(it)
    first = zt.all_gather_state(loader.state_dict())
    if rank == 0:
        zt.save_checkpoint(path, first)
    dist.barrier()
    for _ in range(3):
        next(it)
    second = zt.all_gather_state(loader.state_dict())
    if rank == 0:
        import zephon.runtime._checkpoint as checkpoint

        def stall(fd):  # the new file is written, not yet renamed: the worst moment to die
            open(marker, "w").close()
            time.sleep(TIMEOUT)

        checkpoint.os.fsync = stall
        zt.save_checkpoint(path, second)
        raise AssertionError("rank 0 should have been killed during save_checkpoint")
    return {"first": first, "second": second}


def stepping(loader):
    """Iterate ``loader`` as a DDP job does: an all-reduce after every batch, no Join."""
    count, seen = 0, []
    for batch in loader:
        seen += ids(batch)
        flag = torch.ones(1)
        dist.all_reduce(flag)  # would hang if another rank had ended
        count += 1
    return count, seen


def even_first_leg(rank, world, path, cut):
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=2, canonical_replicas=7)
    length, count, seen = len(loader), 0, []
    for batch in loader:
        seen += ids(batch)
        flag = torch.ones(1)
        dist.all_reduce(flag)
        count += 1
        if count == cut:
            own = loader.state_dict()
            state = zt.all_gather_state(own)
            if rank == 0:
                zt.save_checkpoint(path, state)
            zt.save_checkpoint(f"{path}.rank{rank}", own)
    return {"len": length, "count": count, "seen": seen, "stats": loader.stats()}


def even_own_state_leg(rank, world, path):
    """Resume each rank from its own state: the step count comes from an all-reduce."""
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=2)
    loader.load_state_dict(zt.load_checkpoint(f"{path}.rank{rank}"))
    length = len(loader)
    count, seen = stepping(loader)
    return {"len": length, "count": count, "seen": seen}


def even_second_leg(rank, world, path, workers):
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=4, num_workers=workers)
    loader.load_state_dict(zt.load_checkpoint(path))
    length = len(loader)
    count, seen = stepping(loader)
    readers = [worker_lanes(loader.lanes(), w, workers, "contiguous") for w in range(workers)]
    return {"len": length, "count": count, "seen": seen, "readers": readers, "replicas": loader.canonical_replicas}


# -- tests ------------------------------------------------------------------------------------


def test_three_ranks_take_equal_steps_then_two_after_an_elastic_resume(tmp_path):
    path = tmp_path / "checkpoint"
    first = run_ranks(even_first_leg, 3, tmp_path, str(path), 4, tag="even")
    assert len({r["len"] for r in first}) == 1 and [r["count"] for r in first] == [r["len"] for r in first]
    held = [r["stats"]["even_batches"]["held_back_batches"] for r in first]
    assert any(held) and min(held) == 0, "the lanes give the ranks different lengths; the surplus is held back"
    same = run_ranks(even_own_state_leg, 3, tmp_path, str(path), tag="even3")
    # len() is the length of the epoch resumed into: the 4 batches before the state and the rest
    assert [r["len"] for r in same] == [first[0]["len"]] * 3 and [r["count"] for r in same] == [first[0]["len"] - 4] * 3
    assert [r["seen"] for r in same] == [r["seen"][4 * 5:len(r["seen"])] for r in first]
    second = run_ranks(even_second_leg, 2, tmp_path, str(path), 2, tag="even2")
    assert len({r["len"] for r in second}) == 1 and [r["count"] + 4 for r in second] == [r["len"] for r in second]
    reference = lane_streams(make_source(), 7)
    owner = {p: lane for lane, pointers in reference.items() for p in pointers}
    head = [tuple(p) for r in first for p in r["seen"][:4 * 5]]
    seen = head + [tuple(p) for r in second for p in r["seen"]]
    assert len(seen) == len(set(seen))
    for lane, pointers in reference.items():  # every lane continues exactly: a prefix of its stream
        mine = [p for p in seen if owner[p] == lane]
        assert mine == pointers[:len(mine)]


def test_the_default_lane_count_serves_four_ranks_grown_from_one(tmp_path):
    path = tmp_path / "checkpoint"
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=2)
    it = iter(loader)
    head = [p for _ in range(3) for p in ids(next(it))]
    zt.save_checkpoint(path, loader.state_dict())
    assert loader.canonical_replicas == 16
    grown = run_ranks(even_second_leg, 4, tmp_path, str(path), 2, tag="grown")
    assert all(r["replicas"] == 16 for r in grown)
    assert all(len(lanes) == 2 for r in grown for lanes in r["readers"])  # no idle reader
    assert len({r["count"] for r in grown}) == 1 and [r["count"] + 3 for r in grown] == [r["len"] for r in grown]
    seen = [tuple(p) for p in head] + [tuple(p) for r in grown for p in r["seen"]]
    assert len(seen) == len(set(seen))





@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    path = tmp / "checkpoint"
    results = run_ranks(first_leg, 2, tmp, str(path), 7, tag="first")
    return tmp, path, results


def test_first_leg_checkpoints_mid_chunk_on_two_ranks(first_run):
    _, path, results = first_run
    assert [r["lanes"] for r in results] == [[0, 1], [2, 3]]
    state = zt.load_checkpoint(path)
    assert state == results[0]["state"] == results[1]["state"]  # all_gather_state gives everyone the same
    assert sorted(parse_state(state).entries) == [0, 1, 2, 3]
    assert state["topology"]["ranks"] == [0, 1]
    assert any(0 < entry[1] < 16 for entry in parse_state(state).entries.values()), "the checkpoint is mid-chunk"


@pytest.mark.parametrize("world,workers,mapping", [(1, 3, "contiguous"), (4, 1, "interleaved")])
def test_resume_on_another_topology_continues_every_lane(first_run, world, workers, mapping):
    tmp, path, first = first_run
    second = run_ranks(second_leg, world, tmp, str(path), workers, mapping, tag=f"second{world}")
    assert all(r["replicas"] == REPLICAS for r in second)
    assert sorted(lane for r in second for lane in r["lanes"]) == list(range(REPLICAS))
    seen = [tuple(p) for r in first for p in r["seen"]] + [tuple(p) for r in second for p in r["seen"]]
    reference = lane_streams(make_source(), REPLICAS)
    owner = {p: lane for lane, pointers in reference.items() for p in pointers}
    assert len(seen) == len(set(seen)) == len(owner) and set(seen) == set(owner)  # nothing missing or repeated
    # per lane: the first leg's samples, then the second leg's, in the order they came
    per_lane = {lane: [] for lane in reference}
    for r in first + second:
        for p in r["seen"]:
            per_lane[owner[tuple(p)]].append(tuple(p))
    assert per_lane == reference


def test_a_rank_killed_during_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    path, marker = tmp_path / "checkpoint", tmp_path / "saving"
    procs, outs = start_ranks(saver_killed_mid_save, 2, tmp_path, str(path), str(marker), tag="kill")
    deadline = time.monotonic() + TIMEOUT
    while not marker.exists():
        assert time.monotonic() < deadline and procs[0].is_alive(), "rank 0 never reached the save"
        time.sleep(0.02)
    os.kill(procs[0].pid, signal.SIGKILL)
    wait(procs[0], deadline)
    assert procs[0].exitcode == -signal.SIGKILL
    wait(procs[1], deadline)
    assert procs[1].exitcode == 0
    result = json.loads(Path(outs[1]).read_text())
    leftovers = [name for name in os.listdir(tmp_path) if name.startswith("checkpoint.")]
    assert leftovers, "the interrupted save left its temporary file behind"
    state = zt.load_checkpoint(path)
    assert state == result["first"] and state != result["second"]
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5)
    loader.load_state_dict(state)  # and it restores
    assert loader.canonical_replicas == REPLICAS


TORCHRUN_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist
    import zephon.torch as zt
    from zephon import Pipeline
    sys.path.insert(0, sys.argv[3])
    from test_torch_distributed import make_source

    before = zt.detect_topology()  # torchrun's environment, before any process group
    assert before.origin == "environment" and before.world_size == 3, before
    dist.init_process_group("gloo")
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=2, canonical_replicas=7)
    assert loader.topology.origin == "torch.distributed"
    length, seen, count = len(loader), [], 0
    for batch in loader:  # an all-reduce after every batch and no Join: equal steps or a hang
        seen += batch["_sample_id"].tolist()
        dist.all_reduce(torch.ones(1))
        count += 1
        if count == 4:
            state = zt.all_gather_state(loader.state_dict())
            if dist.get_rank() == 0:
                zt.save_checkpoint(sys.argv[1], state)
    with open(sys.argv[2] + str(dist.get_rank()), "w") as f:
        json.dump({"seen": seen[:20], "rank": before.rank, "local_rank": before.local_rank, "len": length,
                   "count": count}, f)
    dist.destroy_process_group()
""")


def test_torchrun_launch_takes_equal_steps_and_checkpoints(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "3", str(script), str(tmp_path / "ckpt"),
                           str(tmp_path / "seen"), os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [json.loads((tmp_path / f"seen{rank}").read_text()) for rank in range(3)]
    assert [(r["rank"], r["local_rank"]) for r in runs] == [(0, 0), (1, 1), (2, 2)]
    assert len({r["count"] for r in runs}) == 1 and [r["len"] for r in runs] == [r["count"] for r in runs]
    seen = [tuple(p) for r in runs for p in r["seen"]]  # the first 4 batches of every rank
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=7, num_workers=2, even_batches=False)
    loader.load_state_dict(zt.load_checkpoint(tmp_path / "ckpt"))  # 3 ranks -> 1 process
    seen += [p for batch in loader for p in ids(batch)]
    reference = lane_streams(make_source(), 7)
    owner = {p: lane for lane, pointers in reference.items() for p in pointers}
    assert sorted(seen) == sorted(owner)
    assert {lane: [p for p in seen if owner[p] == lane] for lane in reference} == reference
