"""JSON checkpoints of a mixture source: tagged, versioned, keyed by dataset name.

A checkpoint holds the lane binding, a fingerprint of the config and the state (a few
numbers per dataset), so its size never grows with training (about a kilobyte for a few
datasets) and it restores in O(1). ``state_from_json`` validates everything before anything
is built; nothing is ever unpickled.

A restore accepts only what ``state_to_json`` could have written for this source: its size
and nesting are bounded (checked without recursion), every value has its exact JSON type (a
bool is not an int, a float is not an int), unknown keys are refused, and ``digest`` (sha256
of the rest, as canonical JSON) must match, so a hand-edited state is refused before any of
its numbers are trusted. Error messages quote values abbreviated (``zephon.limits.show``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from json.encoder import encode_basestring_ascii  # the key quoting of canonical()
import math
from typing import Any, Final, Mapping, Sequence, TypedDict, TypeVar, cast

from zephon.core import alloc as allocators
from zephon.core import cache
from zephon.core.config import CARRY, FIXED, ORIGINS, REPEAT, DatasetPlan, SourceConfig
from zephon.core.schedule import CursorState, SourceState, Token
from zephon.core.tokens import deficit_bound
from zephon.limits import MAX_CHUNK_INDEX, MAX_STATE_NODES, STATE_NODES_PER_DATASET, check_json, show

KIND: Final = "zephon.StaticMixtureWorkSource"
# 2: token deficits are exact ints (token streams changed); sample-mode state as in 1
# 3: an integrity digest; fingerprints compare normalised weights; two-stage renormalisation
# 4: pass_tail (the default "carry" changed repeating streams) and each cursor's tails
# 5: "carry" ends by what was read (its streams changed); its cursors are read coordinates, no tails
VERSION: Final = 5
# The keys (Final: the TypedDicts below are indexed with them)
KEY_KIND: Final = "kind"
KEY_VERSION: Final = "version"
KEY_LANE: Final = "lane"
KEY_REPLICAS: Final = "canonical_replicas"
KEY_FINGERPRINT: Final = "fingerprint"
KEY_STATE: Final = "state"
KEY_DIGEST: Final = "digest"
KEY_CHUNK: Final = "chunk_index"
KEY_ALLOC: Final = "alloc"
KEY_CURSORS: Final = "cursors"
KEY_EPOCH: Final = "epoch"
KEY_POSITION: Final = "position"
KEY_TAILS: Final = "tails"
KEY_RATIOS: Final = "token_ratios"
KEY_RATIO: Final = "ratio"
KEY_ORIGIN: Final = "origin"
KEY_ORDERS: Final = "orders"  # present only after a migration kept some datasets' older sample order
KEY_REQUEUE: Final = "requeue"  # present only while a migrated lane still has samples to re-serve
KEY_MIGRATIONS: Final = "migrations"  # the run's migration history (zephon.work.migrate), if it has one
MAX_REQUEUE = 1 << 13  # ranges a requeue region may hold (5 JSON values each, inside MAX_STATE_NODES)
Sealed = TypeVar("Sealed", bound=Mapping[str, Any])


class CursorStateDict(TypedDict):
    """A dataset's cursor in a checkpoint (:class:`zephon.core.CursorState` as JSON)."""

    epoch: int  # the pass it reads, from 0
    position: int  # samples of that pass read so far
    tails: int  # samples of earlier passes' tails skipped when each next pass started ("drop"; 0 under "carry")


class _SourceStateKeys(TypedDict):
    chunk_index: int
    alloc: Any  # the allocator's JSON state (a list of floats, ``[]`` for "fixed"); token mode: the token deficits (ints)
    cursors: dict[str, CursorStateDict]  # by dataset name


class SourceStateDict(_SourceStateKeys, total=False):
    """Where a mixture stream stands (:class:`zephon.core.SourceState` as JSON): ``chunk_index``
    (global chunks before it), ``alloc`` (the allocator's state), ``cursors`` (by dataset name)
    and, only while a migrated lane still re-serves unread samples, ``requeue`` (ranges
    ``[dataset, pass, start, stop]``)."""

    requeue: list[list[int]]


class TokenRatioDict(TypedDict):
    """A dataset's tokens per byte in a token-mode checkpoint, and how it was obtained."""

    ratio: float
    origin: str  # "measured", "pinned" or "fallback"


