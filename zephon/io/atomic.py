"""One way to replace a file atomically: checkpoints, catalogs and priming caches all use it.

``write_atomically(path, data)`` writes ``data`` (bytes, or a function that writes into a
binary file) to a temporary file in the same directory
(named ``<target>.<random>.zephon-tmp``), flushes and fsyncs it, renames it over ``path`` and
fsyncs the directory, so a reader sees the old file or the new one, never a mix, and the new
one survives a power cut once the call returns. A failed write (disk full, ``RLIMIT_FSIZE``,
permissions) removes its temporary file and raises :class:`AtomicWriteError` naming the path;
the previous file is untouched. A writer killed outright cannot clean up: the next successful
write of the same target removes the temporary files such writers left (only those of that
target). A writer holds an exclusive ``flock`` on its temporary file until the rename, so a
concurrent writer's file is recognised (the lock is taken) and left alone; one removed in the
instant before its writer locked it is made again.
"""
from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from typing import BinaryIO, Callable

SUFFIX = ".zephon-tmp"
_CLAIMS = 100  # temporary files a writer makes at most while other writers' cleanups remove them


class AtomicWriteError(OSError):
    """A file could not be written (disk full, file too large, no permission, ...).

    An ``OSError`` with the original ``errno`` and ``filename`` set to the target path; the
    previous file at that path, if any, is unchanged and no temporary file is left.
    """


def write_atomically(path: str | os.PathLike[str], data: bytes | Callable[[BinaryIO], object], mode: int = 0o644) -> None:
    """Replace ``path`` by ``data`` atomically and durably (see the module docstring).

    Parameters
    ----------
    path
        The file to replace (or create); its directory must exist.
    data
        The new content, or a function ``write(file)`` that writes it (for large content
        produced in pieces, e.g. ``numpy.save``).
    mode
        Permission bits of the new file (default ``0o644``: every process on the node reads it).

    Raises
    ------
    AtomicWriteError
        If the file cannot be written; ``path`` is then unchanged.
    """
    path = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(path)
    try:
        fd, temporary = _claim_temporary(directory, name)
    except OSError as error:
        raise write_error(error, path, "cannot create a temporary file next to it") from error
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)
            if callable(data):
                data(file)
            else:
                file.write(data)
            file.flush()
            os.fsync(file.fileno())
            os.replace(temporary, path)
    except BaseException as error:
        _remove(temporary)
        if isinstance(error, OSError):
            raise write_error(error, path, "the write failed") from error
        raise
    _fsync_directory(directory)
    remove_stale(path)


def _claim_temporary(directory: str, name: str) -> tuple[int, str]:
    """A new temporary file for target ``name``, open and locked ("alive" until the rename).

    Between its creation and its lock, another writer's :func:`remove_stale` may take it for
    abandoned and unlink it; then it is made again."""
    for _ in range(_CLAIMS):
        fd, temporary = tempfile.mkstemp(prefix=name + ".", suffix=SUFFIX, dir=directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits while a cleaner holds it (an instant)
            if os.stat(temporary).st_ino == os.fstat(fd).st_ino:
                return fd, temporary
        except FileNotFoundError:
            pass  # a cleaner unlinked it: make another
        except BaseException:
            os.close(fd)
            _remove(temporary)
            raise
        os.close(fd)
    raise OSError(errno.EAGAIN, f"{_CLAIMS} temporary files in a row were removed by other writers")


def remove_stale(path: str | os.PathLike[str]) -> int:
    """Remove temporary files that killed writers of ``path`` left behind; returns how many."""
    path = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(path)
    try:
        entries = [e for e in os.scandir(directory) if _is_temporary_of(e.name, name)]
    except OSError:
        return 0
    return sum(_remove_if_abandoned(entry.path) for entry in entries)


def _is_temporary_of(entry: str, name: str) -> bool:
    """Whether ``entry`` is a temporary file of target ``name`` (not of ``name.x``)."""
    if not (entry.startswith(name + ".") and entry.endswith(SUFFIX)):
        return False
    return "." not in entry[len(name) + 1:-len(SUFFIX)]


def _remove_if_abandoned(temporary: str) -> bool:
    """Unlink ``temporary`` unless a live writer holds its lock."""
    try:
        fd = os.open(temporary, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(temporary)
        return True
    except OSError:  # locked by a live writer, or already gone
        return False
    finally:
        os.close(fd)


_REASONS = {  # errno: (what it means, what fixes it)
    errno.ENOSPC: ("the disk is full", "free space"),
    errno.EFBIG: ("the file is larger than this process may write (RLIMIT_FSIZE or the filesystem's limit)",
                  "raise the limit"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space or raise the quota"),
    errno.EACCES: ("permission denied", "give this process write permission there"),
    errno.EROFS: ("the filesystem is read-only", "write to a writable filesystem or remount it read-write"),
}


def write_error(error: OSError, path: str, what: str) -> AtomicWriteError:
    """``error``, met while writing ``path`` (``what`` failed), as an error naming both and the fix."""
    why, fix = _REASONS.get(error.errno or 0, (error.strerror or str(error), "fix that"))
    return AtomicWriteError(error.errno or errno.EIO, f"cannot write {path!r}: {what} ({why}); the previous file "
                            f"is unchanged: {fix} and write again", path)


def _remove(temporary: str) -> None:
    try:
        os.unlink(temporary)
    except OSError:
        pass


def _fsync_directory(directory: str) -> None:
    """Make the rename durable; filesystems that cannot fsync a directory are skipped."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
