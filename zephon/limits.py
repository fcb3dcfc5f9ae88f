"""The limits zephon enforces on its inputs, in one place.

Every value below bounds something a user or a checkpoint can hand in; constructors refuse
anything beyond them with a ``ValueError`` naming the parameter and the limit, and
``load_state_dict`` / ``load_checkpoint`` refuse states beyond them the same way. They keep
every counter inside int64 (so the kernels never overflow) and every walk finite.

| limit | value | bounds |
|---|---|---|
| ``MAX_SAMPLES`` | 2**48 | rows of one dataset, summed over its shards (and each shard's rows) |
| ``MAX_STREAM_SAMPLES`` | 2**52 | rows of all the datasets of one source together |
| ``MAX_DATASETS`` | 2**20 | datasets of one source |
| ``MAX_SHARDS`` | 2**26 | shards of one dataset |
| ``MAX_PASSES`` | 2**14 | ``max_repeats`` and ``stop_after_passes`` |
| ``MAX_CHUNK_SIZE`` | 2**30 | ``chunk_size`` |
| ``MAX_REPLICAS`` | 2**24 | ``canonical_replicas`` of ``clone_for_lane`` |
| ``MAX_CHUNK_INDEX`` | 2**62 | a state's ``chunk_index`` and a cursor's ``epoch`` |
| ``MIN_SHARE`` | 2**-50 | a dataset's normalised weight (smaller shares are below double resolution) |
| ``MAX_INDEX_CHUNKS`` | 2**28 | global chunks of a stream that ``len`` / ``sample_id_at`` walk (index memory, time) |
| ``MAX_PHASE_WALK`` | 2**28 | chunks walked from a phase's start to find where it ends; a phase's ``until_chunk`` |
| ``MAX_TOKEN_PHASE_WALK`` | 2**18 | the same in token mode, which plans chunks one at a time |
| ``MAX_CALIBRATION`` | 2**16 | ``TokenEstimation`` ``calibration_samples`` and shard draws per dataset |
| ``MAX_RECORD_TOKENS`` | 2**40 | the token count of one record (a tokenizer's or ``measure``'s) |
| ``MAX_TOKEN_RATIO`` | 2**10 | tokens per byte, measured or cached |
| ``MAX_STATE_NODES`` | 2**16 + 64 per dataset | JSON values in a source's state (``load_state_dict``) |
| ``MAX_LOADER_STATE_NODES`` | 2**24 | JSON values in a loader's state (all lanes) |
| ``MAX_STATE_DEPTH`` | 16 | nesting of a state |
| ``MAX_CHECKPOINT_BYTES`` | 2**28 | size of a checkpoint file |
| ``MAX_MESSAGE_VALUE`` | 120 | characters of a value quoted in an error message |
| ``MAX_LAG`` | 4 | batches a loader's ``state_dict(lag=k)`` steps back over |

Token mode mixes at most ``zephon.core.tokens.MAX_DATASETS`` (2**14) datasets. With these,
a cursor's position stays below 2**48, an indexed stream holds at most ``MAX_INDEX_CHUNKS ×
MAX_CHUNK_SIZE = 2**58`` samples, and a restored chunk index or epoch leaves 2**62 chunks of
headroom before int64 ends. This module imports nothing from zephon, so every layer (io
included) reads it.
"""
from __future__ import annotations

import re
import reprlib
from typing import Any

MAX_SAMPLES = 2**48
MAX_STREAM_SAMPLES = 2**52
MAX_DATASETS = 2**20
MAX_SHARDS = 2**26
MAX_PASSES = 2**14
MAX_CHUNK_SIZE = 2**30
MAX_REPLICAS = 2**24
MAX_CHUNK_INDEX = 2**62
MIN_SHARE = 2.0**-50
MAX_INDEX_CHUNKS = 2**28
MAX_PHASE_WALK = 2**28  # chunks, walked by the scheduling kernel (about 20 M chunks/s)
MAX_TOKEN_PHASE_WALK = 2**18  # chunks, planned one at a time in token mode (about 30 k chunks/s)
MAX_CALIBRATION = 2**16
MAX_RECORD_TOKENS = 2**40
MAX_TOKEN_ID = 2**63 - 1  # token ids are int64
MAX_TOKEN_RATIO = 2**10
MAX_STATE_NODES = 2**16
STATE_NODES_PER_DATASET = 64
MAX_LOADER_STATE_NODES = 2**24
MAX_STATE_DEPTH = 16
MAX_CHECKPOINT_BYTES = 2**28
MAX_MESSAGE_VALUE = 120
MAX_LAG = 4


class _Short(reprlib.Repr):
    """``reprlib`` with every size bounded, and huge ints named by their size (``repr`` of one
    with over 4,300 digits raises)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxset = 3, 6, 6, 6, 6
        self.maxstring, self.maxlong, self.maxother = 60, 40, 60

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_SHORT = _Short()


def show(value: Any, limit: int = MAX_MESSAGE_VALUE) -> str:
    """``repr(value)`` abbreviated to at most ``limit`` characters, for error messages about
    hostile input: containers are cut before formatting and nesting is bounded, so a huge or
    deep value costs little."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def brief(error: BaseException, limit: int = 2 * MAX_MESSAGE_VALUE) -> str:
    """Another library's exception in one line: its type and the first line of its message
    (terminal colour codes dropped), at most ``limit`` characters."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


_FLAT = {str, int, float, bool, type(None)}


def check_json(value: Any, what: str, max_nodes: int, max_depth: int = MAX_STATE_DEPTH) -> None:
    """Refuse ``value`` unless it is plain JSON (dict with str keys, list, str, int, float,
    bool, None) of at most ``max_nodes`` values (a string counts one per 64 characters) nested
    at most ``max_depth`` deep. Iterative: a hostile value nested 10⁵ deep costs no recursion;
    a list of scalars (a loader state's column) is counted at once, not walked.
    """
    stack, nodes = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        kinds = set(map(type, node)) if isinstance(node, list) else set()
        flat = isinstance(node, list) and bool(node) and kinds <= _FLAT
        nodes += 1 + (len(node) // 64 if isinstance(node, str) else 0)
        if flat:
            nodes += len(node) + (sum(len(v) // 64 for v in node if type(v) is str) if str in kinds else 0)
        if nodes > max_nodes:
            raise ValueError(f"{what} is larger than a zephon state can be (over {max_nodes} JSON values); it is "
                             "corrupted or not a state of this source")
        if depth + flat > max_depth:
            raise ValueError(f"{what} is nested deeper than {max_depth} levels; it is corrupted or not a state of "
                             "this source")
        if isinstance(node, dict):
            if not all(type(k) is str for k in node):
                raise ValueError(f"{what} keys must be str, got {show(list(node))}; it is corrupted")
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            if not flat:
                stack.extend((v, depth + 1) for v in node)
        elif node is not None and type(node) not in (str, int, float, bool):
            raise ValueError(f"{what} holds a {type(node).__name__}, not plain JSON: {show(node)}; pass a "
                             "state_dict() (or its json.loads)")