MigrationRecord = TypedDict("MigrationRecord", {"cut_chunk": int, "from": str, "unread": int, "requeued": bool})
MigrationRecord.__doc__ = """One migration of a run (``zephon.work.migrate``): the global chunk it cut at, a digest
of the settings it left, the samples assigned but not read, and whether they were re-served."""


class _StaticMixtureStateKeys(TypedDict):
    kind: str  # KIND
    version: int  # VERSION
    lane: int | None  # the lane binding (None: the template)
    canonical_replicas: int | None
    fingerprint: dict[str, Any]  # every setting that shapes the stream (SourceConfig.fingerprint())
    state: SourceStateDict
    digest: str  # sha256 of the rest as canonical JSON (32 hex digits)


class StaticMixtureStateDict(_StaticMixtureStateKeys, total=False):
    """The JSON checkpoint of a :class:`~zephon.work.StaticMixtureWorkSource` (its ``state_dict()``).

    Always: ``kind``, ``version``, the lane binding (``lane``, ``canonical_replicas``; None for
    the template), the ``fingerprint`` of the settings, the ``state`` and the ``digest``.
    Sometimes: ``orders`` (after a migration kept some datasets' sample order: per dataset
    ``[seed, key id, shuffle_shards, shuffle_within_shard, block size, reshuffle_on_repeat]``),
    ``token_ratios`` (token mode, once primed) and ``migrations`` (the run's migration history).
    """

    orders: dict[str, list[int | bool]]
    token_ratios: dict[str, TokenRatioDict]
    migrations: list[MigrationRecord]


def state_to_json(state: SourceState, config: SourceConfig) -> StaticMixtureStateDict:
    """The checkpoint of ``state`` under ``config``: plain JSON types only."""
    alloc = state.alloc
    checkpoint: StaticMixtureStateDict = {
        KEY_KIND: KIND,
        KEY_VERSION: VERSION,
        KEY_LANE: config.lane,
        KEY_REPLICAS: config.canonical_replicas,
        KEY_FINGERPRINT: config.fingerprint(),
        KEY_STATE: {
            KEY_CHUNK: state.chunk_index,
            KEY_ALLOC: list(alloc) if isinstance(alloc, tuple) else alloc,
            KEY_CURSORS: {
                d.name: {KEY_EPOCH: c.epoch, KEY_POSITION: c.position, KEY_TAILS: c.tails}
                for d, c in zip(config.datasets, state.cursors)
            },
        },
        KEY_DIGEST: "",  # sealed() computes it, and puts it last
    }
    if any(d.order is not None for d in config.datasets):
        checkpoint[KEY_ORDERS] = {d.name: [*d.order, d.block_size, d.reshuffle_on_repeat]
                                  for d in config.datasets if d.order is not None}
    if state.requeue:
        checkpoint[KEY_STATE][KEY_REQUEUE] = [list(r) for r in state.requeue]
    if config.token_mode and config.primed:
        checkpoint[KEY_RATIOS] = {d.name: _ratio_to_json(d) for d in config.datasets}
    return sealed(checkpoint, {KEY_FINGERPRINT: cache.fingerprint_json(config, canonical)})


def state_fields(tokens: Sequence[Token], config: SourceConfig) -> dict[str, Any] | None:
    """The ``state`` part of :func:`state_to_json` for the state of each of ``tokens``
    (``schedule.state_token``) under ``config``, field by field: one list of values per field,
    nested as the state's dicts nest. A loader state's columns are made of these without a
    dict per lane. None where the states differ in their keys (some have samples to serve
    first, others not)."""
    requeued = [bool(token[3]) for token in tokens]
    if not tokens or any(requeued) != all(requeued):
        return None
    chunks, allocs, cursors, requeues = zip(*tokens)
    out: dict[str, Any] = {
        KEY_CHUNK: list(chunks),
        KEY_ALLOC: [list(alloc) if isinstance(alloc, tuple) else alloc for alloc in allocs],
        KEY_CURSORS: {d.name: {KEY_EPOCH: [c[i][0] for c in cursors], KEY_POSITION: [c[i][1] for c in cursors],
                               KEY_TAILS: [c[i][2] for c in cursors]} for i, d in enumerate(config.datasets)},
    }
    if requeued[0]:
        out[KEY_REQUEUE] = [[list(r) for r in requeue] for requeue in requeues]
    return out


