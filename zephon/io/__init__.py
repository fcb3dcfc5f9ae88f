"""Datasets and reading.

| use | for |
|---|---|
| :class:`Dataset` | a named, sharded dataset: its shard table and its records |
| ``Dataset.from_path(name, dir)`` | a directory of Parquet / JSONL shards, cataloged once (:mod:`zephon.io.catalog`) |
| :func:`fetch` | pointers ``(dataset_id, shard_id, offset)`` → records, in pointer order |
| :func:`fetch_table` | the same as one Arrow table (the columnar form) |
| :func:`block_span` | how many shards a fetch cache must hold under block shuffle |
| :func:`write_atomically` | replace a file atomically and durably (:class:`AtomicWriteError` if it cannot) |
"""
from zephon.io._fetch import block_span, fetch, fetch_table
from zephon.io.atomic import AtomicWriteError, write_atomically
from zephon.io.dataset import Dataset

__all__ = ["AtomicWriteError", "Dataset", "block_span", "fetch", "fetch_table", "write_atomically"]
