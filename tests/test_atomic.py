"""The one atomic writer (checkpoints, catalogs, priming caches) and checkpoint writes that fail."""
import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from zephon.io import AtomicWriteError, write_atomically
from zephon.io.atomic import SUFFIX, remove_stale
from zephon.runtime import load_checkpoint, save_checkpoint

from test_pipeline_runtime import state_of

# A subprocess that saves a small checkpoint at argv[1], then tries a second one under a
# condition that makes it fail (set up by ``FAIL``), and reports what happened.
CHILD = textwrap.dedent("""
    import errno, json, os, resource, sys
    from zephon import Dataset, StaticMixtureWorkSource
    from zephon.runtime import load_checkpoint, make_state, save_checkpoint

    path = sys.argv[1]
    def state(lanes):
        source = StaticMixtureWorkSource([Dataset.from_counts("a", [9, 4, 12])], {"a": 1.0}, chunk_size=5)
        entries = {lane: (source.clone_for_lane(lane, 64).state_dict(), lane % 5, 0) for lane in lanes}
        return make_state(64, entries, [{"id": 0, "name": "a", "fingerprint": None}], {})
    first, second = state([0]), state(range(64))
    save_checkpoint(path, first)
    FAIL
    try:
        save_checkpoint(path, second)
    except OSError as error:
        print(json.dumps({"type": type(error).__name__, "errno": error.errno, "message": str(error),
                          "filename": error.filename, "previous_intact": load_checkpoint(path) == first,
                          "files": sorted(os.listdir(os.path.dirname(path)))}))
    else:
        print(json.dumps({"type": None}))
""")


