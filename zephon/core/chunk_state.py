"""A chunk as JSON: the tagged, versioned layout of ``WorkChunk.state_dict()`` and its checks.

``state_to_json`` writes a chunk's fields as plain str/int/float/list/dict/None data;
``fields_from_json`` checks the kind, the version, the pointer ids and the counts of such a
state before anything is built, and hands the rest to the ``WorkChunk`` constructor, which
checks it like any argument.

**Compatibility**: the kind, the version and the field names are frozen; this zephon reads
states of ``STATE_VERSION`` only.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple, TypedDict

import numpy as np

from zephon.core.chunk_checks import INT64_MAX

STATE_KIND: Final = "zephon.WorkChunk"
STATE_VERSION: Final = 1
# The keys (Final: WorkChunkStateDict is indexed with them)
KEY_KIND: Final = "kind"
KEY_VERSION: Final = "version"
KEY_COMPONENTS: Final = "components"
KEY_COUNTS: Final = "counts"
KEY_SEED: Final = "seed"
KEY_TARGET_MIXTURE: Final = "target_mixture"
KEY_SOURCE_EXHAUSTED: Final = "source_exhausted"
STATE_KEYS = (
    KEY_KIND, KEY_VERSION, KEY_COMPONENTS, KEY_COUNTS, KEY_SEED, KEY_TARGET_MIXTURE,
    KEY_SOURCE_EXHAUSTED,
)


class WorkChunkStateDict(TypedDict):
    """``WorkChunk.state_dict()``: a chunk as tagged, versioned JSON."""

    kind: str  # "zephon.WorkChunk"
    version: int  # the layout version (1)
    components: dict[str, list[list[int]]]  # name -> its [dataset_id, shard_id, offset] pointers, in order
    counts: dict[str, int]  # name -> its number of pointers
    seed: int | None
    target_mixture: dict[str, float] | None
    source_exhausted: list[str]


class ChunkFields(NamedTuple):
    """A state's fields: ids checked here, the rest left to the ``WorkChunk`` constructor."""

    components: dict[str, np.ndarray]  # name -> (n, 3) int64 ids, in the state's order
    seed: Any
    target_mixture: Any
    source_exhausted: Any


def state_to_json(
    components: Mapping[str, np.ndarray],
    seed: int | None,
    target_mixture: Mapping[str, float] | None,
    source_exhausted: Iterable[str],
) -> WorkChunkStateDict:
    """A chunk's fields as tagged, versioned JSON-able data (str/int/float/list/dict/None)."""
    return {
        KEY_KIND: STATE_KIND,
        KEY_VERSION: STATE_VERSION,
        KEY_COMPONENTS: {name: ids.tolist() for name, ids in components.items()},
        KEY_COUNTS: {name: len(ids) for name, ids in components.items()},
        KEY_SEED: seed,
        KEY_TARGET_MIXTURE: None if target_mixture is None else dict(target_mixture),
        KEY_SOURCE_EXHAUSTED: list(source_exhausted),
    }


def fields_from_json(state: Any) -> ChunkFields:
    """The fields of a ``state_to_json`` state; any mismatch raises ``ValueError``."""
    _check_header(state)
    components, counts = state[KEY_COMPONENTS], state[KEY_COUNTS]
    if not isinstance(components, dict) or not isinstance(counts, dict):
        raise ValueError(
            f"from_state: {KEY_COMPONENTS!r} and {KEY_COUNTS!r} must be dicts keyed by "
            "component name; pass the output of WorkChunk.state_dict()"
        )
    arrays = {name: _ids_from_json(name, ids) for name, ids in components.items()}
    actual = {name: len(ids) for name, ids in arrays.items()}
    if counts != actual or not all(type(n) is int for n in counts.values()):
        raise ValueError(
            f"from_state: {KEY_COUNTS}={counts!r} does not match the components, which "
            f"hold {actual!r}; the state is corrupted"
        )
    return ChunkFields(arrays, state[KEY_SEED], state[KEY_TARGET_MIXTURE],
                       state[KEY_SOURCE_EXHAUSTED])


def _check_header(state: Any) -> None:
    """Type, fields, kind and version of a state, checked before anything is built."""
    if not isinstance(state, dict):
        raise ValueError(
            f"from_state: state must be a dict from WorkChunk.state_dict(), "
            f"got {type(state).__name__}"
        )
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"from_state: state lacks fields {missing}; it is not a chunk state")
    if state[KEY_KIND] != STATE_KIND:
        raise ValueError(
            f"from_state: {KEY_KIND}={state[KEY_KIND]!r} is not {STATE_KIND!r}; "
            "pass a WorkChunk state"
        )
    version = state[KEY_VERSION]
    if type(version) is not int or version != STATE_VERSION:
        raise ValueError(
            f"from_state: {KEY_VERSION}={version!r} is unknown; this zephon reads version "
            f"{STATE_VERSION}, so load the state with the zephon that wrote it"
        )


def _ids_from_json(name: Any, ids: Any) -> np.ndarray:
    """A state's id list as an ``(n, 3)`` int64 array; bools and negatives are refused."""
    def valid(sample_id: Any) -> bool:
        return (isinstance(sample_id, list) and len(sample_id) == 3
                and all(type(v) is int and 0 <= v <= INT64_MAX for v in sample_id))

    if not isinstance(ids, list) or not all(map(valid, ids)):
        raise ValueError(
            f"from_state: components[{name!r}] must be a list of [dataset_id, shard_id, "
            "offset] lists of non-negative ints; the state is corrupted"
        )
    return np.array(ids, dtype=np.int64).reshape(-1, 3)
