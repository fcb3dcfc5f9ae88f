"""The shard catalog of a dataset directory: built once, cached outside the data, checked on every load.

One entry per shard, shard id = position in sorted file-name order (or in the order given, for
Hugging Face datasets):

| field | meaning |
|---|---|
| ``files`` | file name inside the directory |
| ``sizes`` | bytes in storage (``Dataset.raw_bytes()``) |
| ``mtimes_ns`` | modification time (object stores: when the object was written); with ``sizes``, the object's identity |
| ``rows`` | records: Parquet footer ``num_rows``; Arrow record-batch rows; JSONL non-blank lines |
| ``digests`` | content hash: blake2b-64 of the Parquet footer, of every Arrow message, of the decompressed JSONL |
| ``schema_of`` | index into ``schemas`` (column ``(name, type)`` lists); -1 for a JSONL file without records |
| ``index`` | per file, a format's int64 index: JSONL line offsets, Arrow record-batch extents (a sidecar) |

**Where.** A catalog is never written into the data. It is cached in ``catalog_dir=`` if
given, else in ``$ZEPHON_CACHE_DIR``, else ``$XDG_CACHE_HOME/zephon``, else
``~/.cache/zephon``, as ``catalog-<key>.json`` (``key``: sha256 of the dataset's URI; for a
local directory its real path). A catalog *published* next to the data
(``<directory>/.zephon-catalog.json``, written on purpose by :func:`build_catalog` or
``zephon catalog build URI``) is read through the dataset's filesystem and used while it
matches the files; it is never written implicitly. Everything works on read-only data.

**Format.** JSON, ``{"kind": "zephon.catalog", "version": 2, ...}``, one list per field
(columnar: 100,000 shards load in tens of milliseconds). The indexes live in one sidecar
``<catalog stem>.<listing key>.index.npy``: every file's index concatenated (``index_sizes``
entries each), memory-mapped on load from the cache.

**Writes** go through :func:`zephon.io.atomic.write_atomically` (a temporary file in the same
directory, fsync, ``os.replace``, fsync of the directory): readers see the old catalog or the
new one, never half of one. Concurrent builders write identical content.

**Validation on load.** Wrong kind, version, format or shape, or a missing sidecar, and the
catalog is ignored and rebuilt. The directory is listed (one request on object stores);
entries whose name, size and mtime match are reused, the rest are scanned again and the
catalog is rewritten. Nothing is re-read when nothing changed. As in git's "racy clean"
rule, an entry whose mtime is within :data:`RACY_NS` of the build is not trusted (a same-size
rewrite inside one timestamp tick would look unchanged): it is scanned again next time.

**Fingerprint.** sha256 (16 hex digits) of the format, the schemas, the file names, sizes, row
counts and content digests: stable when the files are copied (mtimes are not part of it),
changed when a file is added, removed, renamed or edited.
"""
from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence, TypedDict

import numpy as np
import pyarrow as pa

from zephon.io import _parquet, _jsonl, _arrow, _megatron, _datatrove  # noqa: F401, I001 - they register their formats, in this order
from zephon.io._fs import Entry, Location, entries_of, listing, locate
from zephon.io._shards import FORMATS, Scan, Shards, widened
from zephon.io.atomic import write_atomically
from zephon.io.progress import Progress
from zephon.io.retry import DEFAULT_POLICY, RetryPolicy, StorageError

KIND, VERSION = "zephon.catalog", 2
CATALOG_NAME = ".zephon-catalog.json"
ENV_CACHE_DIR = "ZEPHON_CACHE_DIR"
RACY_NS = 2 * 10**9  # files modified this close to a build are re-scanned on the next load

Schema = tuple[tuple[str, str], ...]  # (column name, type) per column; JSONL types are "json"


class CatalogDocument(TypedDict):
    """A catalog file's JSON (see the module docstring for each field; one list entry per shard)."""

    kind: str  # KIND
    version: int  # VERSION
    format: str  # a registered format: "parquet", "jsonl", "arrow"
    directory: str
    fingerprint: str
    built_ns: int
    files: list[str]
    sizes: list[int]
    mtimes_ns: list[int]
    rows: list[int]
    digests: list[str]
    schema_of: list[int]
    schemas: list[list[list[str]]]  # per schema, [name, type] per column
    index: str | None  # the index sidecar's file name, beside the catalog (None: no index)
    index_sizes: list[int] | None  # entries of each file's index


