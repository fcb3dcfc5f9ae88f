"""The DataLoader as a ``Stateful`` of ``torch.distributed.checkpoint`` (DCP), saved on N ranks
and loaded on M.

DCP writes each key of the ranks' state dicts once: keys that several ranks hold are written
by one of them. A rank's loader state has the same keys on every rank, so DCP would keep one
rank's lanes and drop the others'. Called by DCP, ``DataLoader.state_dict()`` therefore returns
one entry per lane, ``{"zephon_lanes": {"<lane>": "<that lane's loader state, JSON>"}}``:
keys only the lane's rank holds. To load, DCP first asks the loader which keys it wants: the
lanes this rank reads, under the checkpoint's lane count (read from the checkpoint's metadata
when the loader has not fixed it); a rank that reads no lane asks for lane 0, which fixes its
lane count. ``load_state_dict`` merges the lanes it receives.
"""
from __future__ import annotations

import json
import logging
import re
import sys
import warnings
from types import FrameType
from typing import Any, Callable

from zephon.limits import MAX_CHECKPOINT_BYTES, brief, show
from zephon.runtime import LaneBook, LoaderStateDict, merge_states, parse_state, rank_lanes, split_state

log = logging.getLogger("zephon")
KEY = "zephon_lanes"
_SAVER = "torch.distributed.checkpoint.state_dict_saver"
_LOADER = "torch.distributed.checkpoint.state_dict_loader"
_DEPTH = 8  # frames between DCP and the loader's state_dict (a user's Stateful may wrap it, through helpers)
_LANE_KEY = re.compile(rf"(.*?)(?:^|\.){KEY}\.(\d+)")


def dcp_caller() -> tuple[str, FrameType] | None:
    """``("save" | "load", DCP's frame)`` when DCP called the state_dict() that calls this
    (directly, or through a Stateful of the user's), else None."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_DEPTH):
        if frame is None:
            return None
        module = frame.f_globals.get("__name__", "")
        if module in (_SAVER, _LOADER):
            return ("save" if module == _SAVER else "load"), frame
        frame = frame.f_back
    return None


def dcp_state_dict(book: LaneBook, state: Callable[[], LoaderStateDict], caller: tuple[str, FrameType],
                   owner: object) -> dict[str, Any]:
    """What the loader ``owner`` gives DCP: its lanes' states (saving), or the keys it wants
    (loading: its lanes, or lane 0 for a rank that reads none, to learn the run's lane count)."""
    kind, frame = caller
    if kind == "save":
        return {KEY: {str(lane): json.dumps(s, sort_keys=True, separators=(",", ":"), allow_nan=False)
                      for lane, s in split_state(state()).items()}}
    saved = _saved_replicas(frame, owner, fixed=book.fixed_replicas is not None)
    if book.fixed_replicas is not None and saved is not None and saved != book.fixed_replicas:
        raise ValueError(f"the DCP checkpoint holds {saved} lanes of this loader, but the loader was built with (or "
                         f"loaded) canonical_replicas={book.fixed_replicas}; canonical_replicas is fixed for a run: "
                         f"pass canonical_replicas={saved} (or leave it unset)")
    replicas = book.fixed_replicas or saved or book.canonical_replicas
    lanes = rank_lanes(replicas, book.rank, book.world_size, book.mapping) or [0]
    return {KEY: {str(lane): "" for lane in lanes}}


def _saved_replicas(frame: FrameType, owner: object, *, fixed: bool) -> int | None:
    """The lane count of the checkpoint DCP is loading, counted from its metadata's lane entries
    (of this loader's top-level key when the checkpoint holds several zephon loaders); None
    when unknown. Several loaders of different counts need ``fixed`` lane counts."""
    read = getattr(frame.f_locals.get("storage_reader"), "read_metadata", None)
    if not callable(read):
        return None
    try:
        keys = getattr(read(), "state_dict_metadata", {})
    except (OSError, ValueError, RuntimeError) as error:
        log.warning("zephon: cannot read the DCP checkpoint's metadata (%s); the loader keeps its lane count", error)
        return None
    counts: dict[str, int] = {}
    for key in keys:
        match = _LANE_KEY.fullmatch(key)
        if match:
            counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    top = frame.f_locals.get("state_dict")
    mine = [key for key, value in top.items() if value is owner] if isinstance(top, dict) else []
    if mine and mine[0] in counts:
        return counts[mine[0]]
    if len(set(counts.values())) > 1:
        if fixed:
            return None
        raise ValueError(f"the DCP checkpoint holds zephon loaders of different lane counts {counts}, and this one "
                         "is not a top-level entry of the state dict: build each loader with its "
                         "canonical_replicas")
    return next(iter(counts.values()), None)


def is_dcp_form(state: Any) -> bool:
    return isinstance(state, dict) and list(state) == [KEY]


def from_dcp(state: dict[str, Any]) -> LoaderStateDict:
    """The lanes DCP loaded, merged into one state."""
    lanes = state[KEY]
    if not isinstance(lanes, dict) or not lanes:
        raise ValueError(f"the DCP entry {KEY!r} must map lanes to their states, got {show(lanes)}")
    return merge_states(_lane_state(key, text) for key, text in sorted(lanes.items()))


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


def load_dcp_states(path: str) -> dict[str, LoaderStateDict]:
    """Every zephon loader's global state in the DCP checkpoint folder ``path``, by its key in
    the saved state dict (e.g. ``"app.data"``), read in this process without a process group
    (e.g. to save it with :func:`save_checkpoint`). torch's DCP reader unpickles the folder's
    ``.metadata``: read only checkpoints you trust. Raises ``ValueError`` when the folder holds
    no zephon loader or cannot be read."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # not an Exception: a BaseException

    try:
        keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    except (Exception, CheckpointException) as error:  # whatever torch's unpickler meets in a damaged file
        raise ValueError(f"{path}: cannot read its DCP metadata ({brief(error)})") from None
    lanes = [(key, match) for key in keys if (match := _LANE_KEY.fullmatch(key))]
    if not lanes:
        raise ValueError(f"{path} is a DCP checkpoint that holds no zephon loader (no {KEY} entries)")
    entries: dict[str, Any] = {key: "" for key, _ in lanes}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)  # no process group: meant
            dcp.load(entries, checkpoint_id=path, no_dist=True)
    except (Exception, CheckpointException) as error:  # as above, for its data files
        raise ValueError(f"{path}: cannot read its zephon entries ({brief(error)})") from None
    by_loader: dict[str, dict[str, Any]] = {}
    for key, match in lanes:
        by_loader.setdefault(match.group(1), {})[match.group(2)] = entries[key]
    return {prefix: from_dcp({KEY: texts}) for prefix, texts in sorted(by_loader.items())}
