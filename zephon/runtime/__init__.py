"""The runtime: lanes on ranks and readers, exact ledgers, loader checkpoints (torch-free).

| use | for |
|---|---|
| :class:`Pipeline` | items of a work source: records + ``_sample_id`` + ``_component``, with ``map`` steps |
| ``KEY_SAMPLE_ID``, ``KEY_COMPONENT`` | the item keys of a sample's pointer and component name |
| :func:`rank_lanes`, :func:`worker_lanes` | which lanes a rank / a DataLoader worker reads |
| :class:`LaneMux`, :class:`Tracker`, :class:`ItemStream` | a reader's round-robin stream and its ledger |
| :class:`Sealer`, :class:`SealingLedger` | a ledger's states sealed when asked for |
| :func:`merge_states`, :func:`parse_state`, :func:`split_state` | loader states: merge per-rank states into a global one; cut one per lane |
| :func:`migrate_checkpoint` | a loader checkpoint continued under a new source (one cut for all lanes) |
| :class:`LoaderStateDict`, :class:`DatasetRecord` | the JSON types of a loader state |
| :func:`save_checkpoint`, :func:`load_checkpoint` | atomic, checksummed checkpoint files |
| :func:`save_checkpoint_dir`, :func:`load_checkpoint_dir` | a checkpoint directory: a file per rank, no collective |
| :func:`complete_steps`, :func:`finalize_checkpoint_dir` | a checkpoint directory's complete steps; mark one |
| ``Entry``, ``SERVED``, ``LOADER_STATE_KIND`` | a lane's ledger entry, its served flag, the ``kind`` of a loader state |
| ``DROPPED`` | the marker of an item a ``filter`` step rejected |
| :class:`PackedReader`, :class:`Snapshots` | a reader's packed sequences, and their ledger (with operator states) |
| :func:`count_ranks`, :func:`even_target`, :class:`Even` | equal steps: each rank's remaining batches and the common budget |
| :class:`LoaderStats`, :class:`LoaderStatsDict` | what a rank delivered, and its JSON (``DataLoader.stats()``) |

The torch front ends (``zephon.torch``) are thin layers over this package.
"""
from zephon.runtime._book import LaneBook, log_once, say_in_flight
from zephon.runtime._checkpoint import HF_STATE_FILE, LIGHTNING_KEY, load_checkpoint, save_checkpoint
from zephon.runtime._checkpoint import check_size as check_checkpoint_size
from zephon.runtime._checkpoint_dir import MARKER as CHECKPOINT_MARKER
from zephon.runtime._checkpoint_dir import STEP_FOLDER
from zephon.runtime._checkpoint_dir import complete_steps, finalize_checkpoint_dir, load_checkpoint_dir, save_checkpoint_dir
from zephon.runtime._even import Even, EvenBatchesDict, RankCount, count_rank, count_ranks, countable, even_target, maybe_finite
from zephon.runtime._gc import paused_gc
from zephon.runtime._lanes import CONTIGUOUS, INTERLEAVED, MAPPINGS, rank_lanes, worker_lanes
from zephon.runtime._migrate import migrate_checkpoint
from zephon.runtime._packed import (
    PackedReader, Snapshot, Snapshots, count_packed, count_sequences, documents, initial_operator, sequence_items,
)
from zephon.runtime._state import KIND as LOADER_STATE_KIND
from zephon.runtime._state import (
    DatasetRecord, LanesDict, LoaderState, LoaderStateDict, make_state, merge_states, parse_state, run_fingerprint,
    split_state,
)
from zephon.runtime._stats import (
    DatasetStatsDict, LoaderStats, LoaderStatsDict, SharedDecodingDict, TokensDict, component_counts,
)
from zephon.runtime._stream import (
    DROPPED, SERVED, Event, Items, ItemStream, LaneMux, Piece, Segment, Tracker, initial_entries, write,
)
from zephon.runtime._sealing import Entry, Sealer, SealingLedger
from zephon.runtime.pipeline import KEY_COMPONENT, KEY_SAMPLE_ID, Pipeline

__all__ = [
    "CHECKPOINT_MARKER", "CONTIGUOUS", "DROPPED", "HF_STATE_FILE", "LIGHTNING_KEY", "STEP_FOLDER", "check_checkpoint_size", "DatasetStatsDict", "Even", "EvenBatchesDict", "LoaderStats", "LoaderStatsDict", "RankCount", "SharedDecodingDict", "TokensDict", "component_counts", "count_rank", "count_ranks", "countable", "even_target",
    "maybe_finite", "DatasetRecord", "Entry", "Event", "INTERLEAVED", "ItemStream", "Items", "KEY_COMPONENT", "KEY_SAMPLE_ID", "LOADER_STATE_KIND",
    "LaneBook", "LaneMux", "LanesDict", "PackedReader", "Snapshot", "Snapshots", "count_packed", "count_sequences", "documents", "initial_operator",
    "sequence_items", "LoaderState", "LoaderStateDict", "MAPPINGS", "Piece", "Pipeline", "SERVED", "Sealer", "SealingLedger", "Segment", "Tracker", "initial_entries",
    "load_checkpoint", "log_once", "make_state", "merge_states", "migrate_checkpoint", "parse_state", "paused_gc", "rank_lanes", "run_fingerprint", "say_in_flight",
    "write", "save_checkpoint", "worker_lanes", "complete_steps", "finalize_checkpoint_dir", "load_checkpoint_dir",
    "save_checkpoint_dir", "split_state",
]
