"""The torch datasets of a Pipeline: streaming (checkpointable) and map-style (random access)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from torch.utils.data import Dataset, IterableDataset

from zephon.runtime import ItemStream, LaneBook, LoaderStateDict, Pipeline, log_once, paused_gc, say_in_flight
from zephon.torch._topology import current_worker, detect_topology
from zephon.work import PointerSequence


class StreamDataset(IterableDataset[Any]):
    """The items of a pipeline as a torch ``IterableDataset``, lanes spread over ranks and workers.

    Rank and world size come from ``rank`` / ``world_size``, else ``torch.distributed``, else
    torchrun's environment, else a single process (read when the dataset is built). In a job
    with tensor, pipeline or context parallelism, ``device_mesh`` (with ``dp_dims``),
    ``dp_group`` or ``dp_rank`` / ``dp_size`` make the data-parallel ranks the readers, as for
    :class:`zephon.torch.DataLoader`: the ranks of a replica get the same items.
    ``canonical_replicas`` lanes (default: 8 x the world size at the first start, room to grow
    8x; a loaded checkpoint's value otherwise) go to ranks by ``mapping`` and a
    rank's lanes to its DataLoader workers the same way; a reader round-robins samples over
    its lanes, so batches that a plain torch DataLoader makes of these items mix lanes sample
    by sample (:class:`zephon.torch.DataLoader` cuts each batch from one lane, so that it
    carries the mixture). Every ``iter()`` starts at the dataset's position (the start, or the state
    loaded last), like any torch ``IterableDataset``.

    ``state_dict()`` / ``load_state_dict()`` make it *Stateful* for torchdata's
    ``StatefulDataLoader``, which calls them inside each worker: the state then covers that
    worker's lanes. In the main process (``num_workers=0``) it covers the rank's lanes and is
    exact after every batch. ``load_state_dict`` in the main process also accepts a global
    state (see ``zephon.torch.stateful_dataloader_state`` and ``all_gather_state``) and then
    every worker reads its lanes from it: that is how a StatefulDataLoader run resumes on
    another topology.
    """

    def __init__(self, pipeline: Pipeline, *, canonical_replicas: int | None = None, mapping: str = "contiguous",
                 rank: int | None = None, world_size: int | None = None, device_mesh: Any = None,
                 dp_dims: str | Sequence[str] = ("dp",), dp_group: Any = None, dp_rank: int | None = None,
                 dp_size: int | None = None):
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"StreamDataset needs a zephon.Pipeline, got {type(pipeline).__name__}")
        if pipeline.packing is not None:
            raise TypeError("StreamDataset does not read packed pipelines: use zephon.torch.DataLoader(pipeline, "
                            "batch_size=...), which checkpoints the packer")
        topology = detect_topology(rank, world_size, device_mesh=device_mesh, dp_dims=dp_dims, dp_group=dp_group,
                                   dp_rank=dp_rank, dp_size=dp_size)
        self._book = LaneBook(pipeline, canonical_replicas=canonical_replicas, mapping=mapping,
                              rank=topology.rank, world_size=topology.world_size)
        self.topology = topology
        self._live: ItemStream | None = None

    @property
    def pipeline(self) -> Pipeline:
        return self._book.pipeline

    @property
    def canonical_replicas(self) -> int:
        return self._book.canonical_replicas

    def _lanes(self) -> tuple[list[int], int]:
        worker, workers = current_worker()
        lanes = self._book.worker_lanes(worker, workers)
        if not lanes and workers > 1 and self._book.rank_lanes():
            log_once(f"zephon: {workers} DataLoader workers for {len(self._book.rank_lanes())} lanes on rank "
                     f"{self._book.rank}; the extra workers stay idle")
        return lanes, workers

    def __iter__(self) -> ItemStream:
        lanes, _ = self._lanes()
        say_in_flight(self.pipeline.source, len(lanes), self._book.rank)
        self._live = ItemStream(self.pipeline, lanes, self._book.canonical_replicas, self._book.entries(lanes))
        return self._live

    def state_dict(self) -> LoaderStateDict:
        """Where the lanes read in this process stand (JSON: a :class:`zephon.runtime.LoaderStateDict`)."""
        lanes, workers = self._lanes()
        with paused_gc():
            entries = self._live.ledger() if self._live is not None else self._book.saved_entries(lanes)
            return self._book.state(entries, num_workers=None if workers == 1 else workers)

    def check_state_dict(self, state: Any) -> None:
        """Raise ``ValueError`` unless ``state`` restores here (see ``load_state_dict``)."""
        self._book.check(state, current_worker())

    def load_state_dict(self, state: Any) -> None:
        """Resume from ``state``: this process's lanes continue exactly where it says."""
        self._book.load(state, current_worker())
        self._live = None


class IndexedDataset(Dataset[Any]):
    """The items of an indexable pipeline as a map-style torch ``Dataset``.

    Item ``i`` is the ``i``-th sample of the source's stream in default read order: the
    whole stream (global chunk order), or one lane's stream with ``lane`` and
    ``canonical_replicas``. ``__getitems__`` reads a batch with one random-access call and
    one batched fetch. Use a sampler (e.g. ``DistributedSampler``) to split it over ranks.
    """

    def __init__(self, pipeline: Pipeline, *, lane: int | None = None, canonical_replicas: int | None = None):
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"IndexedDataset needs a zephon.Pipeline, got {type(pipeline).__name__}")
        if not pipeline.is_indexable:
            raise TypeError(
                f"this pipeline is not indexable: its source ({type(pipeline.source).__name__}) has no random access "
                "(an infinite stream — set stop_after_passes, max_repeats or a 'stop' policy —, a custom allocator "
                "or a streaming-only source); use to_torch_dataset() or zephon.torch.DataLoader instead")
        if (lane is None) != (canonical_replicas is None):
            raise ValueError("pass both lane and canonical_replicas (one lane's stream) or neither (the whole stream)")
        source = pipeline.source
        if lane is not None and canonical_replicas is not None:
            source = source.clone_for_lane(lane, canonical_replicas)
        self._pipeline = pipeline
        self._sequence = PointerSequence(source)
        pipeline.items_at(np.zeros((0, 3), dtype=np.int64))  # fail now if components cannot be named

    def __len__(self) -> int:
        return len(self._sequence)

    def __getitem__(self, index: int) -> Any:
        pointer = self._sequence[index]
        return self._pipeline.items_at(np.array([pointer], dtype=np.int64))[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        positions = np.asarray(indices, dtype=np.int64)
        if positions.size and positions.min() < 0:
            positions = np.where(positions < 0, positions + len(self), positions)
        return self._pipeline.items_at(self._sequence[positions])
