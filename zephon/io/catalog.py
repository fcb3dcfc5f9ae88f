"""The shard catalog of a directory dataset: built once, cached on disk, checked on every load.

One entry per shard, shard id = position in sorted file-name order:

| field | meaning |
|---|---|
| ``files`` | file name inside the directory |
| ``sizes`` | bytes on disk (``Dataset.raw_bytes()``) |
| ``mtimes_ns`` | modification time; with ``sizes``, what decides whether an entry is still valid |
| ``rows`` | records: Parquet footer ``num_rows``; JSONL non-blank lines |
| ``digests`` | content hash: blake2b-64 of the Parquet footer, or of the whole decompressed JSONL |
| ``schema_of`` | index into ``schemas`` (column ``(name, type)`` lists); -1 for a JSONL file without records |

**Where.** ``cache_dir=`` or ``$ZEPHON_CACHE_DIR`` if set: ``<cache>/catalog-<key>.json``
(``key``: sha256 of the directory's real path). Otherwise next to the data,
``<directory>/.zephon-catalog.json``, falling back to ``$XDG_CACHE_HOME/zephon`` (or
``~/.cache/zephon``) when the directory is read-only. Every process on the node finds it.

**Format.** JSON, ``{"kind": "zephon.catalog", "version": 1, ...}``, one list per field
(columnar: 100,000 shards load in tens of milliseconds). JSONL line indexes live in one
sidecar ``<catalog stem>.<listing key>.lines.npy``: every shard's index concatenated
(``rows + 1`` int64 offsets each), memory-mapped on load.

**Writes** go through :func:`zephon.io.atomic.write_atomically` (a temporary file in the same
directory, fsync, ``os.replace``, fsync of the directory): readers see the old catalog or the
new one, never half of one. Concurrent builders write identical content.

**Validation on load.** Wrong kind, version, format or shape, or a missing sidecar, and the
catalog is ignored and rebuilt. The directory is listed and every candidate file is stat-ed;
entries whose name, size and mtime match are reused, the rest are scanned again and the
catalog is rewritten. Nothing is re-read when nothing changed. As in git's "racy clean"
rule, an entry whose mtime is within :data:`RACY_NS` of the build is not trusted (a same-size
rewrite inside one timestamp tick would look unchanged): it is scanned again next time.

**Fingerprint.** sha256 (16 hex digits) of the format, the schemas, the file names, row counts
and content digests: stable when the files are copied (mtimes are not part of it), changed
when a file is added, removed, renamed or edited.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import stat
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from zephon.io import _jsonl, _parquet
from zephon.io.atomic import write_atomically
from zephon.io.progress import Progress

KIND, VERSION = "zephon.catalog", 1
CATALOG_NAME = ".zephon-catalog.json"
ENV_CACHE_DIR = "ZEPHON_CACHE_DIR"
FORMATS = ("parquet", "jsonl")
RACY_NS = 2 * 10**9  # files modified this close to a build are re-scanned on the next load
_PATTERNS = {"parquet": (_parquet.SUFFIX,), "jsonl": tuple(_jsonl.SUFFIXES)}

Schema = tuple[tuple[str, str], ...]  # (column name, type) per column; JSONL types are "json"


@dataclass(frozen=True, slots=True, eq=False)
class Catalog:
    """The shard table of one directory dataset (see the module docstring for each field)."""

    directory: str  # absolute path
    fmt: str  # "parquet" or "jsonl"
    files: tuple[str, ...]  # sorted; shard id = position
    sizes: np.ndarray  # int64 bytes on disk
    mtimes: np.ndarray  # int64 ns
    rows: np.ndarray  # int64 records per shard
    digests: tuple[str, ...]  # content hash per shard
    schema_of: np.ndarray  # int64 index into schemas, -1 = no records to tell
    schemas: tuple[Schema, ...]
    line_index: np.ndarray | None  # JSONL: concatenated per-shard indexes (rows + 1 each)
    fingerprint: str  # see the module docstring
    built_ns: int  # wall clock (ns) when the files were stat-ed for this build
    location: str | None = None  # the catalog file it was loaded from or saved to
    scanned: int = 0  # files scanned to build it (0: reused as is)

    def schema(self) -> Schema | None:
        """The dataset's columns: those of the first shard that has a schema."""
        known = np.flatnonzero(self.schema_of >= 0)
        return self.schemas[int(self.schema_of[known[0]])] if len(known) else None

    def check_schema(self, name: str) -> None:
        """Raise ``ValueError`` naming two files and a column if shards disagree on the columns.

        Column order does not matter (reads select by name), and a ``null``-typed column (what
        Arrow infers for a column with no values) matches any type.
        """
        known = np.flatnonzero(self.schema_of >= 0)
        if len(known) < 2:
            return
        first = int(known[0])
        reference = self.schemas[int(self.schema_of[first])]
        for index in np.unique(self.schema_of[known]).tolist():
            problem = _difference(reference, self.schemas[index])
            if problem is not None:
                second = int(known[self.schema_of[known] == index][0])
                column, a, b = problem
                raise ValueError(
                    f"Dataset {name!r}: shards disagree on column {column!r}: {a} in {self.files[first]} but {b} in "
                    f"{self.files[second]} (in {self.directory}); every file of a dataset must have the same columns")


