"""zephon.torch.DataLoader: a torch DataLoader over a Pipeline with exact, elastic checkpoints.

How it works
------------
The loader hands torch an internal ``IterableDataset`` and no batching of its own
(``batch_size=None``). Each reader (a worker, or the main process with ``num_workers=0``)
reads its lanes round robin (``zephon.runtime.LaneMux``), cuts the stream into batches of
``batch_size`` (or items), and sends them in *bundles* of several batches, each bundle
carrying the few facts its ledger needs (lane rotations and chunk starts, by position).
The main process unpacks bundles and yields batches round robin over the workers, like a
plain torch DataLoader, and after every batch it knows each worker's position: so
``state_dict()`` is exact for what the training loop has received, whatever was prefetched.

Count-only pipelines without map steps take a fast path: a bundle is one pointer array that
the main process slices into batches. It travels as a numpy array, pickled through the
worker's pipe, which costs a tenth of moving a tensor to shared memory.
"""
from __future__ import annotations

import math
import pickle
import sys
from collections import deque
from typing import Any, Callable

import numpy as np
import torch
import torch.utils.data as tud
from torch.utils.data import IterableDataset

from zephon.runtime import (
    KEY_COMPONENT, KEY_SAMPLE_ID, SERVED, Entry, Event, LaneBook, LaneMux, LoaderStateDict, Pipeline, Segment, Tracker,
    log_once,
)
from zephon.torch._collate import collate, columnar_batch
from zephon.torch._topology import Topology, current_worker, detect_topology
from zephon.work import WorkSource

POINTER_BUNDLE = 16384  # samples per bundle on the pointer fast path
RECORD_BUNDLE = 2048  # samples per bundle when records are read


def _identity(bundle: Any) -> Any:
    return bundle


def _pin(data: Any) -> Any:
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(data)


class Bundle:
    """Several consecutive batches (or items) of one reader, with their ledger facts."""

    __slots__ = ("worker", "start", "ends", "units", "pointers", "components", "segments", "events", "last")

    def __init__(self, worker: int, start: int, segments: list[Segment], events: list[Event], last: bool):
        self.worker, self.start, self.segments, self.events, self.last = worker, start, segments, events, last
        self.ends: list[int] | None = None  # absolute position after each unit (unit path)
        self.units: list[Any] | None = None
        self.pointers: np.ndarray | torch.Tensor | None = None  # pointer fast path: (n, 3) int64
        self.components: np.ndarray | None = None  # (n,) int64 component ids

    def __getstate__(self) -> tuple:
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state: tuple) -> None:
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)

    def pin_memory(self) -> Bundle:
        if self.pointers is not None:
            self.pointers = torch.as_tensor(self.pointers).pin_memory()
        if self.units is not None:
            self.units = _pin(self.units)
        return self


class _Plan:
    """What the readers of one iteration need: set on the internal dataset before workers start."""

    def __init__(self, pipeline: Pipeline, replicas: int, lanes: dict[int, list[int]], entries: dict[int, Entry],
                 batch_size: int | None, drop_last: bool, collate_fn: Callable | None):
        self.pipeline, self.replicas, self.lanes, self.entries = pipeline, replicas, lanes, entries
        self.batch_size, self.drop_last, self.collate_fn = batch_size, drop_last, collate_fn
        self.pointer_path = pipeline.pointer_only and collate_fn is None
        self.columnar = pipeline.columnar and collate_fn is None and batch_size is not None


class _Readers(IterableDataset):
    """The internal dataset: each reader yields bundles of its lanes."""

    def __init__(self) -> None:
        self.plan: _Plan | None = None

    def __getstate__(self) -> dict:
        """Only with a "spawn" / "forkserver" worker start: the pipeline must then pickle."""
        try:
            pickle.dumps(None if self.plan is None else self.plan.pipeline)
        except Exception as error:
            raise TypeError(
                f"the pipeline cannot be pickled ({type(error).__name__}: {error}), so DataLoader workers cannot "
                "be started with multiprocessing_context='spawn' or 'forkserver'; use the 'fork' start method "
                "(the default on Linux) or a picklable work source and map functions") from error
        return dict(self.__dict__)

    def __iter__(self):
        worker, _ = current_worker()
        return _bundles(self.plan, worker)


