"""Where a dataset lives: a filesystem, a root directory in it, and the URI that names it.

``locate(uri, filesystem, name)`` accepts a local path, a ``file://`` URI, an object-store or
cluster URI (``s3://``, ``gs://``/``gcs://``, ``abfs://``/``abfss://``, ``hdfs://``:
:func:`pyarrow.fs.FileSystem.from_uri`, so credentials and endpoints are found the standard
way, e.g. ``AWS_ENDPOINT_URL``), or a path together with an explicit ``pyarrow.fs.FileSystem``
or fsspec filesystem. Every read of a dataset (catalog, fetch, calibration) goes through the
:class:`Location` it returns.

An object's identity is its size and modification time (for object stores, the time the
object was last written): what the catalog compares to know whether a file changed.

:func:`on_local_disk` tells a local disk (or memory) from a network or FUSE mount, whose reads
can stall: reads from a local disk are not timed by default (``zephon.io.Dataset``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.fs as pafs

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
SCHEMES = ("file", "s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs")
DISK_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs", "bcachefs",
                        "tmpfs", "ramfs", "overlay", "squashfs", "vfat", "exfat", "ntfs", "ntfs3"})  # local, no network


@dataclass(frozen=True, slots=True)
class Entry:
    """One file of a listing: its name inside the root, size in bytes and mtime in ns (0 if unknown)."""

    name: str
    size: int
    mtime_ns: int


@dataclass(frozen=True, eq=False)
class Location:
    """A directory in a filesystem: ``fs`` (pyarrow), ``root`` (a path in ``fs``) and ``uri`` (for messages and keys)."""

    fs: pafs.FileSystem
    root: str
    uri: str

    @property
    def is_local(self) -> bool:
        return bool(self.fs.type_name == "local")

    def path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}" if self.root else name

    def uri_of(self, name: str) -> str:
        return f"{self.uri.rstrip('/')}/{name}"

    def info(self, name: str) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path(name))

    def open(self, info: pafs.FileInfo) -> pa.NativeFile:
        """A random-access file."""
        return self.fs.open_input_file(info.path)

    def read_bytes(self, name: str) -> bytes:
        with self.fs.open_input_stream(self.path(name), compression=None) as stream:
            data: bytes = stream.read()
            return data


MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "created")  # fsspec's info(): local and most,
# s3fs, adlfs, gcsfs, the memory filesystem (a file there is made anew when written)


class _FSSpecHandler(pafs.FSSpecHandler):  # type: ignore[misc]  # pyarrow.fs is untyped
    """pyarrow's handler of an fsspec filesystem, with a file's modification time however the
    filesystem's ``info()`` names it (:data:`MTIME_KEYS`): pyarrow reads ``mtime`` alone, and a
    file without one was never seen to change by a catalog or an open shard."""

    @staticmethod
    def _create_file_info(path: str, info: dict[str, Any]) -> pafs.FileInfo:
        made = pafs.FSSpecHandler._create_file_info(path, info)
        if made.type != pafs.FileType.File or made.mtime is not None:
            return made
        stamp = next((info[key] for key in MTIME_KEYS if info.get(key) is not None), None)
        try:
            if isinstance(stamp, str):
                stamp = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            if isinstance(stamp, (int, float)):
                stamp = datetime.fromtimestamp(stamp, timezone.utc)
        except (ValueError, OverflowError, OSError):  # a form not understood: no time, as pyarrow would say
            return made
        return pafs.FileInfo(path, made.type, size=made.size, mtime=stamp) if isinstance(stamp, datetime) else made


def _from_fsspec(filesystem: Any) -> pafs.FileSystem:
    return pafs.PyFileSystem(_FSSpecHandler(filesystem))


def _scheme(uri: str) -> str | None:
    match = _SCHEME.match(uri)
    return match.group(1).lower() if match else None


def locate(uri: Any, filesystem: Any = None, *, name: str = "dataset", what: str = "Dataset") -> Location:
    """The :class:`Location` of ``uri`` (see the module docstring); errors name ``what`` it is
    (``"Dataset"``, ``"Checkpoint directory"``), its ``name`` and the URI."""
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri:
        raise TypeError(f"{what} {name!r}: uri={uri!r} must be a non-empty path or URI, e.g. 's3://bucket/web' "
                        "or '/data/web'")
    if filesystem is not None:
        return _explicit(uri, filesystem, name, what)
    scheme = _scheme(uri)
    if scheme is None:
        path = os.path.abspath(uri)
        return Location(pafs.LocalFileSystem(), path, path)
    if scheme not in SCHEMES:
        raise ValueError(f"{what} {name!r}: {uri} has an unsupported scheme {scheme + '://'!r}; supported: "
                         f"{', '.join(s + '://' for s in SCHEMES)}, a local path, or pass filesystem= "
                         "(a pyarrow.fs.FileSystem or an fsspec filesystem)")
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise ValueError(f"{what} {name!r}: cannot open the filesystem of {uri} ({error}); check the URI and "
                         "the credentials, or pass filesystem=") from error
    if scheme == "file":
        return Location(fs, path, path)
    return Location(fs, path.rstrip("/"), uri.rstrip("/"))


def _explicit(uri: str, filesystem: Any, name: str, what: str) -> Location:
    if isinstance(filesystem, pafs.FileSystem):
        fs = filesystem
    elif all(hasattr(filesystem, a) for a in ("ls", "info", "open")):
        fs = _from_fsspec(filesystem)
    else:
        raise TypeError(f"{what} {name!r}: filesystem={filesystem!r} must be a pyarrow.fs.FileSystem or an fsspec "
                        "filesystem (or None to infer it from the URI)")
    scheme = _scheme(uri)
    path = uri.split("://", 1)[1] if scheme is not None else uri
    if fs.type_name == "local":
        path = os.path.abspath(path)
        return Location(fs, path, path)
    if scheme is None:
        return Location(fs, path.rstrip("/") or "/", path.rstrip("/") or "/")
    return Location(fs, path.rstrip("/"), f"{scheme}://{path.strip('/')}")


def listing(location: Location, name: str) -> list[Entry]:
    """The regular files directly in the root (sorted by name); errors name the dataset and the URI."""
    try:
        root = location.fs.get_file_info(location.root)
        if root.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"Dataset {name!r}: {location.uri} does not exist; pass a directory of "
                                    "*.parquet, *.jsonl or *.arrow files")
        if root.type != pafs.FileType.Directory:
            raise ValueError(f"Dataset {name!r}: {location.uri} is not a directory; pass the directory that holds "
                             "the shard files (one file = one shard)")
        infos = location.fs.get_file_info(pafs.FileSelector(location.root, recursive=False))
    except (FileNotFoundError, ValueError):
        raise
    except (OSError, pa.ArrowException) as error:
        raise OSError(f"Dataset {name!r}: cannot list {location.uri} ({error}); check that the bucket or directory "
                      "exists and that the credentials allow listing it") from error
    if location.is_local:  # pyarrow leaves dangling links out of a listing: name them
        listed = {info.base_name for info in infos}
        broken = sorted(n for n in os.listdir(location.root) if n not in listed)
        if broken:
            raise ValueError(f"Dataset {name!r}: cannot read {location.uri_of(broken[0])} (a dangling link?); "
                             "remove it or restore what it points to")
    entries = [Entry(info.base_name, int(info.size), int(info.mtime_ns or 0))
               for info in infos if info.type == pafs.FileType.File]
    return sorted(entries, key=lambda e: e.name)


def entries_of(location: Location, names: list[str], name: str) -> list[Entry]:
    """Size and mtime of the named files (in that order); a missing one raises naming it."""
    infos = location.fs.get_file_info([location.path(n) for n in names])
    out = []
    for file, info in zip(names, infos):
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(f"Dataset {name!r}: {location.uri_of(file)} does not exist or is not a file")
        out.append(Entry(file, int(info.size), int(info.mtime_ns or 0)))
    return out


def on_local_disk(paths: Iterable[str], mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether every one of ``paths`` lies on a local disk or in memory: the filesystem of the
    device that serves it (``os.stat``, looked up in Linux's ``mountinfo``) is one of
    :data:`DISK_TYPES`. A network or FUSE mount (NFS, Lustre, ``s3fs``, ...) is not, nor a path
    whose device cannot be found (a missing path, a btrfs subvolume, a system without ``mountinfo``)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as lines:  # paths are bytes to Linux
            kinds = _types_by_device(lines)
        devices = {os.stat(path).st_dev for path in set(paths)}
    except (OSError, ValueError):
        return False
    return all(kinds.get(f"{os.major(d)}:{os.minor(d)}", {""}) <= DISK_TYPES for d in devices)


def _types_by_device(lines: Iterable[str]) -> dict[str, set[str]]:
    """``major:minor`` -> the types of the filesystems mounted from that device (a ``mountinfo``
    line: id, parent, major:minor, root, mount point, options, optional fields, ``-``, type, ...)."""
    kinds: dict[str, set[str]] = {}
    for line in lines:
        fields = line.split()
        if "-" in fields[6:-1]:
            kinds.setdefault(fields[2], set()).add(fields[fields.index("-", 6) + 1])
    return kinds