@dataclass(frozen=True, slots=True, eq=False)
class Catalog:
    """The shard table of one directory dataset (see the module docstring for each field)."""

    directory: str  # the dataset's URI (a local directory: its absolute path)
    fmt: str  # a registered format: "parquet", "jsonl", "arrow"
    files: tuple[str, ...]  # sorted; shard id = position
    sizes: np.ndarray  # int64 bytes on disk
    mtimes: np.ndarray  # int64 ns
    rows: np.ndarray  # int64 records per shard
    digests: tuple[str, ...]  # content hash per shard
    schema_of: np.ndarray  # int64 index into schemas, -1 = no records to tell
    schemas: tuple[Schema, ...]
    index: np.ndarray | None  # every file's format index, concatenated (None: the format has none)
    index_sizes: np.ndarray | None  # int64 entries of each file's index
    fingerprint: str  # see the module docstring
    built_ns: int  # wall clock (ns) when the files were stat-ed for this build
    location: str | None = None  # the catalog file it was loaded from or saved to
    scanned: int = 0  # files scanned to build it (0: reused as is)
    source: Location | None = field(default=None, repr=False)  # where the files are read

    def shards(self, name: str, policy: RetryPolicy) -> Shards:
        """What a reader of these files needs (a catalog from :func:`load_or_build`, which knows its ``source``)."""
        if self.source is None:
            raise ValueError(f"the catalog of {self.directory} has no source to read from; get it from load_or_build")
        starts = None if self.index_sizes is None else np.concatenate(([0], np.cumsum(self.index_sizes)))
        return Shards(name, self.source, self.files, self.sizes, self.mtimes, self.rows, self.index, starts, policy)

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


def uncombined(schemas: Iterable[Schema]) -> str | None:
    """Why the rows of shards with these catalog schemas (``(column, type name)`` pairs) do not
    make one table of :func:`widened` columns, in words; None when they do."""
    kinds: dict[str, set[str]] = {}
    names = set()
    for schema in schemas:
        names.add(frozenset(name for name, _ in schema))
        for name, kind in schema:
            kinds.setdefault(name, set()).add(kind)
    if len(names) > 1:
        return "their shards have different columns"
    for name, found in kinds.items():
        if len(found) > 1:
            try:
                widened(name, [pa.type_for_alias(kind) for kind in sorted(found)])
            except (ValueError, KeyError):  # no such alias: a nested type, which only its very self holds
                return f"column {name!r} is {', '.join(sorted(found))} in different shards"
    return None


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


def _check_fmt(fmt: str | None, name: str) -> None:
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"Dataset {name!r}: fmt={fmt!r} must be one of {tuple(FORMATS)} or None (auto-detect)")


def _listing(source: Location, fmt: str | None, name: str) -> tuple[str, list[Entry], bool]:
    """The format, the shard files (sorted by name) and whether a published catalog sits next to them."""
    _check_fmt(fmt, name)
    entries = listing(source, name)
    published = any(e.name == CATALOG_NAME for e in entries)
    found = {f: [e for e in entries if FORMATS[f].matches(e.name)] for f in FORMATS}
    labels = ", ".join(FORMATS[f].label for f in FORMATS if FORMATS[f].detect)
    if fmt is None:
        present = [f for f in FORMATS if found[f] and FORMATS[f].detect]
        if len(present) > 1:
            a, b = (found[f][0].name for f in present[:2])
            raise ValueError(f"Dataset {name!r}: {source.uri} mixes formats ({a} and {b}); keep one format per "
                             "directory or pass fmt=")
        if not present:
            raise ValueError(f"Dataset {name!r}: {source.uri} holds no {labels}, *.jsonl.gz or *.jsonl.zst "
                             "files; point it at a non-empty dataset directory")
        fmt = present[0]
    if not found[fmt]:
        other = [f for f in FORMATS if found[f] and f != fmt]
        hint = f" (it holds {other[0]} files: pass fmt={other[0]!r})" if other else ""
        raise ValueError(f"Dataset {name!r}: {source.uri} holds no {fmt} files{hint}")
    return fmt, found[fmt], published


# -- locations ---------------------------------------------------------------------------------


def cache_root(catalog_dir: str | os.PathLike[str] | None = None) -> str:
    """Where catalogs are cached: ``catalog_dir``, else ``$ZEPHON_CACHE_DIR``, ``$XDG_CACHE_HOME/zephon``,
    ``~/.cache/zephon``."""
    if catalog_dir is not None:
        return os.fspath(catalog_dir)
    if os.environ.get(ENV_CACHE_DIR):
        return os.environ[ENV_CACHE_DIR]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "zephon")