def _run_child(path, fail, prefix=()):
    code = CHILD.replace("FAIL", fail)
    done = subprocess.run([*prefix, sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_failed_write(report, path, code):
    assert report["type"] == "AtomicWriteError" and report["errno"] == code
    assert str(path) in report["message"] and report["filename"] == str(path)
    assert report["previous_intact"]
    assert report["files"] == [os.path.basename(path)]


def test_a_write_over_the_file_size_limit_names_the_path_and_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    limit = "resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 100, resource.RLIM_INFINITY))"
    report = _run_child(path, limit)
    _check_failed_write(report, path, errno.EFBIG)
    assert "RLIMIT_FSIZE" in report["message"]


def _can_mount_tmpfs(where):
    if shutil.which("unshare") is None:
        return "the unshare command is not installed"
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {where}"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"no user/mount namespaces here: {probe.stderr.strip()[:200]}"


def test_a_write_to_a_full_disk_names_the_path_and_keeps_the_previous_checkpoint(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    why = _can_mount_tmpfs(mount)
    if why:
        pytest.skip(f"cannot mount a small tmpfs to fill: {why}")
    path = mount / "ckpt"
    fill = ("import subprocess; subprocess.run(['dd', 'if=/dev/zero', 'of=' + os.path.dirname(path) + '/filler', "
            "'bs=1k', 'count=1000'], capture_output=True)  # fills the 64 KiB disk")
    script = f"mount -t tmpfs -o size=64k tmpfs {mount} && exec \"$@\""
    report = _run_child(path, fill, prefix=("unshare", "-Urm", "sh", "-c", script, "sh"))
    report["files"] = [f for f in report["files"] if f != "filler"]
    _check_failed_write(report, path, errno.ENOSPC)
    assert "disk is full" in report["message"]


def test_the_writer_replaces_atomically_and_leaves_nothing_behind(tmp_path):
    path = tmp_path / "data.json"
    write_atomically(path, b"one")
    write_atomically(path, lambda f: f.write(b"two"))
    assert path.read_bytes() == b"two" and os.listdir(tmp_path) == ["data.json"]
    assert os.stat(path).st_mode & 0o777 == 0o644

    def broken(file):
        file.write(b"half")
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError):
        write_atomically(path, broken)
    assert path.read_bytes() == b"two" and os.listdir(tmp_path) == ["data.json"]


def test_a_missing_directory_is_a_named_os_error(tmp_path):
    with pytest.raises(AtomicWriteError, match="missing") as error:
        write_atomically(tmp_path / "missing" / "x", b"")
    assert isinstance(error.value, OSError) and error.value.errno == errno.ENOENT


def test_the_next_save_removes_temporary_files_that_killed_writers_left(tmp_path):
    path = tmp_path / "ckpt"
    for k in range(5):
        (tmp_path / f"ckpt.dead{k}{SUFFIX}").write_bytes(b"partial")
    (tmp_path / f"ckpt.other.abc{SUFFIX}").write_bytes(b"another target's")
    live = tmp_path / f"ckpt.live{SUFFIX}"
    live.write_bytes(b"a writer still at work")
    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        write_atomically(path, b"new")
        assert sorted(os.listdir(tmp_path)) == sorted(["ckpt", f"ckpt.live{SUFFIX}", f"ckpt.other.abc{SUFFIX}"])
    assert remove_stale(path) == 1


def test_writers_killed_mid_save_leave_nothing_after_the_next_save(tmp_path):
    path = tmp_path / "ckpt"
    code = textwrap.dedent(f"""
        import os, signal
        from zephon.io import write_atomically
        def die(file):
            file.write(b"partial")
            os.kill(os.getpid(), signal.SIGKILL)
        write_atomically({str(path)!r}, die)
    """)
    for _ in range(3):
        assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    assert len(os.listdir(tmp_path)) == 3
    write_atomically(path, b"done")
    assert os.listdir(tmp_path) == ["ckpt"]


def test_load_checkpoint_checks_the_size_before_reading(tmp_path):
    path = tmp_path / "ckpt"
    save_checkpoint(path, state_of([0]))
    with open(path, "r+b") as f:
        f.truncate(600 << 20)  # sparse: padded to 600 MB without writing it
    with pytest.raises(ValueError, match="truncated or padded"):
        load_checkpoint(path)


def test_a_cleanup_that_removes_a_writers_file_before_its_lock_does_not_fail_the_write(tmp_path, monkeypatch):
    """Another writer's ``remove_stale`` may run between this writer's file creation and its
    lock: it sees the file unlocked, takes it for abandoned and unlinks it."""
    import zephon.io.atomic as atomic

    path, made = tmp_path / "ckpt", []
    real = atomic.tempfile.mkstemp

    def mkstemp_then_a_concurrent_cleanup(**kwargs):
        fd, temporary = real(**kwargs)
        made.append(temporary)
        if len(made) == 1:
            assert remove_stale(path) == 1  # the cleaner got there first
        return fd, temporary

    monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp_then_a_concurrent_cleanup)
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new" and len(made) == 2 and os.listdir(tmp_path) == ["ckpt"]


def test_two_processes_saving_to_one_path_both_succeed_and_leave_a_loadable_checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_pipeline_runtime import state_of
        from zephon.runtime import save_checkpoint
        for _ in range(40):
            save_checkpoint({str(path)!r}, state_of([0, 1]))
    """)
    writers = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [w.communicate()[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    assert load_checkpoint(path) == state_of([0, 1]) and os.listdir(tmp_path) == ["ckpt"]


def test_save_refuses_what_load_would_refuse_before_touching_the_file(tmp_path, monkeypatch):
    import zephon.runtime._checkpoint as checkpoint

    path = tmp_path / "ckpt"
    save_checkpoint(path, state_of([0]))
    good = path.read_bytes()
    big = state_of([0, 1, 2, 3])
    monkeypatch.setattr(checkpoint, "MAX_CHECKPOINT_BYTES", len(json.dumps(big, separators=(",", ":"))) - 1)
    with pytest.raises(ValueError, match=r"bytes of JSON, more than the \d+ a checkpoint may hold.*was not touched"):
        save_checkpoint(path, big)
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(TypeError, match="not plain JSON"):
        save_checkpoint(path, {"lanes": deep})
    with pytest.raises(ValueError):
        save_checkpoint(path, {"kind": "not a loader state"})
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["ckpt"]


@pytest.mark.parametrize("kind", ["directory", "fifo", "device", "loop"])
def test_a_checkpoint_or_config_path_that_is_no_file_is_refused_by_name(tmp_path, kind):
    from zephon import StaticMixtureWorkSource

    for name in ("ckpt", "mix.json", "mix.toml"):
        path = tmp_path / f"{kind}-{name}"
        if kind == "directory":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)  # no writer: a plain open would block for ever
        elif kind == "device":
            path.symlink_to("/dev/zero")  # a plain read would never end
        else:
            path.symlink_to(path)
        what = {"directory": "a directory", "fifo": "a FIFO", "device": "a character device",
                "loop": "a symlink loop"}[kind]
        read = load_checkpoint if name == "ckpt" else StaticMixtureWorkSource.from_config
        with pytest.raises(ValueError, match=f"{path}' is {what}"):
            read(path)


def test_a_writer_whose_lock_fails_leaves_no_descriptor_and_no_temporary_file(tmp_path, monkeypatch):
    import zephon.io.atomic as atomic

    def refuse(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(atomic.fcntl, "flock", refuse)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(AtomicWriteError, match="No locks available|cannot create"):
        write_atomically(tmp_path / "ckpt", b"new")
    assert os.listdir(tmp_path) == [] and len(os.listdir("/proc/self/fd")) == before
