"""Checkpoint directories under failure: a save killed at every stage of its work, two ranks
completing a step at the same instant, a full and a read-only disk. The complete steps always
stay loadable, and ``load_checkpoint_dir`` picks the newest complete one."""
import errno
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

import zephon.torch as zt
from zephon.io import Store
from zephon.runtime import merge_states
from test_checkpoint_dir import ranks, step_all

STAGES = [(Store, "listing"), (Store, "read"), (Store, "write"), (Store, "remove"),
          (os, "replace"), (os, "fsync"), (os, "unlink"), (os, "rmdir"), (shutil, "rmtree")]


def two_steps():
    """Two ranks' states after one step and after two, and their merged states."""
    loaders, its = ranks(2, 4)
    step_all(its)
    first = [loader.state_dict() for loader in loaders]
    step_all(its)
    second = [loader.state_dict() for loader in loaders]
    return first, second, merge_states(first), merge_states(second)


def kill_at(event):
    """From now on, count the stages this process reaches (each file-system call a save makes)
    and SIGKILL it on reaching stage ``event``."""
    count = [0]

    def wrapped(owner, name, original):
        def stage(*args, **kwargs):
            count[0] += 1
            if count[0] == event:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        setattr(owner, name, stage)

    for owner, name in STAGES:
        wrapped(owner, name, getattr(owner, name))


def killed_save(directory, state, event):
    """Save ``state`` as step 2 (keep=1) in a forked process killed at stage ``event``;
    whether the kill came before the save was over."""
    pid = os.fork()
    if pid == 0:
        finished = False
        try:
            kill_at(event)
            zt.save_checkpoint_dir(directory, state, step=2, keep=1)
            finished = True
        finally:
            os._exit(0 if finished else 1)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, f"the save raised at stage {event}"
    return False


@pytest.mark.parametrize("saver", [0, 1])
def test_a_save_killed_at_every_stage_leaves_the_newest_complete_step_loadable(tmp_path, saver):
    """Rank 0 saves step 2 first; rank 1's save then completes it and removes step 1. Killed at
    any stage of either, the directory loads a whole step, and saving again completes step 2."""
    first, second, merged_first, merged_second = two_steps()
    template = tmp_path / "template"
    for state in first:
        zt.save_checkpoint_dir(template, state, step=1)
    if saver == 1:
        zt.save_checkpoint_dir(template, second[0], step=2)
    event = 1
    while True:
        directory = tmp_path / f"killed-{event}"
        shutil.copytree(template, directory)
        if not killed_save(directory, second[saver], event):
            break
        loaded = zt.load_checkpoint_dir(directory)
        assert loaded == (merged_second if 2 in zt.complete_steps(directory) else merged_first), event
        for state in second[saver:]:
            zt.save_checkpoint_dir(directory, state, step=2, keep=1)
        assert zt.load_checkpoint_dir(directory) == merged_second, event
        event += 1
    assert event > (5, 12)[saver]  # the save went through that many stages, each of them killed once


def _complete_at_once(directory, state, barrier, out):
    """Save ``state``; once its file is written, wait for the other rank's, so that both list
    the folder with both files there and both write the marker."""
    write = Store.write

    def write_then_wait(self, name, data):
        write(self, name, data)
        if "rank-" in name:
            barrier.wait(timeout=30)

    Store.write = write_then_wait
    out.put(zt.save_checkpoint_dir(directory, state, step=2, keep=1))


def test_two_ranks_completing_a_step_at_once_both_mark_it_and_it_loads(tmp_path):
    first, second, _, merged_second = two_steps()
    context = multiprocessing.get_context("fork")
    for attempt in range(3):
        directory = tmp_path / f"run-{attempt}"
        for state in first:
            zt.save_checkpoint_dir(directory, state, step=1)
        barrier, out = context.Barrier(2), context.Queue()
        procs = [context.Process(target=_complete_at_once, args=(directory, state, barrier, out)) for state in second]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0]
        assert [out.get(timeout=5), out.get(timeout=5)] == [True, True]
        assert zt.complete_steps(directory) == [2] and zt.load_checkpoint_dir(directory) == merged_second
        (folder,) = os.listdir(directory)
        assert sorted(n[:4] for n in os.listdir(directory / folder)) == ["comp", "rank", "rank"]  # nothing stray


DISK = textwrap.dedent("""
    import errno, json, subprocess, sys
    sys.path.insert(0, TESTS)
    import zephon.torch as zt
    from zephon.runtime import merge_states
    from test_checkpoint_dir import ranks, step_all

    directory = sys.argv[1]
    loaders, its = ranks(2, 4)
    step_all(its)
    for loader in loaders:
        zt.save_checkpoint_dir(directory, loader, step=1)
    saved = merge_states([loader.state_dict() for loader in loaders])
    step_all(its)
    report = {}

    def attempt(kind, step):
        try:
            zt.save_checkpoint_dir(directory, loaders[0], step=step)
        except OSError as error:
            report[kind] = {"errno": error.errno, "message": str(error)}
        report[kind + "_loads"] = zt.load_checkpoint_dir(directory) == saved and zt.complete_steps(directory) == [1]

    subprocess.run(["dd", "if=/dev/zero", "of=" + directory + "/../filler", "bs=1k", "count=4000"],
                   capture_output=True)
    attempt("full", 2)
    subprocess.run(["rm", directory + "/../filler"], check=True)
    subprocess.run(["mount", "-o", "remount,ro", directory + "/.."], check=True)
    attempt("read_only", 3)  # a new folder: refused as it is made
    print(json.dumps(report))
""")


def test_a_full_or_read_only_disk_fails_the_save_by_name_and_keeps_the_complete_steps(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mount}"]).returncode != 0:
        pytest.skip("no user and mount namespaces here to mount a small disk in")
    code = DISK.replace("TESTS", repr(os.path.dirname(__file__)))
    script = f"mount -t tmpfs -o size=512k tmpfs {mount} && exec \"$@\""
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", script, "sh", sys.executable, "-c", code,
                           str(mount / "ckpt")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["full"]["errno"] == errno.ENOSPC and "the disk is full" in report["full"]["message"]
    assert report["read_only"]["errno"] == errno.EROFS and "cannot make its folder (the filesystem is read-only)" in \
        report["read_only"]["message"] and "remount it read-write" in report["read_only"]["message"]
    assert str(mount / "ckpt") in report["full"]["message"] and report["full_loads"] and report["read_only_loads"]