def _key(source: Location, files: Sequence[str] | None) -> str:
    uri = os.path.realpath(source.root) if source.is_local else source.uri
    named = "" if files is None else "\0" + "\0".join(sorted(files))  # catalogs of a directory's subsets apart
    return hashlib.sha256((uri + named).encode()).hexdigest()[:16]


def cached_location(source: Location, catalog_dir: str | os.PathLike[str] | None = None,
                    files: Sequence[str] | None = None) -> str:
    """The cache file of the catalog of ``source`` (of its ``files`` only, when given)."""
    return os.path.join(cache_root(catalog_dir), f"catalog-{_key(source, files)}.json")


def _sidecar_stem(location: str) -> str:
    return location[:-len(".json")] if location.endswith(".json") else location


def _listing_key(files: Sequence[str], sizes: np.ndarray, mtimes: np.ndarray) -> str:
    digest = hashlib.sha256(json.dumps(list(files)).encode())
    digest.update(sizes.tobytes())
    digest.update(mtimes.tobytes())
    return digest.hexdigest()[:16]


# -- load / save ---------------------------------------------------------------------------------


def _parse(data: Any, fmt: str, index_of: Callable[[str], np.ndarray]) -> Catalog | None:
    """A catalog from its JSON; ``index_of(name)`` loads the sidecar. None if malformed."""
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
    index = index_sizes = None
    if data["index"] is not None:
        index_sizes = np.array(data["index_sizes"], dtype=np.int64)
        index = index_of(data["index"])
        if index_sizes.shape != (n,) or index.dtype != np.int64 or index.shape != (int(index_sizes.sum()),):
            return None
    return Catalog(str(data["directory"]), fmt, files, sizes, mtimes, rows, digests, schema_of, schemas,
                   index, index_sizes, str(data["fingerprint"]), int(data["built_ns"]))


def _load(location: str, fmt: str) -> Catalog | None:
    """The catalog cached at ``location``, or None if missing, unreadable or malformed."""
    try:
        with open(location, "rb") as file:
            data = json.load(file)
        found = _parse(data, fmt, lambda sidecar: np.load(os.path.join(os.path.dirname(location), sidecar),
                                                             mmap_mode="r"))
        return None if found is None else replace(found, location=location)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _load_published(source: Location, fmt: str) -> Catalog | None:
    """The catalog published next to the data (read through its filesystem), or None."""
    try:
        data = json.loads(source.read_bytes(CATALOG_NAME))
        found = _parse(data, fmt, lambda sidecar: np.load(io.BytesIO(source.read_bytes(sidecar))))
        return None if found is None else replace(found, location=source.uri_of(CATALOG_NAME))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, pa.ArrowException):
        return None


def _document(catalog: Catalog, sidecar: str | None) -> bytes:
    data = CatalogDocument(
        kind=KIND, version=VERSION, format=catalog.fmt, directory=catalog.directory,
        fingerprint=catalog.fingerprint, built_ns=catalog.built_ns, files=list(catalog.files),
        sizes=catalog.sizes.tolist(), mtimes_ns=catalog.mtimes.tolist(),
        rows=catalog.rows.tolist(), digests=list(catalog.digests),
        schema_of=catalog.schema_of.tolist(), schemas=[list(map(list, s)) for s in catalog.schemas],
        index=sidecar, index_sizes=None if catalog.index_sizes is None else catalog.index_sizes.tolist())
    return json.dumps(data, separators=(",", ":")).encode()


def _sidecar(catalog: Catalog, location: str) -> tuple[str | None, bytes]:
    """The index sidecar's file name (beside ``location``) and content; ``(None, b"")`` when the format keeps no index."""
    if catalog.index is None:
        return None, b""
    key = _listing_key(catalog.files, catalog.sizes, catalog.mtimes)
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(catalog.index, dtype=np.int64))
    return os.path.basename(f"{_sidecar_stem(location)}.{key}.index.npy"), buffer.getvalue()


