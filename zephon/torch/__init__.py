"""zephon on torch: DataLoader, datasets and checkpoints (needs the ``zephon-mixtures[torch]`` extra).

| use | for |
|---|---|
| :class:`DataLoader` | a torch DataLoader over a Pipeline with exact, elastic ``state_dict()`` |
| :class:`StreamDataset` | ``pipeline.to_torch_dataset()``: an ``IterableDataset`` (Stateful for torchdata) |
| :class:`IndexedDataset` | ``pipeline.to_indexable_torch_dataset()``: map-style, via random access |
| :func:`collate` | the default batch maker (``_sample_id`` → ``(B, 3)`` int64 tensor) |
| :func:`all_gather_state`, :func:`merge_states` | per-rank states → one global checkpoint |
| :func:`save_checkpoint`, :func:`load_checkpoint` | atomic, checksummed checkpoint files |
| :func:`save_checkpoint_dir`, :func:`load_checkpoint_dir` | a checkpoint directory: each rank saves its lanes, no collective |
| :func:`complete_steps`, :func:`finalize_checkpoint_dir` | a checkpoint directory's complete steps; mark one |
| :func:`migrate_checkpoint` | continue a run under a new mixture or datasets, with a report of what was unread |
| :func:`stateful_dataloader_state` | the zephon state inside a ``StatefulDataLoader`` state |
| :func:`detect_topology` | rank / world size as zephon sees them |
| :class:`WorkerDiedError` | a DataLoader worker died mid-run (names it, its pid, lanes and signal) |
"""
try:
    import torch as _torch  # noqa: F401  (the optional dependency this package is built on)
except ModuleNotFoundError as missing:
    if missing.name != "torch":
        raise
    raise ImportError("zephon.torch needs PyTorch, which is not installed: pip install 'zephon-mixtures[torch]'") from missing

from zephon.runtime import (
    complete_steps, finalize_checkpoint_dir, load_checkpoint, load_checkpoint_dir, merge_states, migrate_checkpoint,
    save_checkpoint, save_checkpoint_dir,
)
from zephon.torch._collate import collate
from zephon.torch._dcp import load_dcp_states
from zephon.torch._datasets import IndexedDataset, StreamDataset
from zephon.torch._dist import all_gather_state, stateful_dataloader_state
from zephon.torch._frameworks import load_lightning_state
from zephon.torch._loader import DataLoader
from zephon.torch._topology import Topology, detect_topology
from zephon.torch._workers import WorkerDiedError

__all__ = [
    "DataLoader", "IndexedDataset", "StreamDataset", "Topology", "WorkerDiedError", "all_gather_state", "collate",
    "complete_steps", "detect_topology", "finalize_checkpoint_dir", "load_checkpoint", "load_checkpoint_dir",
    "load_dcp_states", "load_lightning_state",
    "merge_states", "migrate_checkpoint", "save_checkpoint", "save_checkpoint_dir", "stateful_dataloader_state",
]