def _ratio_to_json(plan: DatasetPlan) -> TokenRatioDict:
    """A primed dataset's ratio and its origin (both are set together when it is primed)."""
    if plan.token_ratio is None or plan.ratio_origin is None:
        raise ValueError(f"dataset {plan.name!r} has no tokens-per-byte ratio yet; prime the source first")
    return {KEY_RATIO: plan.token_ratio, KEY_ORIGIN: plan.ratio_origin}


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))  # json.dumps makes one per call


def canonical(value: Any) -> str:
    """The canonical JSON of ``value`` (sorted keys, compact): what a digest hashes. It tells
    types apart (``1`` / ``1.0`` / ``true``) and ignores key order."""
    return _CANONICAL.encode(value)


def digest(checkpoint: Mapping[str, Any], shared: Mapping[str, str] | None = None) -> str:
    """sha256 of a checkpoint without its digest, as canonical JSON (sorted keys, compact); 32 hex
    digits (128 bits) catch any edit and keep a loader state of many lanes small. ``shared``
    maps some of its keys to the canonical JSON of their values, made once for the many
    checkpoints that share them (a loader state's lanes): the text hashed is the same."""
    body = {k: v for k, v in checkpoint.items() if k != KEY_DIGEST}
    if shared:
        text = "{" + ",".join(f"{encode_basestring_ascii(k)}:{shared[k] if k in shared else canonical(v)}"
                              for k, v in sorted(body.items())) + "}"
    else:
        text = canonical(body)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def sealed(checkpoint: Sealed, shared: Mapping[str, str] | None = None) -> Sealed:
    """``checkpoint`` with its digest (re)computed, as its last key (``shared``: see :func:`digest`)."""
    out = {**{k: v for k, v in checkpoint.items() if k != KEY_DIGEST}, KEY_DIGEST: digest(checkpoint, shared)}
    return cast(Sealed, out)  # the same keys and value types: only the digest's value and place change


def ratios_from_json(checkpoint: Mapping[str, Any], config: SourceConfig) -> dict[str, tuple[float, str]]:
    """The tokens-per-byte ratios a token-mode checkpoint carries, validated ({} in sample mode)."""
    if not config.token_mode:
        return {}
    ratios = checkpoint.get(KEY_RATIOS)
    if not isinstance(ratios, dict) or set(ratios) != set(config.names):
        raise ValueError(f"token-mode checkpoint must carry token_ratios for {show(list(config.names))}, got {show(ratios)}")
    out = {}
    for name, entry in ratios.items():
        ratio = entry.get(KEY_RATIO) if isinstance(entry, dict) else None
        if (type(ratio) is not float or not (math.isfinite(ratio) and ratio > 0) or set(entry) != {KEY_RATIO, KEY_ORIGIN}
                or entry[KEY_ORIGIN] not in ORIGINS):
            raise ValueError(f"checkpoint token ratio of {name!r} is malformed: {show(entry)}; the checkpoint is corrupted")
        out[name] = (ratio, entry[KEY_ORIGIN])
    for d in config.datasets:  # ratios are not in the fingerprint: a changed pin is caught here
        if d.ratio_origin in FIXED and d.token_ratio != out[d.name][0]:
            raise ValueError(f"the checkpoint's token ratio of {d.name!r} is {out[d.name][0]}, but this source pins "
                             f"{d.token_ratio}; the stream continues exactly only under the ratio it was made with: "
                             "pin the checkpoint's ratio (TokenEstimation primer), or move the run to the new one "
                             "with zephon.work.migrate")
    return out


def with_orders(config: SourceConfig, orders: Any) -> SourceConfig:
    """``config`` with the kept sample orders of some datasets: name -> ``[seed, key id,
    shuffle_shards, shuffle_within_shard, block size, reshuffle_on_repeat]`` (validated)."""
    if not orders:
        return config
    if not isinstance(orders, dict) or not set(orders) <= set(config.names):
        raise ValueError(f"checkpoint orders must map datasets of {show(list(config.names))} to their order, got "
                         f"{show(orders)}; the checkpoint is corrupted")
    plans = []
    for d in config.datasets:
        entry = orders.get(d.name)
        if entry is None:
            plans.append(d)
            continue
        types = (int, int, bool, bool, int, bool)
        if (not isinstance(entry, list) or len(entry) != len(types) or not all(type(v) is t for v, t in zip(entry, types))
                or entry[1] < 0 or not 0 <= entry[4] <= d.total):
            raise ValueError(f"checkpoint order of {d.name!r} must be [seed, key id, shuffle_shards, "
                             f"shuffle_within_shard, block size, reshuffle_on_repeat], got {show(entry)}")
        plans.append(dataclasses.replace(d, order=tuple(entry[:4]), block_size=entry[4], reshuffle_on_repeat=entry[5]))
    return dataclasses.replace(config, datasets=tuple(plans))


