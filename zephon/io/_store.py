"""A directory of small whole files, local or in object storage: list, read, write, remove.

Checkpoint directories are kept in one. A file is written whole or not at all: on a local
disk through :func:`zephon.io.atomic.write_atomically` (temporary file, fsync, rename), in
object storage (pyarrow's S3, GCS and Azure filesystems) as one upload (an object appears once
its upload completes; a writer killed before leaves nothing), on any other filesystem as a
temporary file moved onto the name once written. Listings of object stores are consistent after a write on S3, GCS and
Azure, which the checkpoint directory relies on (a file written is listed).
"""
from __future__ import annotations

import os
import shutil
import uuid
from typing import Any, Callable

import pyarrow as pa
import pyarrow.fs as pafs

from zephon.io._fs import Location, locate
from zephon.io.atomic import write_atomically, write_error
from zephon.io.local import open_regular

LISTING_ATTEMPTS = 5  # a listing that raced with other ranks' renames is read again

WHOLE_UPLOADS = ("s3", "gcs", "abfs")  # pyarrow filesystems whose files appear whole once written


class Store:
    """The directory ``uri`` (a local path or an object-store URI; ``filesystem`` as for
    datasets); ``what`` names it in errors. Names are ``/``-separated paths inside it."""

    def __init__(self, uri: Any, filesystem: Any = None, *, what: str = "Checkpoint directory"):
        self.location: Location = locate(uri, filesystem, name=os.fspath(uri) if isinstance(uri, os.PathLike) else
                                         str(uri), what=what)
        self.what = what

    @property
    def uri(self) -> str:
        return self.location.uri

    def uri_of(self, name: str) -> str:
        return self.location.uri_of(name)

    def listing(self, folder: str = "") -> tuple[list[str], list[str]]:
        """The folders and the files directly in ``folder`` (sorted names); empty if it does not exist."""
        path = self.location.path(folder) if folder else self.location.root
        selector = pafs.FileSelector(path, recursive=False, allow_not_found=True)
        for attempt in range(LISTING_ATTEMPTS):
            try:
                infos = self.location.fs.get_file_info(selector)
                break
            except FileNotFoundError:  # a file went (renamed by another rank) between reading the folder and its stat
                if attempt + 1 < LISTING_ATTEMPTS:
                    continue
                raise OSError(f"{self.what} {self.uri}: cannot list {folder or '.'}: its files kept changing while "
                              f"it was read, {LISTING_ATTEMPTS} times") from None
            except (OSError, pa.ArrowException) as error:
                raise OSError(f"{self.what} {self.uri}: cannot list {folder or '.'} ({error}); check that it exists "
                              "and that the credentials allow listing it") from error
        folders = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
        return folders, sorted(i.base_name for i in infos if i.type == pafs.FileType.File)

    def read(self, name: str, check_size: Callable[[int, str], None]) -> bytes:
        """The bytes of file ``name``; ``check_size(size, uri)`` may refuse it before it is read."""
        if self.location.is_local:
            with open_regular(self.location.path(name), "checkpoint") as file:
                size = os.fstat(file.fileno()).st_size
                check_size(size, self.uri_of(name))
                return file.read(size + 1)
        info = self.location.info(name)
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(f"{self.what} {self.uri}: {name} does not exist")
        check_size(int(info.size), self.uri_of(name))
        with self.location.fs.open_input_stream(info.path, compression=None) as stream:
            data: bytes = stream.read(int(info.size) + 1)  # a file that grew since is refused by its size
            return data

    def write(self, name: str, data: bytes) -> None:
        """Write file ``name`` whole (its folders are made as needed)."""
        if self.location.is_local:
            path = self.location.path(name)
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except OSError as error:
                raise write_error(error, path, "cannot make its folder") from error
            write_atomically(path, data)
            return
        target, fs = self.location.path(name), self.location.fs
        try:
            if fs.type_name in WHOLE_UPLOADS:
                _upload(fs, target, data)
            else:  # written aside, then moved onto the name
                temporary = f"{target}.{uuid.uuid4().hex}.tmp"  # unique across hosts
                fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
                _upload(fs, temporary, data)
                fs.move(temporary, target)
        except (OSError, pa.ArrowException) as error:
            raise OSError(f"{self.what} {self.uri}: cannot write {name} ({error}); check the credentials and that "
                          "the bucket exists") from error

    def remove(self, folder: str) -> None:
        """Remove ``folder`` and everything in it (nothing if it is already gone)."""
        if self.location.is_local:
            shutil.rmtree(self.location.path(folder), ignore_errors=True)
            return
        try:
            self.location.fs.delete_dir(self.location.path(folder))
        except FileNotFoundError:
            pass
        except (OSError, pa.ArrowException) as error:
            raise OSError(f"{self.what} {self.uri}: cannot remove {folder} ({error})") from error


def _upload(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as stream:
        stream.write(data)
