"""Local files zephon reads whole (mixture configs, checkpoints, states): only regular files;
and whether a local process still runs (:func:`process_alive`).

A directory, a FIFO, a device such as ``/dev/zero`` or a symlink loop given where a file is
expected would otherwise end in a traceback, a read that never ends or one that blocks until a
writer comes; :func:`open_regular` refuses them by name first. A missing file stays
``FileNotFoundError``.
"""
from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file; else ``ValueError`` naming
    ``what`` it should be (e.g. ``"mixture config"``), the path and what it is instead."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block here
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValueError(f"{what} {path!r} is a symlink loop; pass the file itself") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise ValueError(f"{what} {path!r} is {kind}, not a file; pass the path of the {what} file itself")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