def _save(catalog: Catalog, location: str) -> Catalog:
    """Cache the catalog at ``location``; warn (and carry on) if it cannot be written."""
    try:
        folder = os.path.dirname(location)
        os.makedirs(folder, exist_ok=True)
        sidecar, content = _sidecar(catalog, location)
        if sidecar is not None:
            write_atomically(os.path.join(folder, sidecar), content)
        write_atomically(location, _document(catalog, sidecar))
        for stale in glob.glob(glob.escape(_sidecar_stem(location)) + ".*.index.npy"):
            if os.path.basename(stale) != sidecar:
                _remove(stale)
        return replace(catalog, location=location)
    except OSError as error:
        warnings.warn(f"zephon: could not cache the catalog of {catalog.directory} ({location}: {error}); it will "
                      f"be rebuilt next time; set {ENV_CACHE_DIR} or pass catalog_dir= to a writable directory",
                      RuntimeWarning, stacklevel=4)
        return catalog


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# -- build ---------------------------------------------------------------------------------


def fingerprint_of(fmt: str, files: Sequence[str], sizes: np.ndarray, rows: np.ndarray, digests: Sequence[str],
                 schema_of: np.ndarray, schemas: Sequence[Schema]) -> str:
    """A catalog's fingerprint (see the module docstring)."""
    used = sorted({int(i) for i in np.unique(schema_of) if i >= 0})
    payload = [VERSION, fmt, [schemas[i] for i in used], list(files), sizes.tolist(), rows.tolist(), list(digests)]
    return hashlib.sha256(json.dumps(payload, separators=(",", ":")).encode()).hexdigest()[:16]


def _scan(source: Location, fmt: str, entry: Entry, k: int, name: str, policy: RetryPolicy) -> Scan:
    """Scan one file under the retry policy; bad content raises ValueError naming the file."""
    try:
        return policy.call(lambda: FORMATS[fmt].scan(source, entry), what="scan", dataset=name, shard=k,
                           uri=source.uri_of(entry.name))
    except StorageError:
        raise
    except (ValueError, OSError, pa.ArrowException) as error:
        message = str(error)
        if source.uri_of(entry.name) in message:
            raise ValueError(f"Dataset {name!r}: {message}") from error
        raise ValueError(f"Dataset {name!r}: {source.uri_of(entry.name)}: cannot read this {fmt} file ({error}); "
                         "check that it is readable and not corrupted") from error


def _build(source: Location, fmt: str, entries: list[Entry], old: Catalog | None, progress: bool | None,
           name: str, built_ns: int, policy: RetryPolicy) -> Catalog:
    """Scan the files that ``old`` does not describe (all of them without ``old``)."""
    files = [e.name for e in entries]
    sizes = np.array([e.size for e in entries], dtype=np.int64)
    mtimes = np.array([e.mtime_ns for e in entries], dtype=np.int64)
    reusable = {} if old is None else {f: i for i, f in enumerate(old.files)}
    old_index = None  # the old catalog's index and where each file's part starts
    if old is not None and old.index is not None and old.index_sizes is not None:
        old_index = old.index, np.concatenate(([0], np.cumsum(old.index_sizes))).astype(np.int64)
    n = len(files)
    rows = np.zeros(n, dtype=np.int64)
    schema_of = np.full(n, -1, dtype=np.int64)
    digests: list[str] = [""] * n
    schemas: dict[Schema, int] = {}
    indexes: list[np.ndarray | None] = [None] * n
    todo = []
    for k, file in enumerate(files):
        i = reusable.get(file)
        if old is not None and i is not None and old.sizes[i] == sizes[k] and old.mtimes[i] == mtimes[k] and _settled(old, mtimes[k]):
            rows[k], digests[k] = old.rows[i], old.digests[i]
            if old.schema_of[i] >= 0:
                schema_of[k] = schemas.setdefault(old.schemas[int(old.schema_of[i])], len(schemas))
            if old_index is not None:
                every, starts = old_index
                indexes[k] = np.asarray(every[starts[i]:starts[i + 1]])
        else:
            todo.append(k)
    bar = Progress(len(todo), f"zephon: cataloging {name!r} ({len(todo):,} {fmt} files)", progress)
    try:
        for k in todo:
            scanned = _scan(source, fmt, entries[k], k, name, policy)
            rows[k], digests[k], indexes[k] = scanned.rows, scanned.digest, scanned.index
            if scanned.columns is not None:
                schema_of[k] = schemas.setdefault(scanned.columns, len(schemas))
            bar.advance()
    finally:
        bar.close()
    ordered = tuple(sorted(schemas, key=schemas.__getitem__))
    index = index_sizes = None
    if any(i is not None for i in indexes):
        parts = [np.zeros(0, dtype=np.int64) if i is None else np.asarray(i, dtype=np.int64) for i in indexes]
        index_sizes = np.array([len(p) for p in parts], dtype=np.int64)
        index = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    fingerprint = fingerprint_of(fmt, files, sizes, rows, digests, schema_of, ordered)
    return Catalog(source.uri, fmt, tuple(files), sizes, mtimes, rows, tuple(digests), schema_of, ordered,
                   index, index_sizes, fingerprint, built_ns, None, len(todo), source)


