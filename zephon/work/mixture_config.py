"""A mixture as a file: the plain-data form of a ``StaticMixtureWorkSource``.

A config is a dict of plain values (what TOML and JSON hold), for example::

    chunk_size = 16384
    seed = 7
    shuffle_within_shard = true
    shuffle_block_size = "auto"
    stop_after_passes = 2

    [mixture]                  # weights, in the order they are summed
    web = 0.7
    code = 0.3

    [[datasets]]
    name = "web"
    path = "data/web"          # a directory of Parquet / JSONL shards (relative to the file)

    [[datasets]]
    name = "code"
    shards = 500               # count-only: 500 shards of 20,000 rows
    rows_per_shard = 20000
    exhausted_policy = "repeat" # a per-dataset setting overrides the top-level one

Top-level keys are the constructor's settings (:data:`SETTINGS`); a key left out takes the
constructor's default. A dataset is named by ``path`` (and optionally ``format``), by
``counts`` (a list of rows per shard, with optional ``shard_ids`` and ``raw_bytes``) or by
``shards`` and ``rows_per_shard`` (with the same options as ``counts``; :data:`DATA_KEYS`), and
a key that goes with another of these raises; it may override ``exhausted_policy``, ``max_repeats``,
``reshuffle_on_repeat`` and ``pass_tail``. ``token_estimation`` is a table of :class:`TokenEstimation` fields
(a tokenizer is passed to ``from_config`` instead: code is never read from a config).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import fields
from typing import Any, Callable, Mapping

import numpy as np

from zephon.core.alloc import BUILT_IN
from zephon.io import Dataset, open_regular
from zephon.limits import MAX_SHARDS, show
from zephon.work.tokens import TokenEstimation

SETTINGS = (
    "chunk_size", "seed", "shuffle_shards", "shuffle_within_shard", "shuffle_block_size", "exhausted_policy",
    "reshuffle_on_repeat", "max_repeats", "stop_after_passes", "lane_assignment", "allocation", "pass_tail",
)
PER_DATASET = ("exhausted_policy", "max_repeats", "reshuffle_on_repeat", "pass_tail")
KEY_DATASETS, KEY_MIXTURE, KEY_TOKENS = "datasets", "mixture", "token_estimation"
TOP_KEYS = (KEY_DATASETS, KEY_MIXTURE, KEY_TOKENS, *SETTINGS)
SOURCE_KEYS = ("path", "format", "counts", "shard_ids", "raw_bytes", "shards", "rows_per_shard")
DATA_KEYS = {  # how an entry names its data -> the other source keys that go with it
    "path": ("format",), "counts": ("shard_ids", "raw_bytes"), "shards": ("rows_per_shard", "shard_ids", "raw_bytes"),
}
DATASET_KEYS = ("name", *SOURCE_KEYS, *PER_DATASET)
TOKEN_KEYS = tuple(f.name for f in fields(TokenEstimation) if f.name not in ("tokenizer", "measure"))


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``.toml`` or ``.json`` mixture config; relative dataset paths resolve against its folder."""
    path = os.fspath(path)
    if not path.endswith((".toml", ".json")):
        raise ValueError(f"mixture config {path!r} must end in .toml or .json")
    toml = _toml()
    with open_regular(path, "mixture config") as f:
        try:
            config = toml.load(f) if path.endswith(".toml") else json.load(f)
        except (ValueError, toml.TOMLDecodeError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ValueError(f"mixture config {path!r} does not parse as {path[-4:].upper()}: {error}") from None
        except RecursionError:
            raise ValueError(f"mixture config {path!r} nests its values too deeply to parse") from None
    if not isinstance(config, dict):
        raise ValueError(f"mixture config {path!r} must hold a table/object at the top, got {type(config).__name__}")
    base = os.path.dirname(os.path.abspath(path))
    for entry in config.get(KEY_DATASETS) or ():
        if isinstance(entry, dict) and isinstance(entry.get("path"), str) and not _is_absolute(entry["path"]):
            entry["path"] = os.path.join(base, entry["path"])
    return config


def _toml() -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    import tomli  # the conditional dependency on Python 3.10
    return tomli


def _is_absolute(path: str) -> bool:
    return os.path.isabs(path) or "://" in path


def _check_keys(where: str, mapping: Any, known: tuple[str, ...]) -> None:
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{where} must be a table (mapping), got {mapping!r}")
    unknown = [k for k in mapping if k not in known]
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown}; known: {list(known)}")