def check_header(checkpoint: Any, config: SourceConfig) -> None:
    """Refuse anything that is not an intact zephon mixture checkpoint of this version.

    Checks, in order: a bounded plain-JSON dict, the kind, the version, exactly the keys
    ``state_to_json`` writes for ``config`` (and those a migration adds: ``orders``,
    ``migrations``), and the digest.
    """
    if not isinstance(checkpoint, dict):
        raise ValueError(f"checkpoint must be a dict (from state_dict()), got {type(checkpoint).__name__}")
    check_json(checkpoint, "checkpoint", MAX_STATE_NODES + STATE_NODES_PER_DATASET * len(config.datasets))
    if checkpoint.get(KEY_KIND) != KIND:
        raise ValueError(f"checkpoint kind is {show(checkpoint.get(KEY_KIND))}, expected {KIND!r}; pass a "
                         "state_dict() of this source type")
    version = checkpoint.get(KEY_VERSION)
    if type(version) is not int or version != VERSION:
        raise ValueError(
            f"checkpoint version {show(version)} is not supported (this zephon reads version "
            f"{VERSION}); restore it with the zephon version that wrote it"
        )
    required = {KEY_KIND, KEY_VERSION, KEY_LANE, KEY_REPLICAS, KEY_FINGERPRINT, KEY_STATE, KEY_DIGEST}
    saved = checkpoint[KEY_FINGERPRINT] if isinstance(checkpoint.get(KEY_FINGERPRINT), dict) else {}
    allowed = required | {KEY_ORDERS, KEY_MIGRATIONS} | (
        {KEY_RATIOS} if config.token_mode or saved.get("mode") == "tokens" else set())
    missing, unknown = sorted(required - set(checkpoint)), sorted(set(checkpoint) - allowed)
    if missing or unknown:
        raise ValueError(f"checkpoint is missing {show(missing)} and has unknown keys {show(unknown)}; it is "
                         "truncated, edited or was not written by state_dict() of this source")
    if checkpoint[KEY_DIGEST] != digest(checkpoint):
        raise ValueError("state digest mismatch: the checkpoint was changed after state_dict() wrote it; restore "
                         "an unedited state_dict()")


def fingerprint_differences(saved: Any, config: SourceConfig) -> list[str]:
    """What differs between a checkpoint's fingerprint and ``config`` (empty if they match).

    Values compare exactly, types included; unknown keys differ too.
    """
    current = config.fingerprint()
    if not isinstance(saved, dict):
        return [f"fingerprint is {type(saved).__name__}, not a dict"]
    if canonical(saved) == canonical(current):
        return []
    differences = [
        f"{key}: checkpoint has {show(saved.get(key), 80)}, this source has {show(current[key], 80)}"
        for key in current
        if key not in saved or canonical(saved[key]) != canonical(current[key])
    ]
    unknown = sorted(set(saved) - set(current))
    return differences + ([f"unknown keys {show(unknown)}"] if unknown else [])


def state_from_json(checkpoint: Mapping[str, Any], config: SourceConfig, checked: bool = False) -> SourceState:
    """Validate a checkpoint's state against ``config`` and build it; raise ``ValueError`` if bad.
    ``checked``: its settings were found to be ``config``'s already (not compared again)."""
    differences = [] if checked else fingerprint_differences(checkpoint[KEY_FINGERPRINT], config)
    if differences:
        more = f"; and {len(differences) - 3} more" if len(differences) > 3 else ""
        raise ValueError(
            "checkpoint was taken with a different configuration: " + "; ".join(differences[:3]) + more
            + ". Restore it into a source built with the same datasets and settings"
        )
    return parse_state(checkpoint[KEY_STATE], config)


def parse_state(body: Any, config: SourceConfig) -> SourceState:
    """Validate a checkpoint's ``state`` part against ``config`` (no fingerprint check) and build it."""
    if not isinstance(body, dict) or set(body) - {KEY_REQUEUE} != {KEY_CHUNK, KEY_ALLOC, KEY_CURSORS}:
        raise ValueError(f"checkpoint state must have exactly {[KEY_CHUNK, KEY_ALLOC, KEY_CURSORS]} (and "
                         f"{KEY_REQUEUE!r} after a migration); it is corrupted")
    cursors = _cursors_from_json(body[KEY_CURSORS], config)
    return SourceState(
        chunk_index=_count(KEY_CHUNK, body[KEY_CHUNK], MAX_CHUNK_INDEX),
        alloc=_alloc_from_json(body[KEY_ALLOC], config),
        cursors=cursors,
        requeue=_requeue_from_json(body.get(KEY_REQUEUE, []), config, cursors),
    )


