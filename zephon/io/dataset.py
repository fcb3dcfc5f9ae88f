"""Datasets: named, sharded collections of records, described by their shard table.

| constructor | payload |
|---|---|
| ``Dataset.from_counts(name, counts, shard_ids=None, raw_bytes=None)`` | none: scheduling only |
| ``Dataset.from_records(name, shards)`` | in-memory records, shard id = position |
| ``Dataset.from_path(name, uri, fmt=None)`` | a directory of Parquet, JSONL or Arrow files (local or in object storage), one file = one shard |
| ``Dataset.from_hf(name, dataset_or_path)`` | a Hugging Face ``datasets`` dataset: one shard per Arrow file |
| ``Dataset.from_megatron(name, prefix_or_glob)`` | Megatron ``.bin`` / ``.idx`` pairs: one shard per pair, one row per document |
| ``Dataset.from_token_files(name, path, ...)`` | flat token files (or datatrove ``.ds``): one shard per file, one row per document |

The scheduler reads only ``name``, ``ids()`` and ``counts()``; ``read`` / ``read_table`` turn
pointers back into records, and :func:`zephon.io.fetch` does it for many datasets at once.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from zephon.io import _datatrove, _flat, _megatron
from zephon.io import catalog as _catalog
from zephon.io._cache import CacheInfo, ShardCache
from zephon.io._hf import check_view, hf_files
from zephon.io._fs import Location, on_local_disk
from zephon.io._shards import FORMATS, ShardReader, records_table
from zephon.io._shared import SharedPieces
from zephon.io._tokens import TokenReader, token_dtype, token_paths
from zephon.io.retry import DEFAULT_POLICY, LOCAL_DISK_POLICY, RetryPolicy
from zephon.limits import MAX_SAMPLES, MAX_SHARDS, show


COMPANIONS = (".index", ".metadata", ".loss", ".idx")  # beside token files, never token files themselves
LOG = logging.getLogger("zephon")


def _nothing() -> None:
    """The release of a reader that had no cache to follow."""


def _int_array(parameter: str, name: str, values: Any, limit: int, fix: str) -> np.ndarray:
    """``values`` as int64, each in ``[0, limit]``, or a ``TypeError``/``ValueError`` naming ``parameter``."""
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):  # ragged nesting: numpy cannot even shape it
        array = np.empty((0, 0))
    if array.ndim == 1 and array.dtype == object and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        array = np.array([max(min(v, limit + 1), -1) for v in values], dtype=np.int64)  # out of int64: clipped, refused
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(
            f"Dataset {name!r}: {parameter} must be a 1-D sequence of ints, got {_show(values)}; "
            f"pass e.g. [1000, 2000]"
        )
    if array.size:
        low, high = array.min(), array.max()
        if low < 0:
            raise ValueError(f"Dataset {name!r}: {parameter} must be >= 0, got {int(low)}; {fix}")
        if high > limit:
            raise ValueError(f"Dataset {name!r}: {parameter} must be <= {limit} (2**{limit.bit_length() - 1}) each, "
                             f"got {_show(int(high))}; {fix}")
    return array.astype(np.int64, copy=isinstance(values, np.ndarray))  # never alias (and freeze) the caller's array


def _total(name: str, rows: np.ndarray) -> int:
    """The rows of a dataset; refused past ``MAX_SAMPLES`` (each count is at most that, so the
    int64 sum of up to 2**15 of them cannot wrap; longer tables are summed in floats first)."""
    if len(rows) > MAX_SHARDS:
        raise ValueError(f"Dataset {name!r}: {len(rows)} shards, more than the {MAX_SHARDS} (2**26) one dataset may "
                         "have (zephon.limits.MAX_SHARDS); group its files into larger shards or several datasets")
    if len(rows) > 2**15 and float(rows.sum(dtype=np.float64)) > 2 * MAX_SAMPLES:
        total = MAX_SAMPLES + 1
    else:
        total = int(rows.sum())
    if total > MAX_SAMPLES:
        raise ValueError(f"Dataset {name!r}: counts add up to {total if total <= 2 * MAX_SAMPLES else 'over 2**49'} "
                         f"rows, more than the {MAX_SAMPLES} (2**48) one dataset may hold; split it into several datasets")
    return total


def _show(values: Any) -> str:
    return show(values, 80)


def _iterable(value: Any) -> bool:
    return hasattr(value, "__iter__") and not isinstance(value, (str, bytes, dict))


def _encoded_size(record: Any) -> int:
    """Bytes of one in-memory record as a file would hold it (its JSON line, newline included)."""
    if isinstance(record, str):
        return len(record.encode("utf-8"))
    if isinstance(record, (bytes, bytearray, memoryview)):
        return len(record)
    try:
        return len(json.dumps(record, ensure_ascii=False, default=str).encode("utf-8")) + 1
    except (TypeError, ValueError):  # a record JSON cannot hold (e.g. circular): its repr's size
        return len(repr(record).encode("utf-8"))


def _policy(name: str, retry: Any, location: Location | None = None, files: Sequence[str] = ()) -> RetryPolicy:
    """``retry`` (checked), else ``RetryPolicy()``; for reads of ``files`` in ``location`` that
    all lie on a local disk (not a network or FUSE mount), with no time limit: a timed attempt
    hands each read to another thread, which costs a loader of local Parquet a tenth of its rate."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"Dataset {name!r}: retry={retry!r} must be a zephon.io.RetryPolicy or None")
    if retry is not None:
        return retry
    if location is not None and location.is_local and on_local_disk([location.root, *map(location.path, files)]):
        LOG.debug("zephon: dataset %r: the files of %s are on a local disk, so its reads run untimed in the thread "
                  "that wants them (retry=RetryPolicy(timeout_s=...) sets a limit)", name, location.uri)
        return LOCAL_DISK_POLICY
    return DEFAULT_POLICY