def _dataset(entry: Any, k: int) -> Dataset:
    _check_keys(f"datasets[{k}]", entry, DATASET_KEYS)
    name = entry.get("name")
    kinds = [kind for kind in ("path", "counts", "shards") if kind in entry]
    if len(kinds) != 1:
        raise ValueError(f"datasets[{k}] ({name!r}) must name its data by exactly one of path, counts or "
                         f"shards + rows_per_shard, got {kinds or 'none'}")
    _check_data_keys(entry, k, kinds[0])
    if "path" in entry:
        return Dataset.from_path(name, entry["path"], entry.get("format"))
    if "counts" in entry:
        return Dataset.from_counts(name, entry["counts"], entry.get("shard_ids"), entry.get("raw_bytes"))
    shards, rows = entry["shards"], entry.get("rows_per_shard")
    if type(shards) is not int or type(rows) is not int or shards < 0 or rows < 0:
        raise ValueError(f"datasets[{k}] ({name!r}): shards and rows_per_shard must be ints >= 0, "
                         f"got {show(shards)} and {show(rows)}")
    if shards > MAX_SHARDS:
        raise ValueError(f"datasets[{k}] ({name!r}): shards = {shards} is more than the {MAX_SHARDS} (2**26) one "
                         "dataset may have (zephon.limits.MAX_SHARDS); lower it")
    return Dataset.from_counts(name, [rows] * shards, entry.get("shard_ids"), entry.get("raw_bytes"))


def _check_data_keys(entry: Mapping[str, Any], k: int, kind: str) -> None:
    """Refuse source keys that do not go with how the entry names its data (``kind``), which
    would otherwise be silently ignored, and a ``counts`` that is not a list (null, a number)."""
    name = entry.get("name")
    for key in SOURCE_KEYS:
        if key in entry and key != kind and key not in DATA_KEYS[kind]:
            owners = " or ".join(owner for owner, keys in DATA_KEYS.items() if key in keys)
            raise ValueError(f"datasets[{k}] ({name!r}): {key!r} goes with a dataset named by {owners}, not by "
                             f"{kind} (which takes {', '.join(DATA_KEYS[kind])}); drop it")
    if kind == "counts" and not hasattr(entry["counts"], "__len__"):
        raise TypeError(f"datasets[{k}] ({name!r}): counts must be a list of rows per shard, e.g. [1000, 2000], "
                        f"got {show(entry['counts'])}")


def _per_dataset(key: str, config: Mapping[str, Any], entries: list[Mapping[str, Any]]) -> Any:
    """The top-level value, or a mapping name → value when some dataset sets its own."""
    if not any(key in e for e in entries):
        return config.get(key)
    given = {e["name"]: e[key] for e in entries if key in e}
    if key in config and config[key] is not None:
        given = {e["name"]: given.get(e["name"], config[key]) for e in entries}
    return given