def _difference(a: Schema, b: Schema) -> tuple[str, str, str] | None:
    """The first column on which ``a`` and ``b`` disagree: ``(column, in a, in b)``, or None."""
    types_a, types_b = dict(a), dict(b)
    for column, kind in a:
        if column not in types_b:
            return column, "present", "missing"
        if kind != types_b[column] and "null" not in (kind, types_b[column]):
            return column, kind, types_b[column]
    for column, _ in b:
        if column not in types_a:
            return column, "missing", "present"
    return None


# -- listing ---------------------------------------------------------------------------------


def _listing(directory: str, fmt: str | None, name: str) -> tuple[str, list[str], np.ndarray, np.ndarray]:
    """The format, the shard files (sorted) and their sizes and mtimes."""
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"Dataset {name!r}: fmt={fmt!r} must be one of {FORMATS} or None (auto-detect)")
    if not os.path.exists(directory):
        raise FileNotFoundError(f"Dataset {name!r}: {directory} does not exist; pass a directory of "
                                "*.parquet or *.jsonl files")
    if not os.path.isdir(directory):
        raise ValueError(f"Dataset {name!r}: {directory} is not a directory; pass the directory that holds "
                         "the *.parquet or *.jsonl files (one file = one shard)")
    try:
        entries = os.listdir(directory)
    except OSError as error:
        raise ValueError(f"Dataset {name!r}: cannot list {directory} ({error})") from error
    found = {f: sorted(n for n in entries if n.endswith(_PATTERNS[f]) and not n.startswith(".")) for f in FORMATS}
    if fmt is None and all(found.values()):  # subdirectories named like shards do not count
        found = {f: _stat(directory, names, name)[0] for f, names in found.items()}
    if fmt is None:
        present = [f for f in FORMATS if found[f]]
        if len(present) > 1:
            raise ValueError(f"Dataset {name!r}: {directory} mixes formats ({found['parquet'][0]} and "
                             f"{found['jsonl'][0]}); keep one format per directory or pass fmt=")
        if not present:
            raise ValueError(f"Dataset {name!r}: {directory} holds no *.parquet, *.jsonl, *.jsonl.gz or "
                             "*.jsonl.zst files; point it at a non-empty dataset directory")
        fmt = present[0]
    files, sizes, mtimes = _stat(directory, found[fmt], name)
    if not files:
        other = [f for f in FORMATS if found[f] and f != fmt]
        hint = f" (it holds {other[0]} files: pass fmt={other[0]!r})" if other else ""
        raise ValueError(f"Dataset {name!r}: {directory} holds no {fmt} files{hint}")
    return fmt, files, sizes, mtimes


def _stat(directory: str, names: list[str], name: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Sizes and mtimes of the regular files among ``names`` (others are skipped)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            infos = [os.stat(file, dir_fd=fd) for file in names]
        except OSError:
            for file in names:  # find the culprit
                try:
                    os.stat(file, dir_fd=fd)
                except OSError as error:
                    raise ValueError(f"Dataset {name!r}: cannot stat {os.path.join(directory, file)} "
                                     f"({error})") from error
            raise
    finally:
        os.close(fd)
    regular = stat.S_ISREG
    kept = [i for i, info in enumerate(infos) if regular(info.st_mode)]
    if len(kept) < len(names):
        names, infos = [names[i] for i in kept], [infos[i] for i in kept]
    sizes = [info.st_size for info in infos]
    mtimes = [info.st_mtime_ns for info in infos]
    return names, np.array(sizes, dtype=np.int64), np.array(mtimes, dtype=np.int64)


# -- locations ---------------------------------------------------------------------------------


def _user_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "zephon")


