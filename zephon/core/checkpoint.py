"""JSON checkpoints of a mixture source: tagged, versioned, keyed by dataset name.

A checkpoint holds the lane binding, a fingerprint of the config and the state (a few
numbers per dataset), so its size never grows with training (about a kilobyte for a few
datasets) and it restores in O(1). ``state_from_json`` validates everything before anything
is built; nothing is ever unpickled.
"""
from __future__ import annotations

import math
from typing import Any

from zephon.core.config import REPEAT, SourceConfig
from zephon.core.schedule import CursorState, SourceState
from zephon.core.tokens import deficit_bound

KIND = "zephon.StaticMixtureWorkSource"
VERSION = 2  # 2: token deficits are exact ints (token streams changed); sample-mode state as in 1
KEY_KIND, KEY_VERSION, KEY_LANE, KEY_REPLICAS = "kind", "version", "lane", "canonical_replicas"
KEY_FINGERPRINT, KEY_STATE = "fingerprint", "state"
KEY_CHUNK, KEY_ALLOC, KEY_CURSORS, KEY_EPOCH, KEY_POSITION = "chunk_index", "alloc", "cursors", "epoch", "position"
KEY_RATIOS, KEY_RATIO, KEY_ORIGIN = "token_ratios", "ratio", "origin"
ORIGINS = ("measured", "pinned", "fallback")


def state_to_json(state: SourceState, config: SourceConfig) -> dict[str, Any]:
    """The checkpoint of ``state`` under ``config``: plain JSON types only."""
    alloc = state.alloc
    checkpoint = {
        KEY_KIND: KIND,
        KEY_VERSION: VERSION,
        KEY_LANE: config.lane,
        KEY_REPLICAS: config.canonical_replicas,
        KEY_FINGERPRINT: config.fingerprint(),
        KEY_STATE: {
            KEY_CHUNK: state.chunk_index,
            KEY_ALLOC: list(alloc) if isinstance(alloc, tuple) else alloc,
            KEY_CURSORS: {
                d.name: {KEY_EPOCH: c.epoch, KEY_POSITION: c.position} for d, c in zip(config.datasets, state.cursors)
            },
        },
    }
    if config.token_mode and config.primed:
        checkpoint[KEY_RATIOS] = {d.name: {KEY_RATIO: d.token_ratio, KEY_ORIGIN: d.ratio_origin} for d in config.datasets}
    return checkpoint


def ratios_from_json(checkpoint: dict[str, Any], config: SourceConfig) -> dict[str, tuple[float, str]]:
    """The tokens-per-byte ratios a token-mode checkpoint carries, validated ({} in sample mode)."""
    if not config.token_mode:
        return {}
    ratios = checkpoint.get(KEY_RATIOS)
    if not isinstance(ratios, dict) or set(ratios) != set(config.names):
        raise ValueError(f"token-mode checkpoint must carry token_ratios for {list(config.names)}, got {ratios!r}")
    out = {}
    for name, entry in ratios.items():
        ratio = entry.get(KEY_RATIO) if isinstance(entry, dict) else None
        if type(ratio) is not float or not (math.isfinite(ratio) and ratio > 0) or entry.get(KEY_ORIGIN) not in ORIGINS:
            raise ValueError(f"checkpoint token ratio of {name!r} is malformed: {entry!r}; the checkpoint is corrupted")
        out[name] = (ratio, entry[KEY_ORIGIN])
    return out


def check_header(checkpoint: Any) -> None:
    """Refuse anything that is not a zephon mixture checkpoint of a known version."""
    if not isinstance(checkpoint, dict):
        raise ValueError(f"checkpoint must be a dict (from state_dict()), got {type(checkpoint).__name__}")
    if checkpoint.get(KEY_KIND) != KIND:
        raise ValueError(f"checkpoint kind is {checkpoint.get(KEY_KIND)!r}, expected {KIND!r}; pass a state_dict() of this source type")
    if checkpoint.get(KEY_VERSION) != VERSION:
        raise ValueError(
            f"checkpoint version {checkpoint.get(KEY_VERSION)!r} is not supported (this zephon reads version "
            f"{VERSION}); restore it with the zephon version that wrote it"
        )
    missing = [k for k in (KEY_LANE, KEY_REPLICAS, KEY_FINGERPRINT, KEY_STATE) if k not in checkpoint]
    if missing:
        raise ValueError(f"checkpoint is missing {missing}; it is truncated or was not written by state_dict()")


