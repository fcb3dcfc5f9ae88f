"""Checkpoint files: atomic (temp file + fsync + rename), checksummed, JSON.

A file is one header line and the state as compact JSON::

    zephon-checkpoint 1 sha256=<64 hex digits> bytes=<payload length>
    {"canonical_replicas": 4, ...}

A reader checks the header and the file's size against it (a truncated or padded file is
refused before it is read), then the checksum (a corrupted one is refused) before parsing
anything; nothing is unpickled. Files are written by :func:`zephon.io.atomic.write_atomically`:
a writer killed at any moment leaves the previous file intact, and a write that fails (disk
full, ``RLIMIT_FSIZE``) raises :class:`zephon.io.atomic.AtomicWriteError` naming the path.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from zephon.io import open_regular
from zephon.io.atomic import write_atomically
from zephon.limits import MAX_CHECKPOINT_BYTES
from zephon.runtime._state import parse_state

MAGIC = "zephon-checkpoint"
FILE_VERSION = 1
_HEADER_LIMIT = 256  # bytes: a header line is about 110
MAX_FILE_BYTES = _HEADER_LIMIT + MAX_CHECKPOINT_BYTES  # the largest checkpoint file
LIGHTNING_KEY = "zephon_loader"  # zephon.lightning: the loader state's key in its data module's entry
HF_STATE_FILE = "zephon_loader.ckpt"  # zephon.hf: the loader's checkpoint file in each checkpoint-* folder


def _encode(state: Any) -> bytes:
    try:
        return json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as error:
        raise TypeError(f"the state is not plain JSON ({error}); pass a state_dict() of a "
                        "zephon loader (or merge_states / all_gather_state of them)") from error


def encode_checkpoint(state: Any, where: str) -> bytes:
    """The bytes of a checkpoint file holding ``state``: header line and compact JSON.

    Refuses (``ValueError`` / ``TypeError``, naming ``where``) a state that a reader would
    refuse: not a loader state, or over ``zephon.limits.MAX_CHECKPOINT_BYTES``."""
    payload = _encode(state)
    if len(payload) > MAX_CHECKPOINT_BYTES:
        raise ValueError(f"the state is {len(payload)} bytes of JSON, more than the {MAX_CHECKPOINT_BYTES} a "
                         f"checkpoint may hold, so it would not load; {where} was not touched (a loader state takes a "
                         "few hundred bytes per lane: a job with fewer lanes, a smaller canonical_replicas, stays "
                         "under it)")
    parse_state(json.loads(payload))  # what a reader will check, before anything is written
    header = f"{MAGIC} {FILE_VERSION} sha256={hashlib.sha256(payload).hexdigest()} bytes={len(payload)}\n"
    return header.encode("ascii") + payload


def save_checkpoint(path: str | os.PathLike[str], state: Any) -> None:
    """Write ``state`` (a loader state) to ``path`` atomically, with a checksum.

    Writes a temporary file in the same directory, flushes and fsyncs it, renames it over
    ``path`` and fsyncs the directory. Call it on one rank (e.g. rank 0, after
    :func:`zephon.torch.all_gather_state`). Raises :class:`zephon.io.atomic.AtomicWriteError`
    (an ``OSError``) naming ``path`` if the file cannot be written; the previous checkpoint
    then stays as it was and no temporary file is left. A state that :func:`load_checkpoint`
    would refuse (not a loader state, or over ``zephon.limits.MAX_CHECKPOINT_BYTES``) raises
    ``ValueError`` / ``TypeError`` before the file is touched.
    """
    write_atomically(path, encode_checkpoint(state, repr(os.fspath(path))))


def _refuse(path: str, why: str) -> ValueError:
    return ValueError(f"checkpoint {path!r} {why}; it was not written completely by zephon or was changed since: "
                      "restore an earlier checkpoint")


def load_checkpoint(path: str | os.PathLike[str], *, expect: Any = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; refuse a truncated or corrupted one.

    Checks the header, the length, the checksum, the state's kind and version. With
    ``expect`` (a zephon ``DataLoader`` or torch dataset), also checks that it restores
    there: ``canonical_replicas``, the datasets' fingerprints, the source's config
    fingerprint and the lanes that loader reads (its ``check_state_dict``). Returns the state.
    """
    path = os.fspath(path)
    with open_regular(path, "checkpoint") as f:
        check_size(os.fstat(f.fileno()).st_size, path)
        state = decode_checkpoint(f.read(MAX_FILE_BYTES + 1), path)
    if expect is not None:
        expect.check_state_dict(state)
    return state


def check_size(size: int, path: str) -> None:
    """Refuse a file too large to be a checkpoint before reading it."""
    if size > MAX_FILE_BYTES:
        raise _refuse(path, f"is truncated or padded: {size} bytes, more than the {MAX_FILE_BYTES} a checkpoint "
                            "file takes at most")


def decode_checkpoint(data: bytes, path: str) -> dict[str, Any]:
    """The loader state in the bytes of a checkpoint file (``path`` names it in errors).

    Checks the header, the length against it (a truncated or padded file is refused) and the
    checksum (a corrupted one is refused) before parsing the JSON; then the state's form."""
    newline = data.find(b"\n", 0, _HEADER_LIMIT)
    if newline < 0:
        raise _refuse(path, "has no header line (it is truncated or not a zephon checkpoint)")
    fields, payload = _header(data[:newline], path), data[newline + 1:]
    if len(payload) != fields[1]:
        raise _refuse(path, f"is truncated or padded: {len(payload)} bytes of state, the header says {fields[1]}")
    if hashlib.sha256(payload).hexdigest() != fields[0]:
        raise _refuse(path, "fails its sha256 checksum (corrupted)")
    try:
        state: dict[str, Any] = json.loads(payload)  # a dict once parse_state accepts it
    except (ValueError, RecursionError) as error:
        raise _refuse(path, f"holds malformed JSON ({str(error)[:200]})") from None
    parse_state(state)
    return state


def _header(line: bytes, path: str) -> tuple[str, int]:
    """The checksum and the payload size a header line states."""
    try:
        fields = line.decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise _refuse(path, "does not start with a zephon checkpoint header") from None
    if (len(fields) != 4 or fields[0] != MAGIC or not fields[2].startswith("sha256=")
            or not fields[3].startswith("bytes=")):
        raise _refuse(path, "does not start with a zephon checkpoint header")
    if fields[1] != str(FILE_VERSION):
        raise ValueError(f"checkpoint {path!r} has file version {fields[1]}; this zephon reads version {FILE_VERSION}: "
                         "restore it with the zephon version that wrote it")
    digits = fields[3][len("bytes="):]
    if not digits.isdigit() or len(digits) > 12:
        raise _refuse(path, "has a malformed header")
    size = int(digits)
    if size > MAX_CHECKPOINT_BYTES:
        raise _refuse(path, f"says it holds {size} bytes of state, more than the {MAX_CHECKPOINT_BYTES} a checkpoint "
                            "may hold")
    return fields[2][len("sha256="):], size
