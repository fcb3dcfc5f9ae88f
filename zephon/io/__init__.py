"""Datasets and reading.

| use | for |
|---|---|
| :class:`Dataset` | a named, sharded dataset: its shard table and its records |
| ``Dataset.from_path(name, uri)`` | a directory of Parquet / JSONL / Arrow shards, local or in object storage, cataloged once (:mod:`zephon.io.catalog`) |
| ``Dataset.from_hf(name, dataset_or_path)`` | a Hugging Face ``datasets`` dataset (its Arrow files) |
| :func:`build_catalog` | publish a catalog next to the data (``zephon catalog build URI``) |
| :class:`RetryPolicy` | retries and timeouts of storage reads (:mod:`zephon.io.retry`) |
| :func:`fetch` | pointers ``(dataset_id, shard_id, offset)`` → records, in pointer order |
| :func:`fetch_table` | the same as one Arrow table (the columnar form) |
| :func:`fetch_rows` | the decoded row groups those rows are in, uncopied, and each pointer's row there |
| :class:`UnevenRecordsError` | ``fetch_rows(exact=True)``: records one table cannot hold as they are |
| :func:`take_rows` | rows of a table or column of many row groups, taken from each row group on its own |
| :func:`gather_columns`, :func:`take_records` | the same rows column by column (strings as bytes), or as dicts |
| :func:`block_span` | how many shards a fetch cache must hold under block shuffle |
| :class:`Readahead` | a reader's bounded background loading of the records its lanes need next |
| :class:`PieceStore` | decoded row groups shared by the processes that read one stream (``zephon.torch.DataLoader``'s workers) |
| :class:`CacheInfo`, :class:`ReadaheadStats` | the figures of ``Dataset.cache_info()`` and ``Readahead.stats()`` (dicts) |
| :func:`write_atomically` | replace a file atomically and durably (:class:`AtomicWriteError` if it cannot) |
| :func:`open_regular` | open a local file read whole (a config, a checkpoint), refusing a directory, FIFO or device |
| :class:`Store` | a directory of whole files, local or in object storage (a checkpoint directory) |
"""
from zephon.io._cache import CacheInfo
from zephon.io._fetch import block_span, fetch, fetch_rows, fetch_table
from zephon.io._readahead import Readahead, ReadaheadStats
from zephon.io._shards import UnevenRecordsError
from zephon.io._shared import PieceStore
from zephon.io._store import Store
from zephon.io._take import gather_columns, take_records, take_rows
from zephon.io.atomic import AtomicWriteError, write_atomically
from zephon.io.catalog import build_catalog
from zephon.io.dataset import Dataset
from zephon.io.local import open_regular
from zephon.io.retry import RetryPolicy, ShardChangedError, StorageError, StorageTimeoutError

__all__ = ["AtomicWriteError", "CacheInfo", "Dataset", "PieceStore", "Readahead", "ReadaheadStats", "RetryPolicy", "ShardChangedError",
           "Store", "StorageError", "StorageTimeoutError", "UnevenRecordsError", "block_span", "build_catalog", "fetch", "fetch_rows", "fetch_table",
           "gather_columns", "open_regular", "take_records", "take_rows", "write_atomically"]
