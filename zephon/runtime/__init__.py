"""The runtime: lanes on ranks and readers, exact ledgers, loader checkpoints (torch-free).

| use | for |
|---|---|
| :func:`rank_lanes`, :func:`worker_lanes` | which lanes a rank / a DataLoader worker reads |
| :class:`LaneMux`, :class:`Tracker`, :class:`ItemStream` | a reader's round-robin stream and its ledger |
| :func:`merge_states`, :func:`parse_state` | loader states: merge per-rank states into a global one |
| :func:`migrate_checkpoint` | a loader checkpoint continued under a new source (one cut for all lanes) |
| :func:`save_checkpoint`, :func:`load_checkpoint` | atomic, checksummed checkpoint files |

The torch front ends (``zephon.torch``) are thin layers over this package.
"""
from zephon.runtime._book import LaneBook, log_once
from zephon.runtime._checkpoint import load_checkpoint, save_checkpoint
from zephon.runtime._lanes import CONTIGUOUS, INTERLEAVED, MAPPINGS, rank_lanes, worker_lanes
from zephon.runtime._migrate import migrate_checkpoint
from zephon.runtime._state import LoaderState, make_state, merge_states, parse_state
from zephon.runtime._stream import Event, ItemStream, LaneMux, Segment, Tracker, initial_entries

__all__ = [
    "CONTIGUOUS", "Event", "INTERLEAVED", "ItemStream", "LaneBook", "LaneMux", "LoaderState", "MAPPINGS",
    "Segment", "Tracker", "initial_entries", "load_checkpoint", "log_once", "make_state", "merge_states",
    "migrate_checkpoint", "parse_state", "rank_lanes", "save_checkpoint", "worker_lanes",
]
