"""DataLoader workers die with their trainer; a worker that dies is named; resume is exact (issue #19).

The trainer is a real process (``python trainer.py``) that iterates a ``zt.DataLoader`` with two
workers; the test SIGKILLs it (or one of its workers) from outside, as a scheduler or the OOM
killer would.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

DEADLINE = 5.0  # seconds an orphaned worker may outlive its trainer (the bound)
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

TRAINER = textwrap.dedent("""
    import json, os, sys, time
    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    def make_source():
        return StaticMixtureWorkSource([Dataset.from_counts("a", [4000] * 400), Dataset.from_counts("b", [3000] * 200)],
                                       {"a": 0.6, "b": 0.4}, chunk_size=64, seed=4, exhausted_policy="stop")

    def stall(item):  # a fetch that never returns (once the trainer has its first batches)
        if os.path.exists(sys.argv[2] + ".stall"):
            time.sleep(600)
        return item

    def ids(batch):
        return batch["_sample_id"].tolist()

    if __name__ == "__main__":
        mode, out, context, persistent = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
        pipeline = Pipeline(make_source())
        if mode == "fetch":
            pipeline = pipeline.map(stall)
        loader = zt.DataLoader(pipeline, batch_size=8, num_workers=2, canonical_replicas=4,
                               multiprocessing_context=context, persistent_workers=persistent)
        it = iter(loader)
        head = [ids(next(it)) for _ in range(3)]
        state = loader.state_dict()
        if mode == "fetch":
            open(out + ".stall", "w").close()
        pids = [w.pid for w in it._base._workers]
        with open(out + ".tmp", "w") as f:
            json.dump({"pids": pids, "head": head, "state": state}, f)
        os.rename(out + ".tmp", out)
        if mode != "worker":
            time.sleep(600)  # the pipe fills up (or the workers sit in their fetch) until we are killed
        try:
            while True:
                next(it)
                time.sleep(0.01)  # the training step: most signals arrive here, outside the loader
        except zt.WorkerDiedError as error:
            report = {"worker": error.worker, "pid": error.pid, "lanes": error.lanes, "signal": error.signal,
                      "message": str(error)}
            with open(out + ".died", "w") as f:
                json.dump(report, f)