def locations(directory: str, cache_dir: str | None = None) -> list[str]:
    """Where the catalog of ``directory`` is looked for and written, in order."""
    directory = os.path.realpath(directory)
    key = hashlib.sha256(directory.encode()).hexdigest()[:16]
    cache = cache_dir if cache_dir is not None else os.environ.get(ENV_CACHE_DIR) or None
    if cache is not None:
        return [os.path.join(os.fspath(cache), f"catalog-{key}.json")]
    return [os.path.join(directory, CATALOG_NAME), os.path.join(_user_cache(), f"catalog-{key}.json")]


def _sidecar_stem(location: str) -> str:
    return location[:-len(".json")] if location.endswith(".json") else location


def _listing_key(files: Sequence[str], sizes: np.ndarray, mtimes: np.ndarray) -> str:
    digest = hashlib.sha256(json.dumps(list(files)).encode())
    digest.update(sizes.tobytes())
    digest.update(mtimes.tobytes())
    return digest.hexdigest()[:16]


# -- load / save ---------------------------------------------------------------------------------


def _load(location: str, fmt: str) -> Catalog | None:
    """The catalog stored at ``location``, or None if missing, unreadable or malformed."""
    try:
        with open(location, "rb") as file:
            data = json.load(file)
        if data.get("kind") != KIND or data.get("version") != VERSION or data.get("format") != fmt:
            return None
        files = tuple(data["files"])
        n = len(files)
        arrays = [np.array(data[key], dtype=np.int64) for key in ("sizes", "mtimes_ns", "rows", "schema_of")]
        digests = tuple(data["digests"])
        schemas = tuple(tuple((str(c), str(t)) for c, t in s) for s in data["schemas"])
        if any(a.shape != (n,) for a in arrays) or len(digests) != n or not all(isinstance(f, str) for f in files):
            return None
        sizes, mtimes, rows, schema_of = arrays
        if (rows < 0).any() or (schema_of >= len(schemas)).any() or (schema_of < -1).any():
            return None
        index = None
        if fmt == "jsonl":
            index = np.load(os.path.join(os.path.dirname(location), data["line_index"]), mmap_mode="r")
            if index.dtype != np.int64 or index.shape != (int((rows + 1).sum()),):
                return None
        return Catalog(str(data["directory"]), fmt, files, sizes, mtimes, rows, digests, schema_of, schemas,
                       index, str(data["fingerprint"]), int(data["built_ns"]), location, 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _save(catalog: Catalog, candidates: list[str]) -> Catalog:
    """Write the catalog to the first writable candidate; warn (and carry on) if none is."""
    errors = []
    key = _listing_key(catalog.files, catalog.sizes, catalog.mtimes)
    for location in candidates:
        try:
            folder = os.path.dirname(location)
            os.makedirs(folder, exist_ok=True)
            data = {"kind": KIND, "version": VERSION, "format": catalog.fmt, "directory": catalog.directory,
                    "fingerprint": catalog.fingerprint, "built_ns": catalog.built_ns, "files": list(catalog.files),
                    "sizes": catalog.sizes.tolist(), "mtimes_ns": catalog.mtimes.tolist(),
                    "rows": catalog.rows.tolist(), "digests": list(catalog.digests),
                    "schema_of": catalog.schema_of.tolist(), "schemas": [list(map(list, s)) for s in catalog.schemas],
                    "line_index": None}
            stem, sidecar = _sidecar_stem(location), None
            if catalog.line_index is not None:
                sidecar = f"{stem}.{key}.lines.npy"
                write_atomically(sidecar, lambda f: np.save(f, np.asarray(catalog.line_index, dtype=np.int64)))
                data["line_index"] = os.path.basename(sidecar)
            write_atomically(location, json.dumps(data, separators=(",", ":")).encode())
            for stale in glob.glob(glob.escape(stem) + ".*.lines.npy"):
                if stale != sidecar:
                    _remove(stale)
            return replace(catalog, location=location)
        except OSError as error:
            errors.append(f"{location}: {error}")
    warnings.warn(f"zephon: could not cache the catalog of {catalog.directory} ({'; '.join(errors)}); it will be "
                  f"rebuilt next time; set {ENV_CACHE_DIR} to a writable directory", RuntimeWarning, stacklevel=4)
    return catalog


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# -- build ---------------------------------------------------------------------------------


def _fingerprint(fmt: str, files: Sequence[str], rows: np.ndarray, digests: Sequence[str],
                 schema_of: np.ndarray, schemas: Sequence[Schema]) -> str:
    used = sorted({int(i) for i in np.unique(schema_of) if i >= 0})
    payload = [VERSION, fmt, [schemas[i] for i in used], list(files), rows.tolist(), list(digests)]
    return hashlib.sha256(json.dumps(payload, separators=(",", ":")).encode()).hexdigest()[:16]


def _build(directory: str, fmt: str, files: list[str], sizes: np.ndarray, mtimes: np.ndarray,
           old: Catalog | None, progress: bool | None, name: str, built_ns: int) -> Catalog:
    """Scan the files that ``old`` does not describe (all of them without ``old``)."""
    reusable: dict[str, int] = {}
    if old is not None:
        reusable = {f: i for i, f in enumerate(old.files)}
    old_bases = None
    if old is not None and old.line_index is not None:
        old_bases = np.concatenate(([0], np.cumsum(old.rows + 1))).astype(np.int64)
    n = len(files)
    rows = np.zeros(n, dtype=np.int64)
    schema_of = np.full(n, -1, dtype=np.int64)
    digests: list[str] = [""] * n
    schemas: dict[Schema, int] = {}
    indexes: list[np.ndarray | None] = [None] * n if fmt == "jsonl" else []
    todo = []
    for k, file in enumerate(files):
        i = reusable.get(file)
        if i is not None and old.sizes[i] == sizes[k] and old.mtimes[i] == mtimes[k] and _settled(old, mtimes[k]):
            rows[k], digests[k] = old.rows[i], old.digests[i]
            if old.schema_of[i] >= 0:
                schema_of[k] = schemas.setdefault(old.schemas[int(old.schema_of[i])], len(schemas))
            if indexes and old_bases is not None:
                indexes[k] = np.asarray(old.line_index[old_bases[i]:old_bases[i + 1]])
        else:
            todo.append(k)
    bar = Progress(len(todo), f"zephon: cataloging {name!r} ({len(todo):,} {fmt} files)", progress)
    try:
        for k in todo:
            path = os.path.join(directory, files[k])
            if fmt == "parquet":
                scanned = _parquet.scan(path)
                rows[k], columns = scanned.rows, scanned.columns
            else:
                scanned = _jsonl.scan(path)
                rows[k], indexes[k] = len(scanned.index) - 1, scanned.index
                columns = None if scanned.columns is None else tuple((c, "json") for c in scanned.columns)
            digests[k] = scanned.digest
            if columns is not None:
                schema_of[k] = schemas.setdefault(columns, len(schemas))
            bar.advance()
    finally:
        bar.close()
    ordered = tuple(sorted(schemas, key=schemas.get))
    index = np.concatenate(indexes).astype(np.int64) if fmt == "jsonl" else None
    fingerprint = _fingerprint(fmt, files, rows, digests, schema_of, ordered)
    return Catalog(directory, fmt, tuple(files), sizes, mtimes, rows, tuple(digests), schema_of, ordered,
                   index, fingerprint, built_ns, None, len(todo))


def _settled(catalog: Catalog, mtime: Any) -> bool:
    """The entry was written well before the catalog read it (see RACY_NS)."""
    return mtime < catalog.built_ns - RACY_NS


def _unchanged(catalog: Catalog, files: list[str], sizes: np.ndarray, mtimes: np.ndarray) -> bool:
    return (len(catalog.files) == len(files) and np.array_equal(catalog.sizes, sizes)
            and np.array_equal(catalog.mtimes, mtimes) and list(catalog.files) == files
            and bool(_settled(catalog, mtimes.max())))


def load_or_build(path: Any, fmt: str | None = None, *, name: str = "dataset", cache_dir: Any = None,
                  progress: bool | None = None) -> Catalog:
    """The catalog of the dataset directory ``path``: reused from disk if still valid, else (re)built and saved.

    Raises ``FileNotFoundError`` for a missing path and ``ValueError`` (naming the file) for
    everything else: not a directory, no shard files, mixed formats, an unreadable file.
    """
    directory = os.path.abspath(os.fspath(path))
    built_ns = time.time_ns()
    fmt, files, sizes, mtimes = _listing(directory, fmt, name)
    candidates = locations(directory, None if cache_dir is None else os.fspath(cache_dir))
    stored = [c for c in (_load(location, fmt) for location in candidates) if c is not None]
    for catalog in stored:
        if _unchanged(catalog, files, sizes, mtimes):
            return replace(catalog, directory=directory)
    built = _build(directory, fmt, files, sizes, mtimes, stored[0] if stored else None, progress, name, built_ns)
    return _save(built, candidates)