def _settled(catalog: Catalog, mtime: int | np.integer) -> bool:
    """The entry was written well before the catalog read it (see RACY_NS)."""
    return bool(mtime < catalog.built_ns - RACY_NS)


def _unchanged(catalog: Catalog, entries: list[Entry]) -> bool:
    return (len(catalog.files) == len(entries) and list(catalog.files) == [e.name for e in entries]
            and catalog.sizes.tolist() == [e.size for e in entries]
            and catalog.mtimes.tolist() == [e.mtime_ns for e in entries]
            and _settled(catalog, max((e.mtime_ns for e in entries), default=0)))


def load_or_build(uri: Any, fmt: str | None = None, *, name: str = "dataset",
                  catalog_dir: str | os.PathLike[str] | None = None,
                  progress: bool | None = None, filesystem: Any = None, files: Sequence[str] | None = None,
                  policy: RetryPolicy = DEFAULT_POLICY) -> Catalog:
    """The catalog of the dataset directory ``uri``: reused if still valid, else (re)built and cached.

    ``files`` names the shard files in shard order (default: every file of the format, sorted).
    Raises ``FileNotFoundError`` for a missing directory, ``OSError`` when the storage cannot be
    listed, and ``ValueError`` (naming the file) for everything else: not a directory, no shard
    files, mixed formats, an unreadable file.
    """
    source = locate(uri, filesystem, name=name)
    built_ns = time.time_ns()
    if files is None:
        fmt, entries, published = _listing(source, fmt, name)
    else:
        _check_fmt(fmt, name)
        if fmt is None:
            raise ValueError(f"Dataset {name!r}: files= needs fmt= (the format of those files)")
        entries, published = entries_of(source, list(files), name), False
    cache = cached_location(source, catalog_dir, None if files is None else [e.name for e in entries])
    found = [_load_published(source, fmt) if published else None, _load(cache, fmt)]
    stored = [c for c in found if c is not None]
    for catalog in stored:
        if _unchanged(catalog, entries):
            return replace(catalog, directory=source.uri, source=source)
    built = _build(source, fmt, entries, stored[0] if stored else None, progress, name, built_ns, policy)
    return _save(built, cache)


def build_catalog(uri: Any, out: str | os.PathLike[str] | None = None, filesystem: Any = None, *, fmt: str | None = None,
                  progress: bool | None = None) -> str:
    """Build the catalog of ``uri`` and publish it; returns where it was written.

    ``out`` is a local path for the catalog file; by default it is published next to the
    data, ``<uri>/.zephon-catalog.json``, through the dataset's filesystem (``filesystem``, or
    the one ``uri`` names), so that every reader of the data finds it. Its index sidecar
    (JSONL and Arrow) is written beside it.
    """
    name = os.fspath(uri) if isinstance(uri, (str, os.PathLike)) else repr(uri)
    source = locate(uri, filesystem, name=name)
    catalog = load_or_build(uri, fmt, name=name, progress=progress, filesystem=filesystem, catalog_dir=None)
    if out is not None:
        target = os.path.abspath(os.fspath(out))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        sidecar, content = _sidecar(catalog, target)
        if sidecar is not None:
            write_atomically(os.path.join(os.path.dirname(target), sidecar), content)
        write_atomically(target, _document(catalog, sidecar))
        return target
    sidecar, content = _sidecar(catalog, CATALOG_NAME)
    if sidecar is not None:
        _write_through(source, sidecar, content)
    _write_through(source, CATALOG_NAME, _document(catalog, sidecar))
    return source.uri_of(CATALOG_NAME)


def _write_through(source: Location, file: str, content: bytes) -> None:
    if source.is_local:
        write_atomically(source.path(file), content)
        return
    try:
        with source.fs.open_output_stream(source.path(file)) as stream:
            stream.write(content)
    except (OSError, pa.ArrowException) as error:
        raise OSError(f"cannot write {source.uri_of(file)} ({error}); pass --out PATH (out=) to write the catalog "
                      "elsewhere and copy it next to the data") from error