def _megatron_files(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith(_megatron.BIN) and not n.startswith(".")]


def _megatron_pattern(base: str) -> str:
    """The ``.bin`` files a prefix or a glob of prefixes (with or without ``.bin`` / ``.idx``) names."""
    for suffix in (_megatron.BIN, _megatron.IDX):
        if base.endswith(suffix):
            base = base[:-len(suffix)]
    return base + _megatron.BIN


def _token_files(names: list[str]) -> list[str]:
    """A directory's token files: its datatrove ``.ds`` files, else every file but hidden ones and companions."""
    shown = [n for n in names if not n.startswith(".")]
    datatrove = [n for n in shown if n.endswith(_datatrove.DS)]
    return datatrove or [n for n in shown if not n.endswith(COMPANIONS)]


def _columns_arg(name: str, columns: Any) -> tuple[str, ...] | None:
    if columns is None:
        return None
    if isinstance(columns, (str, bytes)) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"Dataset {name!r}: columns={columns!r} must be a list of column names, e.g. ['text']")
    return tuple(columns)


class Dataset:
    """A named dataset: shard ids, rows per shard and, optionally, a way to read the rows.

    ``Dataset(name, shard_ids, counts, shards=None, raw_bytes=None)``: ``shard_ids`` and
    ``counts`` are aligned sequences of ints (any order, unique ids); ``shards`` holds the
    records of each shard (in memory) and ``raw_bytes`` each shard's size on disk. Prefer
    the ``from_*`` constructors.
    """

    __slots__ = ("_name", "_ids", "_counts", "_raw_bytes", "_total", "_shards", "_reader", "_catalog")

    def __init__(self, name: str, shard_ids: Any, counts: Any, *, shards: Sequence[Sequence[Any]] | None = None,
                 raw_bytes: Any = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"Dataset name must be a non-empty str, got {name!r}; pass e.g. 'web'")
        ids = _int_array("shard_ids", name, shard_ids, 2**62, "renumber the shards")
        rows = _int_array("counts", name, counts, MAX_SAMPLES, "fix the shard table or split the dataset")
        if len(ids) != len(rows):
            raise ValueError(
                f"Dataset {name!r}: {len(ids)} shard_ids but {len(rows)} counts; pass one id per shard"
            )
        total = _total(name, rows)
        if raw_bytes is None:
            sizes = np.zeros(len(ids), dtype=np.int64)
        else:
            sizes = _int_array("raw_bytes", name, raw_bytes, 2**62, "pass the size of each shard")
            if len(sizes) != len(ids):
                raise ValueError(f"Dataset {name!r}: {len(sizes)} raw_bytes but {len(ids)} shards; "
                                 "pass one byte size per shard")
        if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():  # not ascending yet: sort, then look for repeats
            order = np.argsort(ids, kind="stable")
            ids, rows, sizes = ids[order], rows[order], sizes[order]
            if not (np.diff(ids) > 0).all():
                duplicate = int(ids[:-1][np.diff(ids) == 0][0])
                raise ValueError(f"Dataset {name!r}: shard id {duplicate} appears twice; shard ids must be unique")
        ids.flags.writeable = rows.flags.writeable = sizes.flags.writeable = False
        self._name, self._ids, self._counts, self._raw_bytes, self._total = name, ids, rows, sizes, total
        self._shards = shards
        self._reader: ShardReader[Any] | None = None
        self._catalog: _catalog.Catalog | None = None

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def from_counts(cls, name: str, counts: Sequence[int], shard_ids: Sequence[int] | None = None,
                    raw_bytes: Sequence[int] | None = None) -> Dataset:
        """A count-only dataset ``name``: shard ``i`` has ``counts[i]`` rows, id ``shard_ids[i]`` (default ``i``)
        and ``raw_bytes[i]`` bytes on disk (default 0)."""
        ids = np.arange(len(counts), dtype=np.int64) if shard_ids is None else shard_ids
        return cls(name, ids, counts, raw_bytes=raw_bytes)

    @classmethod
    def from_records(cls, name: str, shards: Sequence[Sequence[Any]]) -> Dataset:
        """An in-memory dataset ``name``; ``shards[i]`` holds the records of shard ``i``.

        Each shard's size in bytes (``raw_bytes()``) is its records' encoded size, measured
        once here: UTF-8 for ``str``, the length of ``bytes``, one JSON line otherwise. Token
        mode prices draws by it, as it prices files by their size on disk.
        """
        shards = list(shards) if _iterable(shards) else [shards]
        if not all(_iterable(shard) for shard in shards):
            raise TypeError(f"Dataset {name!r}: shards must be a sequence of sequences of records, got "
                            f"{_show(shards)}; pass e.g. [[record, ...], ...]")
        shards = [list(shard) for shard in shards]
        sizes = [sum(map(_encoded_size, shard)) for shard in shards]
        return cls(name, np.arange(len(shards), dtype=np.int64), [len(s) for s in shards], shards=shards,
                   raw_bytes=sizes)

    @classmethod
    def from_path(cls, name: str, uri: str | os.PathLike[str], fmt: str | None = None, *, filesystem: Any = None,
                  catalog_dir: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                  progress: bool | None = None, cache_shards: int = 1, cache_bytes: int | None = None,
                  check_schema: bool = True, retry: RetryPolicy | None = None) -> Dataset:
        """A directory of shard files, one file per shard, local or in object storage.

        Parameters
        ----------
        name : str
            The dataset's name (in errors, checkpoints and mixtures).
        uri : str or os.PathLike
            A local directory, or a ``file://``, ``s3://``, ``gs://``, ``abfs://`` or ``hdfs://``
            URI (credentials and endpoints are found the standard way, e.g. ``AWS_ENDPOINT_URL``).
            Shard ``i`` is the ``i``-th file in sorted name order (hidden files and subdirectories
            are ignored).
        fmt : str or None, default None
            ``"parquet"`` (``*.parquet``), ``"jsonl"`` (``*.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``),
            ``"arrow"`` (Arrow IPC ``*.arrow``, ``*.feather``), or ``None``: detect (mixed formats raise).
        filesystem : pyarrow.fs.FileSystem, fsspec filesystem or None, default None
            Read ``uri`` (then a path in it) through this filesystem instead of the one it names.
        catalog_dir : str, os.PathLike or None, default None
            Where the shard catalog is cached (default ``$ZEPHON_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/zephon``, else ``~/.cache/zephon``). Nothing is ever written into
            the data; a catalog published there (``zephon catalog build``) is used while it matches.
        cache_dir : str, os.PathLike or None, default None
            The former name of ``catalog_dir``.
        progress : bool or None, default None
            The catalog build's progress bar on stderr: ``None`` shows it when the build is slow
            and stderr is a terminal, ``True`` always, ``False`` never.
        cache_shards, cache_bytes : int, int or None, default 1, None
            Bounds of the fetch cache (see :meth:`configure_cache`).
        check_schema : bool, default True
            Check that every shard has the same columns (for JSONL, the first record's keys).
        retry : RetryPolicy or None, default None
            How failed reads are retried and timed out (see :mod:`zephon.io.retry`). ``None``:
            ``RetryPolicy()``, with no time limit on reads of files on a local disk (a network or
            FUSE mount keeps it); pass a policy with ``timeout_s`` to time those too.

        Raises ``FileNotFoundError`` if ``uri`` does not exist, ``OSError`` (naming the dataset and
        the URI) when the storage cannot be listed or read, and ``ValueError`` naming the file for
        an empty directory, mixed formats, an unreadable or corrupted file, or shards whose
        columns differ.
        """
        return cls._from_catalog(name, uri, fmt, filesystem=filesystem,
                                 catalog_dir=catalog_dir if catalog_dir is not None else cache_dir,
                                 progress=progress, cache_shards=cache_shards, cache_bytes=cache_bytes,
                                 check_schema=check_schema, retry=retry, files=None)

    @classmethod
    def from_hf(cls, name: str, dataset_or_path: Any, *, filesystem: Any = None,
                catalog_dir: str | os.PathLike[str] | None = None, progress: bool | None = None,
                cache_shards: int = 1, cache_bytes: int | None = None, retry: RetryPolicy | None = None) -> Dataset:
        """A Hugging Face ``datasets`` dataset, read from its Arrow files (no network, one shard per file).

        Parameters
        ----------
        name : str
            The dataset's name.
        dataset_or_path : datasets.Dataset, str or os.PathLike
            A loaded ``datasets.Dataset`` backed by Arrow files that shows exactly their rows
            and columns, or the directory ``Dataset.save_to_disk`` wrote (local or a URI, as in
            :meth:`from_path`; for a ``DatasetDict``, one split's directory). A dataset changed
            in memory (``select``, ``shuffle``, ``filter``, ``shard``, a split slice such as
            ``split="train[:10]"``, ``rename_column``, ``remove_columns``, ``select_columns``,
            ...) is refused: call its ``flatten_indices()`` first, which writes what it shows
            to a new Arrow file.
        filesystem, catalog_dir, progress, cache_shards, cache_bytes, retry
            As in :meth:`from_path`.

        Raises ``ValueError`` saying what was expected when ``dataset_or_path`` is neither, and
        saying what to do when a loaded dataset shows other rows or columns than its files hold.
        """
        cls(name, [], [])  # check the name first
        uri, files, filesystem = hf_files(name, dataset_or_path, filesystem)
        dataset = cls._from_catalog(name, uri, "arrow", filesystem=filesystem, catalog_dir=catalog_dir,
                                    progress=progress, cache_shards=cache_shards, cache_bytes=cache_bytes,
                                    check_schema=True, retry=retry, files=files)
        check_view(name, dataset_or_path, dataset.total(), dataset.catalog.schema() if dataset.catalog else None)
        return dataset

    @classmethod
    def _from_catalog(cls, name: str, uri: Any, fmt: str | None, *, filesystem: Any, catalog_dir: Any,
                      progress: bool | None, cache_shards: int, cache_bytes: int | None, check_schema: bool,
                      retry: RetryPolicy | None, files: list[str] | None) -> Dataset:
        cls(name, [], [])  # check the name before touching the storage
        cache = ShardCache(cache_shards, cache_bytes)
        catalog = _catalog.load_or_build(uri, fmt, name=name, catalog_dir=catalog_dir, progress=progress,
                                         filesystem=filesystem, files=files, policy=_policy(name, retry))
        if check_schema:
            catalog.check_schema(name)
        shards = catalog.shards(name, _policy(name, retry, catalog.source, catalog.files))
        return cls._read_through(name, catalog, FORMATS[catalog.fmt].reader(shards, cache))

    @classmethod
    def _read_through(cls, name: str, catalog: _catalog.Catalog, reader: ShardReader[Any]) -> Dataset:
        """The dataset of ``catalog``'s files, read by ``reader``."""
        dataset = cls(name, np.arange(len(catalog.files), dtype=np.int64), catalog.rows, raw_bytes=catalog.sizes)
        dataset._reader, dataset._catalog = reader, catalog
        return dataset

    @classmethod
    def from_megatron(cls, name: str, prefix_or_glob: str | os.PathLike[str], *, filesystem: Any = None,
                      catalog_dir: str | os.PathLike[str] | None = None, progress: bool | None = None,
                      cache_shards: int = 1, cache_bytes: int | None = None, retry: RetryPolicy | None = None) -> Dataset:
        """Megatron indexed datasets (``.bin`` + ``.idx`` pairs): one shard per pair, one row per document.

        A record is ``{"input_ids": tokens, "num_tokens": n}``, ``tokens`` a read-only view in
        the file's dtype. Token counts come from the index (``tokens()``), so token-aware
        sources need no tokenizer. Raises ``FileNotFoundError`` when nothing matches and
        ``ValueError`` naming the file for a wrong magic, version or dtype code, a truncated
        file, or an ``.idx`` whose counts do not match its ``.bin``.

        Parameters
        ----------
        name : str
            The dataset's name.
        prefix_or_glob : str or os.PathLike
            A pair's prefix (``/data/web_text_document`` for ``web_text_document.bin`` / ``.idx``;
            a trailing ``.bin`` or ``.idx`` is allowed), a glob of prefixes in one directory
            (``s3://bucket/tok/web_*``), or a directory (every ``.bin`` in it). Local or any URI
            :meth:`from_path` reads.
        filesystem, catalog_dir, progress, cache_shards, cache_bytes, retry
            As in :meth:`from_path`.
        """
        cls(name, [], [])
        location, files = token_paths(name, prefix_or_glob, filesystem, _megatron_files, _megatron_pattern)
        return cls._from_catalog(name, location.uri, "megatron", filesystem=filesystem, catalog_dir=catalog_dir,
                                 progress=progress, cache_shards=cache_shards, cache_bytes=cache_bytes,
                                 check_schema=True, retry=retry, files=files)

    @classmethod
    def from_token_files(cls, name: str, path: str | os.PathLike[str], *, dtype: Any = None, eos_id: int | None = None,
                         doc_lengths: Sequence[Any] | None = None, filesystem: Any = None,
                         catalog_dir: str | os.PathLike[str] | None = None, progress: bool | None = None,
                         cache_shards: int = 1, cache_bytes: int | None = None,
                         retry: RetryPolicy | None = None) -> Dataset:
        """Files of raw tokens, one shard per file, one row per document.

        ``.ds`` files with a ``.ds.index`` beside them (what datatrove's tokenizer writes) take
        their document ends from it, and then neither ``eos_id`` nor ``doc_lengths`` may be
        given. Records and errors are as in :meth:`from_megatron`.

        Parameters
        ----------
        name : str
            The dataset's name.
        path : str or os.PathLike
            A file, a glob of files in one directory, or a directory: its datatrove ``*.ds``
            files if it has any, else every file in it (hidden files and ``.index`` /
            ``.metadata`` / ``.loss`` / ``.idx`` companions left out). Local or any URI
            :meth:`from_path` reads.
        dtype : numpy dtype or str or None, default None
            The tokens' integer type (``"uint16"``, ``"uint32"``, ...; little-endian). Required
            for flat files; for datatrove files it is read from the files' sizes, and checked if given.
        eos_id : int or None, default None
            Flat files: a document ends after each token with this id (tokens after the last
            one form a last document). Every token is read once to find them.
        doc_lengths : sequence or None, default None
            Flat files, instead of ``eos_id``: tokens per document in file order (one sequence
            per file, in file-name order; for one file, the sequence itself).
        filesystem, catalog_dir, progress, cache_shards, cache_bytes, retry
            As in :meth:`from_path` (``catalog_dir`` and ``progress``: datatrove files, whose
            catalog is cached; flat files' document ends are found on every build).
        """
        cls(name, [], [])
        location, files = token_paths(name, path, filesystem, _token_files)
        layouts = {f.endswith(_datatrove.DS) for f in files}
        if layouts == {True}:
            return cls._from_datatrove(name, location, files, dtype, eos_id, doc_lengths, filesystem=filesystem,
                                       catalog_dir=catalog_dir, progress=progress, cache_shards=cache_shards,
                                       cache_bytes=cache_bytes, retry=retry)
        if len(layouts) > 1:
            raise ValueError(f"Dataset {name!r}: {location.uri} mixes datatrove .ds files with other files; pass a "
                             "glob that names one kind")
        if dtype is None:
            raise ValueError(f"Dataset {name!r}: flat token files need dtype= (e.g. 'uint16' or 'uint32'): nothing in "
                             "them says how wide a token is")
        tokens = token_dtype(dtype, f"Dataset {name!r}")
        if (eos_id is None) == (doc_lengths is None):
            raise ValueError(f"Dataset {name!r}: flat token files need exactly one of eos_id= (documents end after "
                             "each EOS token) or doc_lengths= (tokens per document)")
        if eos_id is not None and (type(eos_id) is not int or not 0 <= eos_id <= np.iinfo(tokens).max):
            raise ValueError(f"Dataset {name!r}: eos_id={eos_id!r} must be an int in 0 .. {np.iinfo(tokens).max} "
                             f"(a {tokens.name} token)")
        policy = _policy(name, retry, location, files)
        catalog = policy.call(lambda: _flat.build(name, location, files, tokens, eos_id, doc_lengths),
                              what="scan", dataset=name, shard=None, uri=location.uri)
        return cls._read_through(name, catalog, _flat.reader(catalog, name, policy, ShardCache(cache_shards, cache_bytes),
                                                              tokens))

    @classmethod
    def _from_datatrove(cls, name: str, location: Location, files: list[str], dtype: Any, eos_id: Any,
                        doc_lengths: Any, **options: Any) -> Dataset:
        if eos_id is not None or doc_lengths is not None:
            raise ValueError(f"Dataset {name!r}: datatrove files take their document ends from their .ds.index; drop "
                             "eos_id= and doc_lengths=")
        dataset = cls._from_catalog(name, location.uri, "datatrove", check_schema=True, files=files, **options)
        found = dataset._reader.dtype(0) if isinstance(dataset._reader, TokenReader) and files else None
        if dtype is not None and found is not None and token_dtype(dtype, f"Dataset {name!r}") != found:
            raise ValueError(f"Dataset {name!r}: dtype={dtype!r}, but the files' sizes say their tokens are "
                             f"{found.name}; drop dtype= or check the files")
        return dataset

    # -- the shard table ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    def ids(self) -> np.ndarray:
        """Shard ids, ascending (read-only int64)."""
        return self._ids

    def counts(self) -> np.ndarray:
        """Rows per shard, aligned with ``ids()`` (read-only int64)."""
        return self._counts

    def raw_bytes(self) -> np.ndarray:
        """Bytes on disk per shard, aligned with ``ids()`` (read-only int64; zeros when unknown)."""
        return self._raw_bytes

    def exact_tokens_per_byte(self) -> float | None:
        """Tokens per byte of ``raw_bytes()`` for token files (``from_megatron``, ``from_token_files``):
        one over the token's size, so every shard's token count is exact; None for other datasets."""
        return self._reader.tokens_per_byte() if isinstance(self._reader, TokenReader) else None

    def tokens(self) -> np.ndarray | None:
        """Tokens per shard of token files, aligned with ``ids()`` (exact, from their indexes); None otherwise."""
        ratio = self.exact_tokens_per_byte()
        return None if ratio is None else self._raw_bytes // round(1 / ratio)

    def total(self) -> int:
        return self._total

    def max_count(self) -> int:
        return int(self._counts.max()) if len(self._counts) else 0

    def shard_count(self) -> int:
        return len(self._ids)

    def __len__(self) -> int:
        return self.total()

    @property
    def has_records(self) -> bool:
        """Whether ``read`` can return records (False for count-only datasets)."""
        return self._reader is not None or self._shards is not None

    def fingerprint(self) -> str | None:
        """A short stable id of the data's content (path datasets; see :mod:`zephon.io.catalog`), else None."""
        return None if self._catalog is None else self._catalog.fingerprint

    @property
    def catalog(self) -> _catalog.Catalog | None:
        """The shard catalog of a path dataset (None otherwise)."""
        return self._catalog

    def columns(self) -> tuple[str, ...] | None:
        """Column names of a path dataset (JSONL: the first record's keys); None if unknown."""
        schema = None if self._catalog is None else self._catalog.schema()
        return None if schema is None else tuple(c for c, _ in schema)

    def path(self, shard_id: int) -> str | None:
        """The file (path or URI) of shard ``shard_id`` (path datasets), else None."""
        k = self._shard_index(shard_id)
        return None if self._reader is None else self._reader.uri(k)

    @property
    def reader(self) -> ShardReader[Any] | None:
        """The shard reader of a path dataset (None otherwise): what the readahead plans pieces with."""
        return self._reader

    # -- reading --------------------------------------------------------------------------

    def read(self, shard_id: int, offsets: Sequence[int] | np.ndarray, columns: Sequence[str] | None = None) -> list[Any]:
        """The records at ``offsets`` of shard ``shard_id``, in the order asked.

        Path datasets return dicts (only ``columns`` if given) and read only the row groups /
        lines the offsets need. Raises ``IndexError`` for an unknown shard or an offset out of
        range, ``ValueError`` for an unknown column or bad data (naming the file).
        """
        k, rows, columns = self._prepare(shard_id, offsets, columns)
        if self._reader is not None:
            return self._reader.read(k, rows, columns)
        assert self._shards is not None  # _prepare refused a count-only dataset
        shard = self._shards[k]
        records = [shard[offset] for offset in rows.tolist()]
        return records if columns is None else [self._project(r, columns) for r in records]

    def read_table(self, shard_id: int, offsets: Sequence[int] | np.ndarray, columns: Sequence[str] | None = None) -> pa.Table:
        """Like :meth:`read`, as an Arrow table (rows in the order asked). Records (JSONL, in
        memory) give a column per field any of them has, in order of first appearance, null in
        the rows of records that lack it."""
        return self._table(shard_id, offsets, columns, False)

    def _table(self, shard_id: int, offsets: Any, columns: Any, exact: bool) -> pa.Table:
        """:meth:`read_table`; ``exact``: as :meth:`gather` says."""
        k, rows, columns = self._prepare(shard_id, offsets, columns)
        if self._reader is not None:
            return self._reader.read_table(k, rows, columns, exact)
        records = self.read(shard_id, rows, columns)
        if not all(isinstance(r, dict) for r in records):
            raise TypeError(f"Dataset {self._name!r}: read_table needs dict records, this dataset holds "
                            f"{type(records[0]).__name__}")
        return records_table(f"Dataset {self._name!r}, shard {shard_id}", records, exact)

    def gather(self, shard_id: int, offsets: Sequence[int] | np.ndarray, columns: Sequence[str] | None = None,
               *, exact: bool = False) -> tuple[list[pa.Table], np.ndarray]:
        """The tables that hold rows ``offsets`` of shard ``shard_id`` and each offset's row in
        their concatenation: ``read_table(shard_id, offsets, columns)`` equals
        ``pa.concat_tables(tables).take(rows)``. A Parquet or Arrow dataset hands out its
        decoded row groups (record batches) uncopied, so a reader of many shards gathers all its
        rows at once; any other dataset gives its ``read_table`` as the one table. ``exact``
        (default False): raise ``zephon.io.UnevenRecordsError`` where that table's rows are not
        the records themselves (JSONL records whose fields, or a field's value types, differ)."""
        if self._reader is None or not self._reader.columnar:
            table = self._table(shard_id, offsets, columns, exact)
            return [table], np.arange(table.num_rows, dtype=np.int64)
        k, rows, names = self._prepare(shard_id, offsets, columns)
        if not len(rows):
            return [self._reader.empty(k, names)], rows
        return self._reader.gather(k, rows, names)

    def _shard_index(self, shard_id: Any) -> int:
        k = int(np.searchsorted(self._ids, shard_id))
        if k == len(self._ids) or self._ids[k] != shard_id:
            span = f"ids {int(self._ids[0])}..{int(self._ids[-1])}" if len(self._ids) else "no shards"
            raise IndexError(f"Dataset {self._name!r} has no shard {shard_id} ({span})")
        return k

    def _prepare(self, shard_id: Any, offsets: Any, columns: Any) -> tuple[int, np.ndarray, tuple[str, ...] | None]:
        if self._shards is None and self._reader is None:
            raise TypeError(f"Dataset {self._name!r} is count-only (from_counts): it has no records to read")
        k = self._shard_index(shard_id)
        rows = np.asarray(offsets)
        if rows.size == 0:
            rows = np.zeros(0, dtype=np.int64)
        elif rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise TypeError(f"Dataset {self._name!r}: offsets must be a 1-D sequence of ints, got {_show(offsets)}")
        rows = rows.astype(np.int64, copy=False)
        count = int(self._counts[k])
        bad = (rows < 0) | (rows >= count)
        if bad.any():
            where = f" ({self.path(shard_id)})" if self._catalog is not None else ""
            raise IndexError(f"Dataset {self._name!r}, shard {shard_id}{where}: offset {int(rows[bad][0])} is out of "
                             f"range [0, {count})")
        columns = _columns_arg(self._name, columns)
        if columns is not None and self._reader is not None and self._reader.columnar:
            known = self.columns() or ()
            for column in columns:
                if column not in known:
                    raise ValueError(f"Dataset {self._name!r}: no column {column!r} in {self.path(int(self._ids[0]))} "
                                     f"(columns: {', '.join(known)})")
        return k, rows, columns

    def _project(self, record: Any, columns: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(record, dict):
            raise TypeError(f"Dataset {self._name!r}: columns= needs dict records, got {type(record).__name__}")
        missing = [c for c in columns if c not in record]
        if missing:
            raise ValueError(f"Dataset {self._name!r}: no column {missing[0]!r} in record {_show(record)}")
        return {c: record[c] for c in columns}

    # -- the fetch cache --------------------------------------------------------------------

    def configure_cache(self, max_shards: int = 1, max_bytes: int | None = None) -> None:
        """Set the bounds of a path dataset's fetch cache (no-op for other datasets).

        ``max_shards``: decoded shards kept, least recently used evicted first (1 suits
        sequential and within-shard shuffled reads; under block shuffle pass
        :func:`zephon.io.block_span` ``(counts, block_size)``). ``max_bytes``: a ceiling on the
        decoded bytes held (``None``: none). Memory is then at most ``max_shards`` x the largest
        decoded shard, and at most ``max_bytes``. See :mod:`zephon.io._cache` for the policy.
        """
        if self._reader is not None:
            self._reader.cache.resize(max_shards, max_bytes)

    def cache_for_lanes(self, lanes: int, max_bytes: int | None) -> Callable[[], None]:
        """Size a path dataset's fetch cache for a reader of ``lanes`` lanes while it runs:
        ``max_shards`` per lane, within ``max_bytes`` decoded bytes too. Returns the call that
        ends it (a no-op for other datasets)."""
        if self._reader is None:
            return _nothing
        return self._reader.cache.follow(lanes, max_bytes)

    def share_pieces(self, store: SharedPieces) -> Callable[[], None]:
        """Let a path dataset whose pieces are decoded (Parquet row groups) take them from
        ``store``, which other processes fill too (a DataLoader's workers). Returns the call
        that ends it (a no-op for other datasets)."""
        reader = self._reader
        if reader is None:
            return _nothing
        reader.share(store)
        return functools.partial(reader.share, None)

    def cache_info(self) -> CacheInfo | None:
        """Bounds, size, peak bytes, hits and misses of the fetch cache; None without one."""
        return None if self._reader is None else self._reader.cache.info()

    def clear_cache(self) -> None:
        """Drop everything the fetch cache holds and reset its counters."""
        if self._reader is not None:
            self._reader.cache.clear()

    def __repr__(self) -> str:
        where = f", path={self._catalog.directory!r}" if self._catalog is not None else ""
        return f"Dataset({self._name!r}, shards={self.shard_count()}, total={self.total()}{where})"
