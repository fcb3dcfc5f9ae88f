"""Real ranks for the tests: processes forked from the test, joined in a gloo process group.

``multiprocessing`` "fork" re-imports nothing, so a run of a few ranks costs well under a
second. A rank runs ``target(rank, world, *args)`` and its JSON result comes back; an
exception in a rank fails the test with that rank's traceback.
"""
import json
import os
import signal
import time
import traceback
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as torch_mp

CTX = torch_mp.get_context("fork")
TIMEOUT = 60


def _child(target, rank, world, init_file, out_file, args):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        result = target(rank, world, *args)
        dist.destroy_process_group()
        with open(out_file, "w") as f:
            json.dump(result, f)
    except BaseException:
        with open(out_file + ".err", "w") as f:
            f.write(traceback.format_exc())
        raise


def start_ranks(target, world, tmp_path, *args, tag="run"):
    init = tmp_path / f"{tag}.init"
    outs = [str(tmp_path / f"{tag}.{rank}.json") for rank in range(world)]
    procs = [CTX.Process(target=_child, args=(target, rank, world, str(init), outs[rank], args))
             for rank in range(world)]
    for p in procs:
        p.start()
    return procs, outs


def wait(proc, deadline):
    """Wait for ``proc`` by its pid (its sentinel may be held open by orphaned DataLoader workers)."""
    while proc.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if proc.exitcode is None:
        proc.kill()
        proc.join()


def finish(procs, outs):
    deadline = time.monotonic() + TIMEOUT
    for p in procs:
        wait(p, deadline)
    errors = [Path(o + ".err").read_text() for o in outs if os.path.exists(o + ".err")]
    assert not errors, "\n".join(errors)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    return [json.loads(Path(o).read_text()) for o in outs]


def run_ranks(target, world, tmp_path, *args, tag="run"):
    return finish(*start_ranks(target, world, tmp_path, *args, tag=tag))


def die_halfway_through_the_next_write():
    """The next checkpoint file this process writes stops halfway, and the process is SIGKILLed."""
    import zephon.io._store as store

    def write_half(path, data):
        with open(f"{path}.killed.zephon-tmp", "wb") as f:
            f.write(data[:len(data) // 2])
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    store.write_atomically = write_half