def fingerprint_differences(saved: Any, config: SourceConfig) -> list[str]:
    """What differs between a checkpoint's fingerprint and ``config`` (empty if they match)."""
    current = config.fingerprint()
    if not isinstance(saved, dict):
        return [f"fingerprint is {type(saved).__name__}, not a dict"]
    return [
        f"{key}: checkpoint has {saved.get(key)!r}, this source has {current[key]!r}"
        for key in current
        if saved.get(key) != current[key]
    ]


def state_from_json(checkpoint: dict[str, Any], config: SourceConfig) -> SourceState:
    """Validate a checkpoint's state against ``config`` and build it; raise ``ValueError`` if bad."""
    differences = fingerprint_differences(checkpoint[KEY_FINGERPRINT], config)
    if differences:
        raise ValueError(
            "checkpoint was taken with a different configuration: " + "; ".join(differences)
            + ". Restore it into a source built with the same datasets and settings"
        )
    body = checkpoint[KEY_STATE]
    if not isinstance(body, dict) or set(body) != {KEY_CHUNK, KEY_ALLOC, KEY_CURSORS}:
        raise ValueError(f"checkpoint state must have exactly {[KEY_CHUNK, KEY_ALLOC, KEY_CURSORS]}; it is corrupted")
    return SourceState(
        chunk_index=_count(KEY_CHUNK, body[KEY_CHUNK]),
        alloc=_alloc_from_json(body[KEY_ALLOC], config),
        cursors=_cursors_from_json(body[KEY_CURSORS], config),
    )


def _count(what: str, value: Any, upper: int | None = None) -> int:
    if type(value) is not int or value < 0 or (upper is not None and value > upper):
        bound = "" if upper is None else f" and <= {upper}"
        raise ValueError(f"checkpoint {what} must be an int >= 0{bound}, got {value!r}; the checkpoint is corrupted")
    return value


def _alloc_from_json(value: Any, config: SourceConfig) -> Any:
    if config.token_mode:
        bound = deficit_bound(len(config.datasets))
        if (not isinstance(value, list) or len(value) != len(config.datasets)
                or not all(type(v) is int and abs(v) <= bound for v in value) or sum(value) != 0):
            raise ValueError(f"checkpoint alloc must be {len(config.datasets)} token deficits, ints in "
                             f"[-{bound}, {bound}] summing to 0, got {value!r}; the checkpoint is corrupted")
        return tuple(value)
    name = config.allocator.name
    if name == "accumulator":
        if (not isinstance(value, list) or len(value) != len(config.datasets)
                or not all(type(v) is float and abs(v) <= 1.0 for v in value)):
            raise ValueError(f"checkpoint alloc must be {len(config.datasets)} accumulators, floats in [-1, 1], "
                             f"got {value!r}; the checkpoint is corrupted")
        return tuple(value)
    if name == "fixed":
        if value != []:
            raise ValueError(f"checkpoint alloc must be [] for the fixed allocator, got {value!r}")
        return ()
    return value


def _cursors_from_json(value: Any, config: SourceConfig) -> tuple[CursorState, ...]:
    if not isinstance(value, dict) or set(value) != set(config.names):
        got = sorted(value) if isinstance(value, dict) else value
        raise ValueError(f"checkpoint cursors must be keyed by the datasets {list(config.names)}, got {got!r}")
    cursors = []
    for d in config.datasets:
        entry = value[d.name]
        if not isinstance(entry, dict) or set(entry) != {KEY_EPOCH, KEY_POSITION}:
            raise ValueError(f"checkpoint cursor of {d.name!r} must be {{'epoch': int, 'position': int}}, got {entry!r}")
        epoch = _count(f"cursor {d.name!r} epoch", entry[KEY_EPOCH], d.max_repeats if d.policy == REPEAT else 0)
        position = _count(f"cursor {d.name!r} position", entry[KEY_POSITION], d.total)
        cursors.append(CursorState(epoch=epoch, position=position))
    return tuple(cursors)
