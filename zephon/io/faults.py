"""A filesystem that adds latency and injects failures: try a pipeline against bad storage.

``faulty_filesystem(base, latency_s=0.02, rule=...)`` wraps a ``pyarrow.fs.FileSystem`` and
returns one (pass it as ``Dataset.from_path(..., filesystem=...)``). Every *request* — a stat, a
listing, an open, one read of an open file — first sleeps ``latency_s``, then asks
``rule(operation, path)``: ``None`` lets it through, an exception is raised instead, a number
``s`` sleeps ``s`` seconds more (a stall). Operations are ``"stat"``, ``"list"``, ``"open"`` and
``"read"``. ``handler.calls`` counts requests by operation.

>>> fs, handler = faulty_filesystem(pyarrow.fs.LocalFileSystem(), latency_s=0.02)
>>> flaky = faulty_filesystem(base, rule=lambda op, path: ConnectionResetError("reset") if op == "read" else None)
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable, NoReturn

import pyarrow as pa
import pyarrow.fs as pafs

Rule = Callable[[str, str], Any]


class FaultInjectingHandler(pafs.FileSystemHandler):  # type: ignore[misc]  # pyarrow ships no stubs: Any
    """The ``pyarrow.fs.FileSystemHandler`` behind :func:`faulty_filesystem` (read-only)."""

    def __init__(self, base: pafs.FileSystem, latency_s: float = 0.0, rule: Rule | None = None):
        self.base, self.latency_s, self.rule = base, float(latency_s), rule
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def request(self, operation: str, path: str) -> None:
        """One request: the latency, then the rule's verdict."""
        with self._lock:
            self.calls[operation] += 1
        if self.latency_s:
            time.sleep(self.latency_s)
        verdict = None if self.rule is None else self.rule(operation, path)
        if isinstance(verdict, BaseException):
            raise verdict
        if verdict:
            time.sleep(float(verdict))

    # -- FileSystemHandler ------------------------------------------------------------------

    def get_type_name(self) -> str:
        return f"faulty+{self.base.type_name}"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def normalize_path(self, path: str) -> str:
        normalized: str = self.base.normalize_path(path)
        return normalized

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        for path in paths:
            self.request("stat", path)
        infos: list[pafs.FileInfo] = self.base.get_file_info(paths)
        return infos

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self.request("list", selector.base_dir)
        infos: list[pafs.FileInfo] = self.base.get_file_info(selector)
        return infos

    def open_input_file(self, path: str) -> pa.NativeFile:
        self.request("open", path)
        return pa.PythonFile(_File(self, path, self.base.open_input_file(path)), mode="r")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        self.request("open", path)
        return pa.PythonFile(_File(self, path, self.base.open_input_file(path)), mode="r")

    def _read_only(self, *args: Any) -> NoReturn:
        raise OSError("faulty_filesystem is read-only")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _read_only
    move = copy_file = open_output_stream = open_append_stream = _read_only


class _File:
    """A file object whose every read is one request."""

    def __init__(self, handler: FaultInjectingHandler, path: str, file: pa.NativeFile):
        self._handler, self._path, self._file = handler, path, file
        self.closed = False

    def read(self, nbytes: int = -1) -> bytes:
        self._handler.request("read", self._path)
        data: bytes = self._file.read(None if nbytes is None or nbytes < 0 else nbytes)
        return data

    def seek(self, position: int, whence: int = 0) -> int:
        return int(self._file.seek(position, whence))

    def tell(self) -> int:
        return int(self._file.tell())

    def size(self) -> int:
        return int(self._file.size())

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._file.close()


def faulty_filesystem(base: pafs.FileSystem, *, latency_s: float = 0.0,
                      rule: Rule | None = None) -> tuple[pafs.FileSystem, FaultInjectingHandler]:
    """``(filesystem, handler)``: ``base`` behind added latency and injected faults (see the module docstring)."""
    handler = FaultInjectingHandler(base, latency_s, rule)
    return pafs.PyFileSystem(handler), handler
