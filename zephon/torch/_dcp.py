"""The DataLoader as a ``Stateful`` of ``torch.distributed.checkpoint`` (DCP), saved on N ranks
and loaded on M.

DCP writes each key of the ranks' state dicts once: keys that several ranks hold are written
by one of them. A rank's loader state has the same keys on every rank, so DCP would keep one
rank's lanes and drop the others'. Called by DCP, ``DataLoader.state_dict()`` therefore returns
one entry per lane, ``{"zephon_lanes": {"<lane>": "<that lane's loader state, JSON>"}}``:
keys only the lane's rank holds. To load, DCP first asks the loader which keys it wants: the
lanes this rank reads, under the checkpoint's lane count (read from the checkpoint's metadata
when the loader has not fixed it). ``load_state_dict`` merges the lanes it receives.
"""
from __future__ import annotations

import json
import logging
import re
import sys
from types import FrameType
from typing import Any, Callable

from zephon.limits import MAX_CHECKPOINT_BYTES
from zephon.runtime import LaneBook, LoaderStateDict, merge_states, parse_state, rank_lanes, split_state

log = logging.getLogger("zephon")
KEY = "zephon_lanes"
_SAVER = "torch.distributed.checkpoint.state_dict_saver"
_LOADER = "torch.distributed.checkpoint.state_dict_loader"
_DEPTH = 8  # frames between DCP and the loader's state_dict (a user's Stateful may wrap it)
_LANE_KEY = re.compile(rf"(.*?)(?:^|\.){KEY}\.(\d+)")


def dcp_caller() -> tuple[str, FrameType] | None:
    """``("save" | "load", DCP's frame)`` when DCP called the state_dict() that calls this, else None."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_DEPTH):
        if frame is None:
            return None
        module = frame.f_globals.get("__name__", "")
        if module in (_SAVER, _LOADER):
            return ("save" if module == _SAVER else "load"), frame
        frame = frame.f_back
    return None


def dcp_state_dict(book: LaneBook, state: Callable[[], LoaderStateDict], caller: tuple[str, FrameType]) -> dict[str, Any]:
    """What the loader gives DCP: its lanes' states (saving), or the keys it wants (loading)."""
    kind, frame = caller
    if kind == "save":
        return {KEY: {str(lane): json.dumps(s, sort_keys=True, separators=(",", ":"), allow_nan=False)
                      for lane, s in split_state(state()).items()}}
    replicas = book.fixed_replicas or _saved_replicas(frame) or book.canonical_replicas
    return {KEY: {str(lane): "" for lane in rank_lanes(replicas, book.rank, book.world_size, book.mapping)}}


def _saved_replicas(frame: FrameType) -> int | None:
    """The lane count of the checkpoint DCP is loading: its lane entries, from its metadata."""
    read = getattr(frame.f_locals.get("storage_reader"), "read_metadata", None)
    if not callable(read):
        return None
    keys = getattr(read(), "state_dict_metadata", {})
    counts: dict[str, int] = {}
    for key in keys:
        match = _LANE_KEY.fullmatch(key)
        if match:
            counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    if len(counts) != 1:
        log.debug("zephon: the checkpoint holds %d zephon loaders' lanes; the loader keeps its lane count", len(counts))
        return None
    return next(iter(counts.values()))


def is_dcp_form(state: Any) -> bool:
    return isinstance(state, dict) and list(state) == [KEY]


def from_dcp(state: dict[str, Any]) -> LoaderStateDict | None:
    """The lanes DCP loaded, merged into one state (None when the rank reads no lane)."""
    lanes = state[KEY]
    if not isinstance(lanes, dict):
        raise ValueError(f"the DCP entry {KEY!r} must map lanes to their states, got {type(lanes).__name__}")
    states = [_lane_state(key, text) for key, text in sorted(lanes.items())]
    return merge_states(states) if states else None


def _lane_state(key: Any, text: Any) -> Any:
    if text == "":
        raise ValueError(f"the checkpoint holds no state for lane {key} (DCP left its entry {KEY}.{key} unloaded): "
                         "it was saved by a run of another canonical_replicas; build the loader with that "
                         "canonical_replicas")
    if not (type(key) is str and key.isdigit() and type(text) is str and len(text) <= MAX_CHECKPOINT_BYTES):
        raise ValueError(f"the DCP entry {KEY}.{key} must be a lane's state as JSON text; it was not written by a "
                         "zephon DataLoader")
    try:
        state = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError(f"the DCP entry {KEY}.{key} holds malformed JSON ({text[:80]!r}); the checkpoint was not "
                         "written by a zephon DataLoader, or was damaged") from None
    if list(parse_state(state).entries) != [int(key)]:
        raise ValueError(f"the DCP entry {KEY}.{key} holds the state of other lanes; the checkpoint was damaged")
    return state
