"""The worker side of zephon.torch.DataLoader: what each reader produces, in bundles of batches.

Each reader (a DataLoader worker, or the main process with ``num_workers=0``) reads its lanes
round robin (``zephon.runtime.LaneMux``), cuts the stream into batches of ``batch_size`` (or
items), and sends them in *bundles* of several batches, each bundle carrying the few facts
its ledger needs (lane rotations and chunk starts, by position). The trainer reassembles
them (``zephon.torch._iterator``).

Count-only pipelines without map steps take a fast path: a bundle is one pointer array that
the main process slices into batches. It travels as a numpy array, pickled through the
worker's pipe, which costs a tenth of moving a tensor to shared memory.

A :class:`Readers` dataset and its :class:`Plan` travel to workers started by "spawn" or
"forkserver" by pickle, and every :class:`Bundle` comes back by pickle.
"""
from __future__ import annotations

import os
import pickle
import threading
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon.runtime import DROPPED, KEY_COMPONENT, KEY_SAMPLE_ID, Entry, Event, LaneMux, Pipeline, Segment
from zephon.torch._collate import collate, columnar_batch
from zephon.torch._topology import current_worker
from zephon.torch._workers import guard_worker

POINTER_BUNDLE = 16384  # samples per bundle on the pointer fast path
RECORD_BUNDLE = 2048  # samples per bundle when records are read


def _pin(data: Any) -> Any:
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(data)  # type: ignore[no-untyped-call]  # torch leaves its pin_memory unannotated


class Bundle:
    """Several consecutive batches (or items) of one reader, with their ledger facts."""

    __slots__ = ("worker", "start", "ends", "units", "pointers", "components", "segments", "events", "last",
                 "tally", "dropped")

    def __init__(self, worker: int, start: int, segments: list[Segment], events: list[Event], last: bool):
        self.worker, self.start, self.segments, self.events, self.last = worker, start, segments, events, last
        self.ends: list[int] | None = None  # absolute position after each unit (unit path)
        self.units: list[Any] | None = None
        self.pointers: np.ndarray | torch.Tensor | None = None  # pointer fast path: (n, 3) int64
        self.components: np.ndarray | None = None  # (n,) int64 component ids
        self.tally: list[np.ndarray] | None = None  # unit path: component ids of each unit's items
        self.dropped: list[int] | None = None  # unit path: items a filter dropped in each unit

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)

    def pin_memory(self) -> Bundle:
        if self.pointers is not None:
            self.pointers = torch.as_tensor(self.pointers).pin_memory()
        if self.units is not None:
            self.units = _pin(self.units)
        return self


class Plan:
    """What the readers of one iteration need: set on the internal dataset before workers start."""

    def __init__(self, pipeline: Pipeline, replicas: int, lanes: dict[int, list[int]], entries: dict[int, Entry],
                 batch_size: int | None, drop_last: bool, collate_fn: Callable[[Any], Any] | None):
        self.pipeline, self.replicas, self.lanes, self.entries = pipeline, replicas, lanes, entries
        self.batch_size, self.drop_last, self.collate_fn = batch_size, drop_last, collate_fn
        self.pointer_path = pipeline.pointer_only and collate_fn is None
        self.columnar = pipeline.columnar and collate_fn is None and batch_size is not None
        self.trainer = os.getpid()  # the process the workers must not outlive
        self.main_thread = threading.current_thread() is threading.main_thread()  # where workers start


class Readers(IterableDataset[Bundle]):
    """The internal dataset: each reader yields bundles of its lanes."""

    def __init__(self) -> None:
        self.plan: Plan | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Only with a "spawn" / "forkserver" worker start: the pipeline must then pickle."""
        try:
            pickle.dumps(None if self.plan is None else self.plan.pipeline)
        except Exception as error:
            raise TypeError(
                f"the pipeline cannot be pickled ({type(error).__name__}: {error}), so DataLoader workers cannot "
                "be started with multiprocessing_context='spawn' or 'forkserver'; use the 'fork' start method "
                "(the default on Linux) or a picklable work source and map functions") from error
        return dict(self.__dict__)

    def __iter__(self) -> Iterator[Bundle]:
        assert self.plan is not None  # set by the DataLoader before its workers start
        worker, _ = current_worker()
        if get_worker_info() is not None:
            guard_worker(self.plan.trainer, self.plan.main_thread)
        return bundles(self.plan, worker)


def bundles(plan: Plan, worker: int) -> Iterator[Bundle]:
    """The bundles of reader ``worker``'s lanes, from their ledger entries to the end; the last
    is marked ``last`` (none at all for a reader without lanes)."""
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
            bundle.units, bundle.ends, bundle.tally, bundle.dropped = _units(plan, pointers, components, start)
        yield bundle
        if last:
            return


def _units(plan: Plan, pointers: np.ndarray, components: np.ndarray,
           start: int) -> tuple[list[Any], list[int], list[np.ndarray], list[int]]:
    """A reader's batches (or items) of these samples, with the position after each, the
    component ids each carries and the items a filter dropped from each."""
    size, n = plan.batch_size, len(pointers)
    if size is None:  # items (a filter step needs a batch_size, see DataLoader)
        items = plan.pipeline.materialize(pointers, components)
        if plan.collate_fn is not None:
            items = [plan.collate_fn(item) for item in items]
        return items, list(range(start + 1, start + n + 1)), [components[k:k + 1] for k in range(n)], [0] * n
    cuts = list(range(0, n, size))
    ends = [start + min(a + size, n) for a in cuts]
    if plan.columnar:
        units = [columnar_batch(plan.pipeline, pointers[a:a + size], components[a:a + size]) for a in cuts]
        return units, ends, [components[a:a + size] for a in cuts], [0] * len(cuts)
    marked = plan.pipeline.materialize_marked(pointers, components)
    batch = plan.collate_fn or collate
    units, tally, dropped = [], [], []
    for a in cuts:
        kept = [k for k in range(a, min(a + size, n)) if marked[k] is not DROPPED]
        items = [marked[k] for k in kept]
        units.append(batch(items) if items or plan.collate_fn else _empty_batch())
        tally.append(components[kept])
        dropped.append(min(size, n - a) - len(kept))
    return units, ends, tally, dropped


def _empty_batch() -> dict[str, Any]:
    """The default batch of a cut whose every item a filter dropped."""
    return {KEY_SAMPLE_ID: torch.zeros((0, 3), dtype=torch.int64), KEY_COMPONENT: []}