""")


def make_source():  # big enough that no worker ends its stream (and exits) before the trainer is killed,
    # even with a few bundles of 65,536 samples made ahead
    return StaticMixtureWorkSource([Dataset.from_counts("a", [4000] * 400), Dataset.from_counts("b", [3000] * 200)],
                                   {"a": 0.6, "b": 0.4}, chunk_size=64, seed=4, exhausted_policy="stop")


def alive(pid):
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def start_trainer(tmp_path, mode, context, persistent):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    out, log = tmp_path / "out.json", open(tmp_path / "trainer.log", "w")
    trainer = subprocess.Popen([sys.executable, str(script), mode, str(out), context, "1" if persistent else "0"],
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=log)
    log.close()
    deadline = time.monotonic() + 120
    while not out.exists():
        if trainer.poll() is not None:
            raise AssertionError((tmp_path / "trainer.log").read_text()[-3000:])
        if time.monotonic() > deadline:
            trainer.kill()
            trainer.wait()
            raise AssertionError("the trainer never started its workers")
        time.sleep(0.05)
    return trainer, out, json.loads(out.read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only: alive() tells a zombie from a running worker by /proc/<pid>/stat")
@pytest.mark.parametrize("mode,context,persistent", [("pipe", "fork", False), ("pipe", "spawn", True),
                                                     ("fetch", "fork", True), ("fetch", "spawn", False),
                                                     ("pipe", "forkserver", False)])
def test_workers_die_within_seconds_of_their_trainer(tmp_path, mode, context, persistent):
    trainer, _, report = start_trainer(tmp_path, mode, context, persistent)
    pids = report["pids"]
    running = [alive(p) for p in pids]
    os.kill(trainer.pid, signal.SIGKILL)
    trainer.wait()
    assert len(pids) == 2 and all(running), "the workers were running before the trainer was killed"
    deadline = time.monotonic() + DEADLINE
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [p for p in pids if alive(p)]
    for pid in survivors:  # do not leave them behind whatever happens
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"workers {survivors} outlived their trainer by {DEADLINE} s"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only: alive() tells a zombie from a running worker by /proc/<pid>/stat")
def test_a_killed_worker_is_named_and_the_last_checkpoint_resumes_exactly(tmp_path):
    trainer, out, report = start_trainer(tmp_path, "worker", "fork", False)
    victim = report["pids"][1]
    os.kill(victim, signal.SIGKILL)
    try:
        trainer.wait(timeout=30)
    finally:
        trainer.kill()
        trainer.wait()
    died = json.loads((tmp_path / "out.json.died").read_text())
    assert died["worker"] == 1 and died["pid"] == victim and died["signal"] == "SIGKILL"
    assert died["lanes"] == [2, 3]
    assert f"pid {victim}" in died["message"] and "lanes [2, 3]" in died["message"]
    assert "last checkpoint" in died["message"]
    # the checkpoint taken before the death resumes exactly where the three batches stopped
    full = zt.DataLoader(Pipeline(make_source()), batch_size=8, num_workers=2, canonical_replicas=4)
    expected = [b["_sample_id"].tolist() for b in full]
    resumed = zt.DataLoader(Pipeline(make_source()), batch_size=8, num_workers=2)
    resumed.load_state_dict(report["state"])
    assert report["head"] + [b["_sample_id"].tolist() for b in resumed] == expected


def _frozen(item):
    import gc

    return dict(item, frozen=gc.get_freeze_count())


def test_workers_leave_what_they_inherited_out_of_garbage_collection_and_the_trainer_is_left_alone():
    import gc

    source = StaticMixtureWorkSource([Dataset.from_counts("a", [40] * 4)], {"a": 1.0}, chunk_size=16, seed=1)
    before = gc.get_freeze_count()
    in_workers = zt.DataLoader(Pipeline(source).map(_frozen), batch_size=8, num_workers=2)
    assert all(int(n) > 1000 for batch in in_workers for n in batch["frozen"])  # torch alone is ~10^5 objects
    assert gc.get_freeze_count() == before
    assert {int(n) for batch in zt.DataLoader(Pipeline(source).map(_frozen), batch_size=8)
            for n in batch["frozen"]} == {before}


def _pool(item):
    import pyarrow as pa

    return dict(item, pool=pa.default_memory_pool().backend_name)


def _pools(workers: int, **kwargs) -> set[str]:
    source = StaticMixtureWorkSource([Dataset.from_counts("a", [40] * 4)], {"a": 1.0}, chunk_size=16, seed=1)
    loader = zt.DataLoader(Pipeline(source).map(_pool), batch_size=8, num_workers=workers, **kwargs)
    return {name for batch in loader for name in batch["pool"]}


def _system_pool(worker: int) -> None:
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def test_workers_allocate_arrow_memory_from_jemalloc_unless_a_pool_was_chosen(monkeypatch):
    import pyarrow as pa

    original = pa.default_memory_pool()
    trainer = original.backend_name
    assert _pools(0) == {trainer}  # the trainer's process is left as it is
    switches = trainer == "mimalloc" and "jemalloc" in pa.supported_memory_backends()
    assert _pools(2) == ({"jemalloc"} if switches else {trainer})
    assert pa.default_memory_pool().backend_name == trainer
    assert _pools(2, worker_init_fn=_system_pool) == {"system"}  # a worker_init_fn's choice stands
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")  # the environment chose: workers keep what they have
    assert _pools(2) == {trainer}
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL")
    pa.set_memory_pool(pa.system_memory_pool())  # the trainer's choice: its forked workers keep it
    try:
        assert _pools(2) == {"system"}
    finally:
        pa.set_memory_pool(original)