def source_arguments(config: Mapping[str, Any], *, tokenizer: Any = None,
                     measure: Callable[[Any], float] | None = None) -> dict[str, Any]:
    """The constructor's keyword arguments described by ``config`` (datasets built, nothing read)."""
    _check_keys("mixture config", config, TOP_KEYS)
    entries = config.get(KEY_DATASETS)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"mixture config needs a non-empty list 'datasets', got {entries!r}")
    datasets = [_dataset(entry, k) for k, entry in enumerate(entries)]
    if not isinstance(config.get(KEY_MIXTURE), Mapping):
        raise ValueError(f"mixture config needs a 'mixture' table of weights (name -> weight), e.g. "
                         f"{{web = 0.7, code = 0.3}}, got {show(config.get(KEY_MIXTURE))}")
    arguments: dict[str, Any] = {KEY_DATASETS: datasets, KEY_MIXTURE: dict(config[KEY_MIXTURE])}
    for key in SETTINGS:
        value = _per_dataset(key, config, entries) if key in PER_DATASET else config.get(key)
        if value is not None:
            arguments[key] = value
    tokens = config.get(KEY_TOKENS)
    if tokens is not None:
        _check_keys(KEY_TOKENS, tokens, TOKEN_KEYS)
        arguments[KEY_TOKENS] = TokenEstimation(**tokens, tokenizer=tokenizer, measure=measure)
    return arguments


def _data(dataset: Dataset) -> dict[str, Any]:
    """How a config names a dataset's data: its path, or its shard table."""
    if dataset.catalog is not None:
        return {"path": dataset.catalog.directory, "format": dataset.catalog.fmt}
    if dataset.has_records:
        raise ValueError(f"dataset {dataset.name!r} holds in-memory records (from_records), which a config cannot "
                         "name; write them to Parquet/JSONL files and use Dataset.from_path")
    counts, ids, sizes = dataset.counts(), dataset.ids(), dataset.raw_bytes()
    entry: dict[str, Any]
    if len(counts) and (counts == counts[0]).all():
        entry = {"shards": len(counts), "rows_per_shard": int(counts[0])}
    else:
        entry = {"counts": counts.tolist()}
    if (ids != np.arange(len(ids))).any():
        entry["shard_ids"] = ids.tolist()
    if sizes.any():
        entry["raw_bytes"] = sizes.tolist()
    return entry


def _uniform(values: list[Any]) -> bool:
    return all(v == values[0] for v in values)


def _token_table(estimation: TokenEstimation, config: Any) -> dict[str, Any]:
    table = {k: getattr(estimation, k) for k in TOKEN_KEYS}
    if isinstance(table["primer"], Mapping):
        table["primer"] = dict(table["primer"])
    if config.primed and estimation.can_measure():
        table["primer"] = {d.name: d.token_ratio for d in config.datasets}  # measured: no tokenizer needed
    return table


def config_of(config: Any, datasets: tuple[Dataset, ...], shuffle_block_size: Any,
              estimation: TokenEstimation | None) -> dict[str, Any]:
    """The config dict of a source's resolved ``config`` (``SourceConfig``) and its datasets."""
    name = config.allocator.name
    if BUILT_IN.get(name) is not config.allocator:
        raise ValueError(f"allocation={config.allocator!r} is a custom allocator, which a config cannot hold; "
                         "build this source in code")
    plans = config.datasets
    out: dict[str, Any] = {
        "chunk_size": config.chunk_size, "seed": config.seed, "shuffle_shards": config.shuffle_shards,
        "shuffle_within_shard": config.shuffle_within_shard, "lane_assignment": config.lane_assignment,
        "allocation": name,
    }
    if shuffle_block_size is not None:
        out["shuffle_block_size"] = shuffle_block_size
    if config.stop_after_passes is not None:
        out["stop_after_passes"] = config.stop_after_passes
    entries = [{"name": d.name, **_data(dataset)} for d, dataset in zip(plans, datasets)]
    for key, values in (("exhausted_policy", [d.policy for d in plans]),
                        ("max_repeats", [d.max_repeats for d in plans]),
                        ("reshuffle_on_repeat", [d.reshuffle_on_repeat for d in plans]),
                        ("pass_tail", [d.pass_tail for d in plans])):
        if _uniform(values):
            if values[0] is not None:
                out[key] = values[0]
            continue
        for entry, value in zip(entries, values):
            if value is not None:
                entry[key] = value
    out[KEY_MIXTURE] = {plans[c].name: plans[c].weight for c in config.summing_order}
    out[KEY_DATASETS] = entries
    if estimation is not None:
        out[KEY_TOKENS] = _token_table(estimation, config)
    return out
