"""Datasets and reading.

| use | for |
|---|---|
| :class:`Dataset` | a named, sharded dataset: its shard table and its records |
"""
from zephon.io.dataset import Dataset

__all__ = ["Dataset"]