def _bundles(plan: _Plan, worker: int):
    lanes = plan.lanes.get(worker, [])
    if not lanes:
        return
    pipeline, size = plan.pipeline, plan.batch_size
    mux = LaneMux(pipeline.source, lanes, plan.replicas, plan.entries, pipeline.vocabulary, pipeline.readahead())
    unit = size or 1
    target = max(1, (POINTER_BUNDLE if plan.pointer_path else RECORD_BUNDLE) // unit) * unit
    while True:
        start = mux.position
        pointers, components = mux.take(target)
        last = len(pointers) < target
        usable = len(pointers) // size * size if size and plan.drop_last else len(pointers)
        pointers, components = pointers[:usable], components[:usable]
        bundle = Bundle(worker, start, *mux.drain(), last)
        if plan.pointer_path:
            bundle.pointers, bundle.components = pointers, components
        else:
            bundle.units, bundle.ends = _units(plan, pointers, components, start)
        yield bundle
        if last:
            return


def _units(plan: _Plan, pointers: Any, components: Any, start: int) -> tuple[list[Any], list[int]]:
    size, n = plan.batch_size, len(pointers)
    if size is None:
        items = plan.pipeline.materialize(pointers, components)
        if plan.collate_fn is not None:
            items = [plan.collate_fn(item) for item in items]
        return items, list(range(start + 1, start + n + 1))
    cuts = list(range(0, n, size))
    ends = [start + min(a + size, n) for a in cuts]
    if plan.columnar:
        return [columnar_batch(plan.pipeline, pointers[a:a + size], components[a:a + size]) for a in cuts], ends
    items = plan.pipeline.materialize(pointers, components)
    batch = plan.collate_fn or collate
    return [batch(items[a:a + size]) for a in cuts], ends


class _Cursor:
    """The main process's place in one bundle."""

    __slots__ = ("bundle", "next", "count", "pointers", "names", "ids", "size", "length")

    def __init__(self, bundle: Bundle, pipeline: Pipeline, size: int | None):
        self.bundle, self.next, self.size = bundle, 0, size
        self.pointers: Any = None  # torch tensor of the bundle's pointers
        self.names: Any = None  # component names, one per pointer
        self.ids: Any = None  # pointers as lists (one item at a time)
        if bundle.pointers is not None:
            pointers = bundle.pointers
            if isinstance(pointers, np.ndarray):
                pointers = torch.from_numpy(pointers if pointers.flags.writeable else pointers.copy())
            self.pointers = pointers
            n = self.length = len(pointers)
            self.count = n if size is None else -(-n // size)
            assert bundle.components is not None  # bundles of pointers carry their components
            self.names = pipeline.component_names(bundle.components)
            if size is None:
                self.ids = pointers.tolist()
        else:
            assert bundle.units is not None  # a bundle holds pointers or units
            self.count = len(bundle.units)

    def take(self) -> tuple[Any, int]:
        k, bundle = self.next, self.bundle
        self.next += 1
        if bundle.units is not None:
            unit, bundle.units[k] = bundle.units[k], None
            assert bundle.ends is not None  # bundles of units carry their ends
            return unit, bundle.ends[k]
        if self.size is None:
            return {KEY_SAMPLE_ID: tuple(self.ids[k]), KEY_COMPONENT: self.names[k]}, bundle.start + k + 1
        a = k * self.size
        b = min(a + self.size, self.length)
        return {KEY_SAMPLE_ID: self.pointers[a:b], KEY_COMPONENT: self.names[a:b]}, bundle.start + b


class _LoaderIterator:
    """Yields the readers' batches round robin (reader 0, 1, …, skipping finished ones) and
    tracks, per reader, how far the training loop has consumed."""

    def __init__(self, base: Any, plan: _Plan):
        self._base = base
        self._plan = plan
        readers = [w for w, lanes in sorted(plan.lanes.items()) if lanes]
        self._trackers = {w: Tracker({lane: plan.entries[lane] for lane in plan.lanes[w]}) for w in readers}
        self._positions = dict.fromkeys(readers, 0)
        self._pending: dict[int, deque] = {w: deque() for w in readers}
        self._cursors: dict[int, _Cursor | None] = dict.fromkeys(readers)
        # resume the round robin after the readers that already gave their batch of this cycle
        served = [w for w in readers if all(plan.entries[lane][2] & SERVED for lane in plan.lanes[w])]
        first = next((k for k, w in enumerate(readers) if w not in served), 0)
        self._rotation = deque(readers[first:] + readers[:first])

    def __iter__(self) -> _LoaderIterator:
        return self

    def __next__(self) -> Any:
        while self._rotation:
            worker = self._rotation[0]
            unit = self._next_unit(worker)
            if unit is None:
                self._rotation.popleft()
                continue
            self._rotation.rotate(-1)
            return unit
        raise StopIteration

    def _next_unit(self, worker: int) -> Any:
        cursor = self._cursors[worker]
        while cursor is None or cursor.next == cursor.count:
            if cursor is not None and cursor.bundle.last:
                return None
            bundle = self._pull(worker)
            tracker = self._trackers[worker]
            tracker.fold(self._positions[worker])
            tracker.extend(bundle.segments, bundle.events)
            cursor = self._cursors[worker] = _Cursor(bundle, self._plan.pipeline, self._plan.batch_size)
        unit, self._positions[worker] = cursor.take()
        return unit

    def _pull(self, worker: int) -> Bundle:
        pending = self._pending[worker]
        while not pending:
            try:
                bundle = next(self._base)
            except StopIteration:
                raise RuntimeError(f"zephon: DataLoader worker {worker} stopped before its last batch") from None
            self._pending[bundle.worker].append(bundle)
        return pending.popleft()

    def entries(self) -> dict[int, Entry]:
        """The ledger of the rank's lanes after the last unit yielded, with both turn flags."""
        upcoming = self._rotation[0] if self._rotation else None
        out: dict[int, Entry] = {}
        for worker, tracker in self._trackers.items():
            served = SERVED if upcoming is not None and worker < upcoming else 0
            for lane, (state, consumed, flags) in tracker.entries_at(self._positions[worker]).items():
                out[lane] = (state, consumed, flags | served)
        return out


class DataLoader(tud.DataLoader):
    """A torch ``DataLoader`` over a :class:`zephon.Pipeline`, with exact and elastic checkpoints.

    ``batch_size=None`` yields items (dicts), else batches made by ``collate_fn`` (default:
    :func:`zephon.torch.collate`: ``_sample_id`` a ``(B, 3)`` int64 tensor, ``_component`` a
    list of names, other fields by torch's ``default_collate``). Each reader makes its own
    batches, as torch does for an ``IterableDataset``; ``drop_last`` drops each reader's
    last partial batch. Batches come round robin over the workers.

    Lanes: ``canonical_replicas`` of them (default: the world size when the loader first
    starts; a loaded checkpoint's value otherwise), mapped to ranks by ``mapping``
    (``"contiguous"`` or ``"interleaved"``) and a rank's lanes to its workers the same way.
    ``rank`` / ``world_size`` override the detected topology. Any other torch DataLoader
    argument passes through, except ``sampler``, ``batch_sampler`` and ``shuffle``: the
    order is the source's. On Linux, workers start by fork unless ``multiprocessing_context``
    says otherwise (a spawned worker needs a picklable pipeline).

    ``state_dict()`` is exact after every batch the loop received; ``load_state_dict``
    accepts it, or the merged global state of any topology with the same
    ``canonical_replicas``. Each ``iter(loader)`` continues where the loop stopped (the
    stream is one long epoch; its length is the source's business).
    """

    def __init__(self, pipeline: Pipeline | WorkSource, *, batch_size: int | None = None, num_workers: int = 0,
                 canonical_replicas: int | None = None, mapping: str = "contiguous", rank: int | None = None,
                 world_size: int | None = None, **dataloader_kwargs: Any):
        if isinstance(pipeline, WorkSource):
            pipeline = Pipeline(pipeline)
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"DataLoader needs a zephon.Pipeline (or a WorkSource), got {type(pipeline).__name__}")
        if batch_size is not None and (type(batch_size) is not int or batch_size < 1):
            raise ValueError(f"batch_size={batch_size!r} must be None (items) or an int >= 1")
        for name in ("sampler", "batch_sampler"):
            if dataloader_kwargs.pop(name, None) is not None:
                raise ValueError(f"{name} cannot be used with a zephon DataLoader: the sample order is the source's "
                                 "(set shuffling on the source)")
        if dataloader_kwargs.pop("shuffle", None):
            raise ValueError("shuffle=True cannot be used with a zephon DataLoader: the sample order is the "
                             "source's (set shuffle_shards / shuffle_within_shard / shuffle_block_size on it)")
        if num_workers > 0 and sys.platform.startswith("linux"):
            # workers inherit the pipeline by fork, as torch does by default on Linux before Python 3.14
            dataloader_kwargs.setdefault("multiprocessing_context", "fork")
        drop_last = dataloader_kwargs.pop("drop_last", False)
        collate_fn = dataloader_kwargs.pop("collate_fn", None)
        topology = detect_topology(rank, world_size)
        self._zephon_book = LaneBook(pipeline, canonical_replicas=canonical_replicas, mapping=mapping,
                                     rank=topology.rank, world_size=topology.world_size)
        self._zephon_topology = topology
        self._zephon_batch = (batch_size, bool(drop_last), collate_fn)
        self._zephon_live: _LoaderIterator | None = None
        super().__init__(_Readers(), batch_size=None, num_workers=num_workers, collate_fn=_identity,
                         **dataloader_kwargs)

    # torch keeps batch_size / drop_last as attributes; report the zephon ones (batching is ours)
    @property
    def batch_size(self) -> int | None:  # type: ignore[override]
        return self._zephon_batch[0]

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        pass  # torch's own (None: no torch-side batching)

    @property
    def drop_last(self) -> bool:  # type: ignore[override]
        return self._zephon_batch[1]

    @drop_last.setter
    def drop_last(self, value: Any) -> None:
        pass

    @property
    def pipeline(self) -> Pipeline:
        return self._zephon_book.pipeline

    @property
    def topology(self) -> Topology:
        return self._zephon_topology

    @property
    def canonical_replicas(self) -> int:
        return self._zephon_book.canonical_replicas

    def lanes(self) -> list[int]:
        """The lanes this rank reads."""
        return self._zephon_book.rank_lanes()

    def _readers(self) -> int:
        return max(1, self.num_workers)

    def _settle(self) -> None:
        if self._zephon_live is not None:
            self._zephon_book.update(self._zephon_live.entries())
            self._zephon_live = None

    def __iter__(self) -> _LoaderIterator:  # type: ignore[override]  # zephon's iterator wraps torch's
        self._settle()
        book = self._zephon_book
        readers = self._readers()
        lanes = {w: book.worker_lanes(w, readers) for w in range(readers)}
        idle = [w for w, owned in lanes.items() if not owned]
        if idle and len(idle) < readers:
            log_once(f"zephon: rank {book.rank} reads {len(book.rank_lanes())} lanes with {readers} DataLoader "
                     f"workers; workers {idle} have no lane and stay idle")
        batch_size, drop_last, collate_fn = self._zephon_batch
        plan = _Plan(book.pipeline, book.canonical_replicas, lanes, book.entries(), batch_size, drop_last, collate_fn)
        readers_dataset = self.dataset
        assert isinstance(readers_dataset, _Readers)
        readers_dataset.plan = plan
        if self.persistent_workers and self._iterator is not None:
            self._iterator._shutdown_workers()  # type: ignore[attr-defined]  # workers must start anew
            self._iterator = None
        live = _LoaderIterator(super().__iter__(), plan)
        self._zephon_live = live
        return live

    def __len__(self) -> int:
        """Batches (or items) still to come from the loader's position; needs a finite source
        that can count its remaining samples (``remaining_samples()``)."""
        book = self._zephon_book
        entries = self._zephon_live.entries() if self._zephon_live is not None else book.entries()
        template = book.pipeline.source
        batch_size, drop_last, _ = self._zephon_batch
        total = 0
        readers = self._readers()
        for worker in range(readers):
            samples = 0
            for lane in book.worker_lanes(worker, readers):
                state, consumed, _ = entries[lane]
                source = template.clone_for_lane(lane, book.canonical_replicas)
                if not hasattr(source, "remaining_samples"):
                    raise TypeError(f"{type(template).__name__} cannot count its remaining samples, so this "
                                    "DataLoader has no length")
                source.load_state_dict(state)
                samples += source.remaining_samples() - consumed
            if batch_size is None:
                total += samples
            else:
                total += samples // batch_size if drop_last else math.ceil(samples / batch_size)
        return total

    def state_dict(self) -> LoaderStateDict:
        """Where this rank's lanes stand after the last batch received (JSON; size ∝ lanes)."""
        book = self._zephon_book
        entries = self._zephon_live.entries() if self._zephon_live is not None else book.entries()
        return book.state(entries, num_workers=self.num_workers)

    def check_state_dict(self, state: Any) -> None:
        """Raise ``ValueError`` unless ``state`` restores into this loader (nothing changes)."""
        self._zephon_book.check(state)

    def load_state_dict(self, state: Any) -> None:
        """Resume from ``state``: this rank's state, or a merged global state of any earlier
        topology with the same ``canonical_replicas``. Checks everything before changing anything.
        An iterator already running keeps going but no longer moves the loader's position."""
        self._zephon_book.load(state)
        self._zephon_live = None
