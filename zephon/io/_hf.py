"""Hugging Face ``datasets``: the Arrow files behind a dataset, in its own row order.

A ``save_to_disk`` directory lists its Arrow files in ``state.json`` (``_data_files``); a loaded
``datasets.Dataset`` names them in ``cache_files``. Both become one shard per file, in that
order. Nothing here imports ``datasets``: a loaded dataset is recognised by its attributes.

A loaded dataset may show less than its files hold: ``select`` and ``shuffle`` leave an
indices mapping, ``shard(contiguous=True)`` and split slices (``split="train[:10]"``) a slice
of the files' rows, ``rename_column``, ``remove_columns`` and ``select_columns`` other columns.
Those are refused (:func:`check_view`): zephon reads whole files, so it would read other rows.
"""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

from zephon.io._fs import locate

STATE, DICT = "state.json", "dataset_dict.json"
_EXPECTED = ("a datasets.Dataset loaded from Arrow files, or the directory datasets.Dataset.save_to_disk wrote "
             "(with state.json and data-*.arrow files)")


def _is_loaded(thing: Any) -> bool:
    return type(thing).__module__.split(".")[0] == "datasets" and hasattr(thing, "cache_files")


def hf_files(name: str, dataset_or_path: Any, filesystem: Any) -> tuple[str, list[str], Any]:
    """``(directory URI, Arrow file names in row order, filesystem)`` of a dataset or a saved directory."""
    if _is_loaded(dataset_or_path):
        return _loaded(name, dataset_or_path)
    if not isinstance(dataset_or_path, (str, os.PathLike)):
        raise TypeError(f"Dataset {name!r}: from_hf needs {_EXPECTED}, got {type(dataset_or_path).__name__}")
    source = locate(dataset_or_path, filesystem, name=name)
    try:
        state = json.loads(source.read_bytes(STATE))
        files = [entry["filename"] for entry in state["_data_files"]]
    except FileNotFoundError:
        raise ValueError(_not_saved(name, source)) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"Dataset {name!r}: {source.uri_of(STATE)} is not a datasets state file ({error}); "
                         f"from_hf needs {_EXPECTED}") from error
    if not files or not all(isinstance(f, str) and f.endswith(".arrow") for f in files):
        raise ValueError(f"Dataset {name!r}: {source.uri_of(STATE)} lists no Arrow files ({files!r}); "
                         f"from_hf needs {_EXPECTED}")
    return source.uri, files, filesystem


def check_view(name: str, dataset_or_path: Any, rows: int, schema: Sequence[tuple[str, str]] | None) -> None:
    """Raise ``ValueError`` when a loaded dataset shows other rows or columns than its Arrow
    files hold (``rows`` in all, columns ``schema``: the catalog's): a slice, or columns renamed
    or removed in memory. A saved directory is its files, so it always passes."""
    if not _is_loaded(dataset_or_path):
        return
    table = dataset_or_path.data
    shown = tuple((field.name, str(field.type)) for field in table.schema)
    fix = ("call dataset.flatten_indices(), which writes what it shows to a new Arrow file, and pass that, or "
           "save_to_disk(path) and pass the path")
    if table.num_rows != rows:
        raise ValueError(f"Dataset {name!r}: this datasets.Dataset shows {table.num_rows} of the {rows} rows of its "
                         "Arrow files (a slice: from select of a range, shard(contiguous=True), a split like "
                         f"'train[:10]', ...), and zephon reads whole files; {fix}")
    if shown != tuple(schema or ()):
        raise ValueError(f"Dataset {name!r}: this datasets.Dataset shows the columns {_columns(shown)} but its Arrow "
                         f"files hold {_columns(schema or ())} (from rename_column, remove_columns, select_columns, "
                         f"...), and zephon reads the files; {fix}")


def _columns(schema: Sequence[tuple[str, str]]) -> str:
    return "(" + ", ".join(f"{column}: {kind}" for column, kind in schema) + ")"


def _not_saved(name: str, source: Any) -> str:
    try:
        splits = list(json.loads(source.read_bytes(DICT)).get("splits", []))
    except (OSError, ValueError, AttributeError):
        splits = None
    if splits:
        return (f"Dataset {name!r}: {source.uri} holds a DatasetDict (splits {', '.join(splits)}); pass one "
                f"split's directory, e.g. {source.uri_of(splits[0])}")
    return f"Dataset {name!r}: {source.uri} has no {STATE}; from_hf needs {_EXPECTED}"


def _loaded(name: str, dataset: Any) -> tuple[str, list[str], Any]:
    if getattr(dataset, "_indices", None) is not None:
        raise ValueError(f"Dataset {name!r}: this datasets.Dataset has an indices mapping (from select, shuffle, "
                         "filter, ...), so its rows are not its Arrow files' rows; call dataset.flatten_indices() "
                         "or save_to_disk() first")
    paths = [entry["filename"] for entry in dataset.cache_files]
    if not paths:
        raise ValueError(f"Dataset {name!r}: this datasets.Dataset lives in memory (no Arrow files); call "
                         "save_to_disk(path) and pass the path")
    folders = {os.path.dirname(os.path.abspath(p)) for p in paths}
    if len(folders) != 1:
        raise ValueError(f"Dataset {name!r}: this datasets.Dataset spans Arrow files in {len(folders)} directories "
                         f"({', '.join(sorted(folders))}); save_to_disk(path) and pass the path")
    return folders.pop(), [os.path.basename(p) for p in paths], None