def _requeue_from_json(value: Any, config: SourceConfig, cursors: tuple[CursorState, ...]
                       ) -> tuple[tuple[int, int, int, int], ...]:
    """Ranges ``[dataset, pass, start, stop]`` inside passes the cursors have reached, sorted, disjoint."""
    if not isinstance(value, list) or len(value) > MAX_REQUEUE:
        raise ValueError(f"checkpoint requeue must be a list of at most {MAX_REQUEUE} ranges, got "
                         f"{type(value).__name__}; the checkpoint is corrupted")
    out: list[tuple[int, int, int, int]] = []
    for entry in value:
        ok = isinstance(entry, list) and len(entry) == 4 and all(type(v) is int for v in entry)
        if ok:
            c, epoch, start, stop = entry
            ok = 0 <= c < len(config.datasets) and 0 <= epoch <= cursors[c].epoch and 0 <= start < stop \
                <= config.datasets[c].total and (not out or tuple(entry) > out[-1])
        if not ok:
            raise ValueError(f"checkpoint requeue range {show(entry)} must be [dataset, pass, start, stop] inside a pass "
                             "the cursor has reached, in ascending order; the checkpoint is corrupted")
        out.append((entry[0], entry[1], entry[2], entry[3]))
    return tuple(out)


def _count(what: str, value: Any, upper: int) -> int:
    if type(value) is not int or not 0 <= value <= upper:
        raise ValueError(f"checkpoint {what} must be an int in [0, {upper}], got {show(value)}; the checkpoint is "
                         "corrupted")
    return value


def _alloc_from_json(value: Any, config: SourceConfig) -> Any:
    if config.token_mode:
        bound = deficit_bound(len(config.datasets))
        if (not isinstance(value, list) or len(value) != len(config.datasets)
                or not all(type(v) is int and abs(v) <= bound for v in value) or sum(value) != 0):
            raise ValueError(f"checkpoint alloc must be {len(config.datasets)} token deficits, ints in "
                             f"[-{bound}, {bound}] summing to 0, got {show(value)}; the checkpoint is corrupted")
        return tuple(value)
    return allocators.state_from_json(config.allocator, value, len(config.datasets))


def _cursors_from_json(value: Any, config: SourceConfig) -> tuple[CursorState, ...]:
    if not isinstance(value, dict) or set(value) != set(config.names):
        got = sorted(value) if isinstance(value, dict) else value
        raise ValueError(f"checkpoint cursors must be keyed by the datasets {show(list(config.names))}, got {show(got)}")
    cursors = []
    for d in config.datasets:
        entry = value[d.name]
        if not isinstance(entry, dict) or set(entry) != {KEY_EPOCH, KEY_POSITION, KEY_TAILS}:
            raise ValueError(f"checkpoint cursor of {d.name!r} must be {{'epoch': int, 'position': int, "
                             f"'tails': int}}, got {show(entry)}")
        epoch = _count(f"cursor {d.name!r} epoch", entry[KEY_EPOCH], last_epoch(d))
        position = _count(f"cursor {d.name!r} position", entry[KEY_POSITION], d.total)
        tails = _count(f"cursor {d.name!r} tails", entry[KEY_TAILS], skipped_tails(d, epoch))
        cursors.append(CursorState(epoch=epoch, position=position, tails=tails))
    return tuple(cursors)


def last_epoch(d: DatasetPlan) -> int:
    """The largest pass index a cursor of ``d`` can stand in (``stop_after_passes`` bounds no
    single dataset: a small one may repeat many times while a large one finishes its passes)."""
    if d.policy != REPEAT:
        return 0
    return MAX_CHUNK_INDEX if d.max_repeats is None else d.max_repeats


def skipped_tails(d: DatasetPlan, epoch: int) -> int:
    """The most samples a cursor of ``d`` in pass ``epoch`` can have skipped: every "drop" pass
    start skips a tail of at most total - 1 samples (a pass that gave none ends the stream);
    "carry" skips none."""
    return 0 if d.pass_tail == CARRY else min(epoch * max(d.total - 1, 0), MAX_CHUNK_INDEX)
