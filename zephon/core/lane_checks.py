"""Many lanes' checkpoints checked at once, field by field: what ``load_state_dict`` of each
lane's clone checks, for the thousands of lanes of one loader state.

A loader state stores its lanes' source states as columns: the keys every lane shares once
(``shared``) and each other field as one value per lane. :func:`all_restore` walks those
columns instead of building and checking each lane's checkpoint (about 6 µs a lane instead
of 100). It answers True only where it has shown that every lane restores; False means
"not shown" (a form it does not take: a migrated or token-mode state, a custom allocator; or
a bad value), and the caller checks lane by lane, which names the fault.
"""
from __future__ import annotations

from typing import Any, Sequence

from zephon.core import alloc as allocators
from zephon.core.checkpoint import (KEY_ALLOC, KEY_CHUNK, KEY_CURSORS, KEY_DIGEST, KEY_EPOCH, KEY_FINGERPRINT,
                                    KEY_KIND, KEY_LANE, KEY_POSITION, KEY_REPLICAS, KEY_STATE, KEY_TAILS,
                                    KEY_VERSION, KIND, VERSION, fingerprint_differences, last_epoch, skipped_tails)
from zephon.core.config import REDISTRIBUTE, SourceConfig
from zephon.limits import MAX_CHUNK_INDEX, MAX_STATE_NODES, STATE_NODES_PER_DATASET, check_json

SHARED_KEYS = frozenset((KEY_KIND, KEY_VERSION, KEY_REPLICAS, KEY_FINGERPRINT))
BODY_KEYS = frozenset((KEY_CHUNK, KEY_ALLOC, KEY_CURSORS))
CURSOR_KEYS = frozenset((KEY_EPOCH, KEY_POSITION, KEY_TAILS))


def all_restore(config: SourceConfig, shared: dict[str, Any], fields: Any, lanes: Sequence[int],
                replicas: int, since: tuple[int, int] = (0, 0)) -> bool:
    """Whether every ``lanes[k]``'s checkpoint, ``shared`` plus lane ``k`` of ``fields``
    (sealed), restores into lane ``lanes[k]`` of ``replicas`` of a ``StaticMixtureWorkSource``
    over ``config``: the checks of its ``load_state_dict``, column by column.

    ``fields`` holds the lanes' other keys: a dict where every lane has a dict with those keys
    (each a ``fields`` value again), a list of one value per lane otherwise. ``since``: the
    chunk index and the samples read of the state the lanes' stream starts from (a phase's
    start), which no lane is before and from which each chunk reads ``chunk_size`` samples. Pure.
    """
    n = len(lanes)
    if config.token_mode or type(config.allocator) not in allocators.KERNEL_CODES or not n:
        return False
    if KEY_STATE in shared and type(fields) is dict and fields.keys() == {KEY_LANE}:  # every lane's is the same
        fields = {**fields, KEY_STATE: _spread(shared[KEY_STATE], n)}
        shared = {key: value for key, value in shared.items() if key != KEY_STATE}
    if not _shared_fits(config, shared, replicas):
        return False
    if not (type(fields) is dict and fields.keys() == {KEY_LANE, KEY_STATE}):
        return False
    ids, body = fields[KEY_LANE], fields[KEY_STATE]
    if not (type(ids) is list and all(type(v) is int for v in ids) and ids == list(lanes)):
        return False
    if not (type(body) is dict and body.keys() == BODY_KEYS):
        return False
    chunks, read = body[KEY_CHUNK], _read(config, body[KEY_CURSORS], n)
    if read is None or not (_counts(chunks, MAX_CHUNK_INDEX, n) and _allocs(config, body[KEY_ALLOC], n)):
        return False
    first_chunk, first_read = since
    if any(c < first_chunk for c in chunks):
        return False
    if not _bounded(config, shared, fields):
        return False
    if any(d.policy == REDISTRIBUTE for d in config.datasets):  # chunks may draw less: no drawn check
        return True
    size = config.chunk_size
    return all(r - first_read == (c - first_chunk) * size for r, c in zip(read, chunks))


def _spread(value: Any, n: int) -> Any:
    """``value`` as the fields of ``n`` lanes that all have it: a dict's keys each spread, any
    other value repeated (what the columns of lanes with equal values give)."""
    if type(value) is dict and value:
        return {key: _spread(item, n) for key, item in value.items()}
    return [value] * n


def _shared_fits(config: SourceConfig, shared: dict[str, Any], replicas: int) -> bool:
    """The shared keys are exactly the header a lane of ``replicas`` of this config writes."""
    return (shared.keys() == SHARED_KEYS and shared[KEY_KIND] == KIND and type(shared[KEY_VERSION]) is int
            and shared[KEY_VERSION] == VERSION and type(shared[KEY_REPLICAS]) is int
            and shared[KEY_REPLICAS] == replicas and not fingerprint_differences(shared[KEY_FINGERPRINT], config))


def _bounded(config: SourceConfig, shared: dict[str, Any], fields: dict[str, Any]) -> bool:
    """A lane's checkpoint is within the size ``check_header`` allows. Every lane's is as large
    as the first's: the fields hold numbers only, in one form, so the first one is checked."""
    first = {**shared, **first_lane(fields), KEY_DIGEST: "0" * 32}
    try:
        check_json(first, "checkpoint", MAX_STATE_NODES + STATE_NODES_PER_DATASET * len(config.datasets))
    except ValueError:
        return False
    return True


def first_lane(fields: Any) -> Any:
    """The first lane's value of ``fields``."""
    return {key: first_lane(value) for key, value in fields.items()} if type(fields) is dict else fields[0]


def _counts(values: Any, upper: int, n: int) -> bool:
    return type(values) is list and len(values) == n and all(type(v) is int and 0 <= v <= upper for v in values)


def _allocs(config: SourceConfig, values: Any, n: int) -> bool:
    """Each lane's allocator state is what the built-in allocator's ``state_from_json`` takes."""
    if not (type(values) is list and len(values) == n):
        return False
    if type(config.allocator) is allocators.FixedAllocator:
        return all(v == [] for v in values)
    return all(allocators.is_accumulator_state(v, len(config.datasets)) for v in values)


def _read(config: SourceConfig, cursors: Any, n: int) -> list[int] | None:
    """Samples each lane's cursors have read (None where a cursor is malformed or out of range)."""
    if not (type(cursors) is dict and cursors.keys() == set(config.names)):
        return None
    read = None
    for d in config.datasets:
        cursor = cursors[d.name]
        if not (type(cursor) is dict and cursor.keys() == CURSOR_KEYS):
            return None
        epochs, positions, tails = cursor[KEY_EPOCH], cursor[KEY_POSITION], cursor[KEY_TAILS]
        if not (_counts(epochs, last_epoch(d), n) and _counts(positions, d.total, n)
                and _counts(tails, MAX_CHUNK_INDEX, n)
                and all(t <= skipped_tails(d, e) for t, e in zip(tails, epochs))):
            return None
        total = d.total
        lane_read = [e * total + p - t for e, p, t in zip(epochs, positions, tails)]
        read = lane_read if read is None else [a + b for a, b in zip(read, lane_read)]
    return read
