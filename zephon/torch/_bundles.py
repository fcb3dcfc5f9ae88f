"""The worker side of zephon.torch.DataLoader: what each reader produces, in bundles of batches.

Each reader (a DataLoader worker, or the main process with ``num_workers=0``) reads its lanes
round robin a batch at a time (``zephon.runtime.LaneMux`` with a turn of ``batch_size``
samples), so each batch is ``batch_size`` consecutive samples of one lane (a lane's last batch
may be shorter), and sends them in *bundles* of several batches, each bundle carrying the few
facts its ledger needs (lane rotations and chunk starts, by position). The trainer
reassembles them (``zephon.torch._iterator``).

Count-only pipelines without map steps take a fast path: a bundle is one pointer array that
the main process splits into batches at the bundle's ``bounds`` (and counts a bundle's
components once, not per batch). From a worker it travels in a shared-memory slot
(``zephon.torch._slots``), the bundle carrying only the slot's number, and its batches are
views of that slot. Packed batches' ``(B, seq_len)`` arrays travel in slots the same way.

A :class:`Readers` dataset and its :class:`Plan` travel to workers started by "spawn" or
"forkserver" by pickle, and every :class:`Bundle` comes back by pickle. The tensors of the
batches a worker made cross as numpy arrays pickled as bytes (``ship``, undone by ``land`` in
the main process): torch's shared-memory hand-off costs about a millisecond per tensor, which
for batch-sized tensors is more than the batch. Columnar batches' strings cross as their
bytes (``zephon.torch._collate.Strings``), in a shared slot when one is free (the pipe cost the
trainer a fifth of its time), and become Python strings in ``land`` too, in every reader:
pickling each string costs a worker as much as reading it.
"""
from __future__ import annotations

import copy
import functools
import logging
import os
import pickle
import sys
import threading
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping, MutableMapping

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon.io import PieceStore, UnevenRecordsError, fetch_rows
from zephon.runtime import (
    DROPPED, KEY_COMPONENT, KEY_SAMPLE_ID, Entry, Event, LaneMux, Pipeline, Segment, Snapshot, component_counts,
    paused_gc,
)
from zephon.torch._collate import Strings, collate_rows, columnar_batches, gathered_columns
from zephon.torch._packed import packed_bundles, units_per_bundle
from zephon.torch._slots import ALIGN, Slots, stow, take, unstow
from zephon.torch._topology import current_worker
from zephon.torch._workers import freeze_inherited, guard_worker, pick_arrow_pool

POINTER_BUNDLE = 16384  # samples per bundle on the pointer fast path (they stay in cache as the trainer splits them)
HERE_BUNDLE = 262144  # ... of batches, by a reader in the main process (as a slot; interleaved runs: 1.06x of 131072)
SLOT_BUNDLE = 262144  # samples per shared-memory slot: fewer bundles, each with its fixed cost to the trainer (7 MiB;
# interleaved runs with 2 workers: 1.1x the rate of 131072, the trainer's CPU 3.0-3.1 against 3.5-3.6 us a batch)
BUNDLE_CHUNKS = 256  # chunks' samples a bundle or slot holds at most: a source of small chunks makes the first
# bundle in milliseconds (chunk_size=1: 17 s for 262,144 samples without workers, 21 s with 2)
PIPE_BYTES = 1 << 20  # the workers' result pipe, widened to this (Linux's default ceiling for a user)
SHIP_BYTES = 256 << 10  # tensors up to this size cross from workers as numpy arrays (``ship``)
RECORD_BUNDLE = 2048  # samples per bundle when records are read
COLUMNAR_BUNDLE = 16384  # samples per bundle of columnar batches at most (a fetch's fixed costs spread thin) ...
HERE_COLUMNAR = 65536  # ... by a reader in the main process, whose fetch threads bound the rate (paired runs: 1.1x)
FETCHES = 2  # bundles a reader in the main process has fetching while it hands one out (6 interleaved pairs:
# 1.1-1.2x the rate of 1, the fetch cache loading a row group that both want once; 3: 0.9x of 2)
COLUMNAR_BYTES = 32 << 20  # ... and about this many bytes of their rows, at the row groups' bytes per row (the
# row groups themselves are the fetch cache's: a bundle holds those its rows are in while it is made)
COLUMNAR_SLOT = 8 << 20  # bytes of a shared slot for a columnar bundle's strings (larger ones take the pipe)
PACKED_ARRAYS = 3  # a packed batch's (B, seq_len) int64 arrays: input_ids, segment_ids, position_ids
PACKED_BYTES = PACKED_ARRAYS * 8  # slot bytes per packed token
log = logging.getLogger("zephon")


def _pin(data: Any) -> Any:
    """``data`` with its CPU tensors in pinned memory, through mappings, lists and tuples (as a
    collate makes batches); anything else with a ``pin_memory()`` method is asked to pin itself."""
    if isinstance(data, torch.Tensor):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        pinned = {key: _pin(value) for key, value in data.items()}
        if isinstance(data, MutableMapping):  # keep the mapping's own type (a UserDict, a BatchEncoding)
            clone = copy.copy(data)
            clone.update(pinned)
            return clone
        return pinned
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        return type(data)(*(_pin(value) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_pin(value) for value in data)
    if hasattr(data, "pin_memory"):
        return data.pin_memory()
    return data


class Bundle:
    """Several consecutive batches (or items) of one reader, with their ledger facts."""

    __slots__ = ("worker", "start", "stop", "ends", "units", "pointers", "components", "bounds",
                 "segments", "events", "last", "dropped", "skipped", "shipped", "lazy", "slot", "tokens",
                 "tokens_dropped", "filtered_left", "counts")

    def __init__(self, worker: int, start: int, segments: list[Segment], events: list[Event] | list[Snapshot],
                 last: bool):
        self.worker, self.start, self.segments, self.events, self.last = worker, start, segments, events, last
        self.ends: list[int] | None = None  # absolute position after each unit (batches)
        self.units: list[Any] | None = None
        self.pointers: np.ndarray | torch.Tensor | None = None  # pointer fast path: (n, 3) int64
        self.components: np.ndarray | None = None  # component ids of the units' samples, back to back
        self.bounds: list[int] | None = None  # unit k holds samples [bounds[k], bounds[k+1]); None: one per unit
        self.stop = start  # absolute position after the bundle's last sample
        self.skipped: list[int] | None = None  # batches: samples drop_last dropped that each passes over (None: none)
        self.shipped = False  # the units hold what ``land`` makes the batches of (tensors as numpy, strings as bytes)
        self.lazy = False  # shipped units are landed as each is handed out (no shared slot waits for them)
        self.dropped: list[int] | None = None  # batches of records: items a filter dropped from each
        self.slot: tuple[int, int, int] | None = None  # from a worker: where its pointers or units' arrays wait
        self.tokens: np.ndarray | None = None  # packed, per unit: real tokens per component id, padding, tokens dropped
        self.tokens_dropped = 0  # packed, a bundle without units: tokens pack(final="drop") dropped at lanes' ends
        self.filtered_left = 0  # packed, a bundle without units: documents filter steps dropped
        self.counts: np.ndarray | None = None  # pointer fast path: samples per component id, counted by the reader

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(_Wire(v) if type(v) is np.ndarray else v for v in (getattr(self, k) for k in self.__slots__))

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v.array if type(v) is _Wire else v)

    def land(self) -> Bundle:
        """In the main process: the pointers, or the units' stowed arrays, as tensors over their
        shared slot, and the units' other tensors back from their trip as numpy arrays (a
        ``lazy`` bundle's units stay shipped: each is landed as it is handed out)."""
        if self.slot is not None and self.units is not None:
            self.units = unstow(self.worker, self.slot, self.units)
        elif self.slot is not None:
            self.pointers, self.components = take(self.worker, self.slot)
        self.slot = None
        if self.shipped and not self.lazy:
            if self.units is not None:
                self.units = [land(unit) for unit in self.units]
            self.shipped = False
        return self

    def pin_memory(self) -> Bundle:
        self.lazy = False  # pinned whole, so landed whole
        self.land()
        if self.pointers is not None:  # the batches are views of this tensor
            self.pointers = pointer_tensor(self.pointers).pin_memory()
        if self.units is not None:
            self.units = _pin(self.units)
        return self


class Plan:
    """What the readers of one iteration need: set on the internal dataset before workers start."""

    def __init__(self, pipeline: Pipeline, replicas: int, lanes: dict[int, list[int]], entries: dict[int, Entry],
                 batch_size: int | None, drop_last: bool, collate_fn: Callable[[Any], Any] | None,
                 cache_bytes: int | None, operators: dict[int, Any] | None = None):
        self.pipeline, self.replicas, self.lanes, self.entries = pipeline, replicas, lanes, entries
        self.operators = operators or {}  # a packed pipeline's lane -> operator state
        self.cache_bytes = cache_bytes  # each reader's fetch cache bound per dataset (DataLoader's cache_bytes)
        self.batch_size, self.drop_last, self.collate_fn = batch_size, drop_last, collate_fn
        self.pointer_path = pipeline.pointer_only and collate_fn is None
        self.columnar = pipeline.columnar and collate_fn is None and batch_size is not None
        self.trainer = os.getpid()  # the process the workers must not outlive
        chunk_size = pipeline.source.chunk_size_hint()
        self.most_samples = None if chunk_size is None else BUNDLE_CHUNKS * chunk_size  # a bundle's, a slot's
        self.bundle_size = self._whole_units(POINTER_BUNDLE if self.pointer_path else RECORD_BUNDLE)  # samples
        self.columnar_bundle = COLUMNAR_BUNDLE  # the most samples of a columnar bundle (see fit_bundles)
        self.slots: Slots | None = None  # set when workers send bundles through shared memory
        self.pieces: PieceStore | None = None  # the workers' store of decoded pieces (share_pieces)
        self.main_thread = threading.current_thread() is threading.main_thread()  # where workers start
        self.arrow_pool = pa.default_memory_pool().backend_name  # the trainer's (see pick_arrow_pool)

    def _whole_units(self, samples: int) -> int:
        """About ``samples`` (at most ``most_samples``), in whole batches (at least one)."""
        unit = self.batch_size or 1
        return max(1, min(samples, self.most_samples or samples) // unit) * unit

    def read_here(self) -> None:
        """Size the bundles of a reader in the main process (``num_workers=0``): no pipe or slot
        to keep flowing (a worker's bundle takes the pipe when no shared slot is free), so a
        bundle of pointer batches is as large as a slot's and one of columnar batches up to
        :data:`HERE_COLUMNAR` samples, each bundle's fixed costs spread thinner."""
        if self.pointer_path and self.batch_size is not None:
            self.bundle_size = self._whole_units(HERE_BUNDLE)
        self.columnar_bundle = HERE_COLUMNAR

    def fit_bundles(self, row_bytes: float) -> None:
        """Size this reader's next columnar bundles for rows of ``row_bytes`` bytes each: at most
        ``columnar_bundle`` samples and about :data:`COLUMNAR_BYTES` of their row groups."""
        cap = min(self.columnar_bundle, COLUMNAR_BYTES // max(row_bytes, 1.0))
        self.bundle_size = self._whole_units(int(cap))

    def share_memory(self, readers: int, count: int, context: Any) -> None:
        """Send bundles from forked workers through ``count`` shared-memory slots per reader:
        pointer bundles, columnar batches' strings or packed batches (without a ``collate_fn``);
        others take the pipe."""
        packing = self.pipeline.packing
        if self.pointer_path:
            self.slots = Slots.for_pointers(readers, self._whole_units(SLOT_BUNDLE), count, context)
        elif self.columnar:
            self.slots = Slots(readers, COLUMNAR_SLOT, count, context)
        elif packing is not None and self.batch_size is not None and self.collate_fn is None:
            units = units_per_bundle(self.batch_size, packing.pack.seq_len)
            width = units * (self.batch_size * packing.pack.seq_len * PACKED_BYTES + PACKED_ARRAYS * ALIGN)
            self.slots = Slots(readers, width, count, context)

    def share_pieces(self, readers: int) -> None:
        """Give ``readers`` worker processes one store of decoded pieces (``zephon.io._shared``)
        when some dataset decodes its pieces (Parquet row groups): each row group is then decoded
        once for all of them. :meth:`close_pieces` removes it (at the latest when the plan goes)."""
        readers_of = (getattr(d, "reader", None) for d in self.pipeline.datasets_by_id.values())
        if readers < 2 or not any(r is not None and r.decodes and r.columnar for r in readers_of):
            return
        store = PieceStore.make(readers, self.cache_bytes)
        if store is None:
            return
        self.pieces, self._remove_store = store, weakref.finalize(self, store.remove)
        log.debug("zephon: %d DataLoader workers share the row groups they decode through %s (up to %d bytes)",
                  readers, store.directory, store.max_bytes)

    def piece_counts(self) -> dict[str, int]:
        """The counters of the workers' store of decoded pieces ({} without one, or once removed)."""
        return self.pieces.counts() if self.pieces is not None and self._remove_store.alive else {}

    def close_pieces(self) -> dict[str, int]:
        """At the iteration's end: say what the workers' store of decoded pieces saved, and
        remove it (a worker still reading then decodes on its own). Its counters, the first
        time ({} after, or without a store)."""
        counts = self.piece_counts()
        if counts:
            log.debug("zephon: DataLoader workers decoded %d row groups, read %d more from each other's, and kept %d "
                      "unshared", counts["published"] + counts["unshared"], counts["shared"], counts["unshared"])
        if self.pieces is not None:
            self._remove_store()
        return counts

    def __getstate__(self) -> dict[str, Any]:
        """For workers started by "spawn" or "forkserver": without the trainer's hold on the store."""
        state = dict(self.__dict__)
        state.pop("_remove_store", None)
        return state


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
            freeze_inherited()
            pick_arrow_pool(self.plan.arrow_pool)
        return bundles(self.plan, worker)


def bundles(plan: Plan, worker: int) -> Iterator[Bundle]:
    """The bundles of reader ``worker``'s lanes, from their ledger entries to the end; the last
    is marked ``last`` (none at all for a reader without lanes)."""
    lanes = plan.lanes.get(worker, [])
    if not lanes:
        return
    pipeline, size = plan.pipeline, plan.batch_size
    releases = [follow(len(lanes), plan.cache_bytes) for follow in  # zephon.io datasets: the cache follows the lanes
                (getattr(d, "cache_for_lanes", None) for d in pipeline.datasets_by_id.values()) if follow is not None]
    in_worker = get_worker_info() is not None
    slots = plan.slots if in_worker else None
    if in_worker and plan.pieces is not None:
        releases += _share_pieces(pipeline, plan.pieces, worker)
    if not in_worker:
        plan.read_here()
    if pipeline.packing is not None:
        made: Iterator[Bundle] = packed_bundles(plan, worker, lanes, Bundle)
    else:
        mux = LaneMux(pipeline.source, lanes, plan.replicas, plan.entries, pipeline.vocabulary, pipeline.readahead(),
                      unit=size or 1)
        made = (_columnar_bundles(mux, plan, worker, not in_worker) if plan.columnar
                else iter(lambda: _next_bundle(mux, plan, worker, slots), None))
    try:
        for bundle in made:
            if in_worker and bundle.units is not None:
                if slots is not None:  # a columnar batch's strings only: its small tensors take the pipe
                    bundle.slot = stow(slots, worker, bundle.units, tensors=not plan.columnar)
                bundle.units, bundle.shipped = [ship(unit) for unit in bundle.units], True
            yield bundle
            if bundle.last:
                return
    finally:
        close = getattr(made, "close", None)
        if close is not None:
            close()  # its fetches end before the cache's bound does
        for release in releases:
            release()


def _share_pieces(pipeline: Pipeline, pieces: PieceStore, worker: int) -> list[Callable[[], None]]:
    """In a worker: its datasets take decoded pieces from the workers' store (the releases)."""
    try:
        store = pieces.open(worker)
    except (OSError, ValueError) as error:  # the trainer removed it (its iteration ended), or no row for it
        log.debug("zephon: DataLoader worker %d decodes on its own (the store %s: %s)", worker, pieces.directory,
                  error)
        return []
    return [d.share_pieces(store) for d in pipeline.datasets_by_id.values() if hasattr(d, "share_pieces")]


def _next_bundle(mux: LaneMux, plan: Plan, worker: int, slots: Slots | None) -> Bundle:
    """The reader's next bundle: into a free shared slot when there is one (pointers from a
    forked worker), else ``plan.bundle_size`` samples in the bundle itself."""
    slot = None if slots is None else slots.claim(worker)
    if slots is not None:
        return _slot_bundle(mux, plan, worker, slots, slot) if slot is not None else _piped(mux, plan, worker, slots)
    bundle, pointers, components = _taken(mux, plan, worker)
    if plan.pointer_path:
        bundle.pointers, bundle.components = pointers, components
        bundle.counts = component_counts(components, plan.pipeline.kinds)
        return bundle
    with paused_gc():  # a bundle's records: thousands of short-lived dicts the collector would walk again and again
        if plan.batch_size is None:
            _items(bundle, plan, pointers, components)
        else:
            _batches(bundle, plan, pointers, components)
    return bundle


def _taken(mux: LaneMux, plan: Plan, worker: int) -> tuple[Bundle, np.ndarray, np.ndarray]:
    """The reader's next ``plan.bundle_size`` samples: their bundle, framed, and the pointers and
    component ids of the rows its batches keep."""
    start, size = mux.position, plan.bundle_size
    into = np.empty((size, 3), dtype=np.int64), np.empty(size, dtype=np.int64)
    n, turns = mux.take_into(into, 0, size)
    bundle, keep = _framed(mux, plan, worker, start, n, turns)
    pointers, components = into[0][:n], into[1][:n]
    if keep is not None:
        pointers, components = pointers[keep], components[keep]
    return bundle, pointers, components


def _columnar_bundles(mux: LaneMux, plan: Plan, worker: int, background: bool) -> Iterator[Bundle]:
    """The reader's bundles of columnar batches. With ``background`` (a reader in the main
    process, beside which a core is free) each bundle's rows are fetched (read and decoded,
    ``zephon.io.fetch_rows``) and gathered column by column (:func:`_fetch_columns`) in a
    thread, :data:`FETCHES` bundles at once while the one before them is made into batches; a
    DataLoader worker fetches in line (the workers run in parallel already: on two cores, a
    thread more in each of two workers gained nothing measurable)."""
    pipeline = plan.pipeline
    fetcher = ThreadPoolExecutor(FETCHES, thread_name_prefix="zephon-fetch") if background else None
    ahead = FETCHES if background else 0  # bundles taken and fetching beyond the one in hand
    finalizing = sys.is_finalizing  # held here: at exit this module's globals may be gone before the generator

    def take() -> tuple[Bundle, np.ndarray, np.ndarray, Callable[[], tuple[dict[str, Any] | str, float]]]:
        bundle, pointers, components = _taken(mux, plan, worker)
        fetch = functools.partial(_fetch_columns, pipeline, pointers)
        return bundle, pointers, components, fetch if fetcher is None else fetcher.submit(fetch).result

    pending: deque[tuple[Bundle, np.ndarray, np.ndarray, Callable[[], tuple[dict[str, Any] | str, float]]]] = deque()
    said = False  # whether this reader logged that it collates some bundles from their records
    error: Exception | None = None  # taking a bundle failed: raised once those taken before it are handed on
    try:
        while True:
            if not pending:
                pending.append(take())
            bundle, pointers, components, fetched = pending.popleft()
            while error is None and len(pending) < ahead and not (pending[-1][0] if pending else bundle).last:
                try:
                    pending.append(take())
                except Exception as taking:  # noqa: BLE001 - raised once the bundles before it are handed on
                    error = taking
            columns, row_bytes = fetched()
            assert bundle.bounds is not None  # _framed cut the samples into batches
            if isinstance(columns, str):  # records a table cannot hold as they are: collated, as a map step's are
                if not said:
                    said = True
                    log.info("zephon: batches of records one table cannot hold as they are are collated from the "
                             "records, which is slower than reading columns (%s)", columns)
                with paused_gc():
                    _batches(bundle, plan, pointers, components)
            else:
                bundle.units = columnar_batches(pipeline, columns, pointers, components, bundle.bounds)
            del columns  # the batches hold their rows: none stay here while the next fetch is awaited
            # their strings are made by land(): in this process, a batch at a time as it is handed out (made a
            # bundle at once, the garbage collector swept the bundle's lists again and again)
            bundle.components, bundle.shipped, bundle.lazy = components, True, fetcher is not None
            plan.fit_bundles(row_bytes)
            yield bundle
            if bundle.last:
                return
            if error is not None and not pending:
                raise error
    finally:
        if fetcher is not None and not finalizing():  # at exit, Python has joined its threads already
            fetcher.shutdown(cancel_futures=True)  # after the fetches in progress, if any


def _fetch_columns(pipeline: Pipeline, pointers: np.ndarray) -> tuple[dict[str, Any] | str, float]:
    """The rows of ``pointers``, read (``zephon.io.fetch_rows``) and gathered column by column
    (``zephon.torch._collate.gathered_columns``), and the decoded bytes per row of the row
    groups they lie in; in place of the columns, why not, where the rows' table would not be
    their records (``zephon.io.UnevenRecordsError``: JSONL records whose fields or value types
    differ): their batches are then collated from the records."""
    try:
        table, rows = fetch_rows(pipeline.datasets_by_id, pointers, pipeline.columns, exact=True)
    except UnevenRecordsError as error:
        return str(error), 0.0
    return gathered_columns(table, rows), table.get_total_buffer_size() / max(table.num_rows, 1)


def _slot_bundle(mux: LaneMux, plan: Plan, worker: int, slots: Slots, slot: int) -> Bundle:
    """A bundle of pointers written into the claimed ``slot``, which it carries in their place."""
    start = mux.position
    n, turns = _fill(mux, slots, worker, slot, plan.bundle_size)
    bundle, keep = _framed(mux, plan, worker, start, n, turns)
    if keep is not None:
        slots.compact(worker, slot, n, keep)
    bundle.slot = slots.carried(slot, n if keep is None else len(keep))
    bundle.counts = component_counts(slots.views(worker, slot, bundle.slot[2])[1], plan.pipeline.kinds)
    return bundle


def _piped(mux: LaneMux, plan: Plan, worker: int, slots: Slots) -> Bundle:
    """Every slot is still leased: this bundle goes through the pipe."""
    slots.say_piped(worker)
    return _next_bundle(mux, plan, worker, None)


def _framed(mux: LaneMux, plan: Plan, worker: int, start: int, n: int, turns: np.ndarray
            ) -> tuple[Bundle, np.ndarray | None]:
    """The bundle of the ``n`` samples just taken from position ``start`` (in ``turns``), with
    its ledger facts; batched, also its batches' ends and ``bounds`` (one batch per turn;
    ``drop_last`` drops the short ones) and the rows the kept batches hold (None: all)."""
    bundle = Bundle(worker, start, *mux.drain(), mux.exhausted)
    bundle.stop = start + n
    if plan.batch_size is None:
        return bundle, None
    ends = np.cumsum(turns)
    begins = ends - turns
    if plan.drop_last:
        full = turns == plan.batch_size
        begins, ends = begins[full], ends[full]
    sizes = ends - begins
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    bundle.bounds = bounds.tolist()
    bundle.ends = (ends + start).tolist()
    if len(begins) == len(turns):
        return bundle, None
    if bundle.ends:  # the last batch passes over the rest of the bundle, which drop_last dropped
        bundle.ends[-1] = start + n
    skipped = begins - np.concatenate([[0], ends[:-1]])
    if len(skipped):
        skipped[-1] += n - ends[-1]
    bundle.skipped = skipped.tolist()
    return bundle, np.arange(bounds[-1], dtype=np.int64) + np.repeat(begins - bounds[:-1], sizes)


def _fill(mux: LaneMux, slots: Slots, worker: int, slot: int, part: int) -> tuple[int, np.ndarray]:
    """Fill a claimed slot from ``mux``, ``part`` samples at a time (the parts' arrays stay in
    cache, a whole slot's would not): the samples written and the turns they hold."""
    n, turns, unit, into = 0, [], mux.unit, slots.views(worker, slot)
    while slots.capacity - n >= unit:
        k, part_turns = mux.take_into(into, n, min(part, (slots.capacity - n) // unit * unit))
        n += k
        turns.append(part_turns)
        if mux.exhausted:
            break
    return n, np.concatenate(turns)


def _items(bundle: Bundle, plan: Plan, pointers: np.ndarray, components: np.ndarray) -> None:
    """An unbatched bundle of records: one unit per sample."""
    start, n = bundle.start, len(pointers)
    items = plan.pipeline.materialize(pointers, components)
    if plan.collate_fn is not None:
        items = [plan.collate_fn(item) for item in items]
    bundle.units, bundle.ends, bundle.components = items, list(range(start + 1, start + n + 1)), components


def _batches(bundle: Bundle, plan: Plan, pointers: np.ndarray, components: np.ndarray) -> None:
    """A reader's batches of these samples, the component ids of what each holds (at the
    bundle's ``bounds``, set anew) and, with filter steps, the items a filter dropped from each."""
    assert bundle.bounds is not None  # _framed cut the samples into batches
    spans = list(zip(bundle.bounds[:-1], bundle.bounds[1:]))
    marked = plan.pipeline.materialize_marked(pointers, components)
    alive = np.fromiter((item is not DROPPED for item in marked), dtype=bool, count=len(marked))
    units, kept, bounds, dropped = [], [], [0], []
    for a, b in spans:
        keep = a + np.flatnonzero(alive[a:b])
        items = marked[a:b] if len(keep) == b - a else [marked[k] for k in keep.tolist()]
        if plan.collate_fn is not None:
            units.append(plan.collate_fn(items))
        else:
            units.append(collate_rows(items, pointers[keep]) if items else _empty_batch())
        kept.append(keep)
        bounds.append(bounds[-1] + len(keep))
        dropped.append(b - a - len(keep))
    taken = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    bundle.units, bundle.components, bundle.bounds, bundle.dropped = units, components[taken], bounds, dropped


def widen_pipe(base: Any) -> None:
    """Widen the pipe that brings bundles from the workers of torch iterator ``base`` to
    :data:`PIPE_BYTES` (Linux): at the default 64 KiB a bundle crosses in several pieces, each
    waiting for the reader, which halves the rate. Where the system refuses, it stays as it is."""
    try:
        import fcntl  # not on Windows
    except ImportError:
        return
    reader = getattr(getattr(base, "_worker_result_queue", None), "_reader", None)  # torch's, and multiprocessing's
    if reader is None or not hasattr(fcntl, "F_SETPIPE_SZ"):
        log.debug("zephon: the DataLoader's result pipe keeps its size (no pipe found to widen)")
        return
    try:
        fcntl.fcntl(reader.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except OSError as error:
        log.debug("zephon: the DataLoader's result pipe keeps its size (%s)", error)


def pointer_tensor(pointers: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Pointers as a tensor the training step may change (a chunk's own arrays are read-only)."""
    if isinstance(pointers, np.ndarray):
        return torch.from_numpy(pointers if pointers.flags.writeable else pointers.copy())
    return pointers


class _Wire:
    """A numeric numpy array on its way from a worker, pickled as its bytes: under pickle
    protocol 4 (what multiprocessing queues use) that takes half the time of pickling the
    array. ``array`` is read-only on arrival."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return _arrive, (type(self), self.array.tobytes(), self.array.dtype.str, self.array.shape)


class _Shipped(_Wire):
    """A CPU tensor on its way from a worker (as a numpy array, see :class:`_Wire`)."""

    __slots__ = ()


def _arrive(kind: type[_Wire], data: bytes, dtype: str, shape: tuple[int, ...]) -> _Wire:
    return kind(np.frombuffer(data, dtype=dtype).reshape(shape))


def ship(value: Any) -> Any:
    """``value`` with its small dense CPU tensors (in dicts, tuples and lists, as collate makes
    them) as :class:`_Shipped`; large ones keep torch's shared memory, which is faster for them."""
    if type(value) is torch.Tensor:
        shippable = (value.device.type == "cpu" and value.layout == torch.strided and value.dtype in _NUMPY_DTYPES
                     and not value.requires_grad and not value.is_conj() and not value.is_neg()
                     and value.nbytes <= SHIP_BYTES)
        return _Shipped(value.numpy()) if shippable else value
    if type(value) is dict:
        return {key: ship(item) for key, item in value.items()}
    if type(value) in (tuple, list) and value and type(value[0]) in _CARRIERS:
        return type(value)(ship(item) for item in value)
    return value


def land(value: Any) -> Any:
    """The inverse of :func:`ship`; a column of :class:`Strings` becomes its list."""
    if type(value) is _Shipped:
        return torch.from_numpy(value.array.copy())  # writable: the training step may change it
    if type(value) is Strings:
        return value.values()
    if type(value) is dict:
        return {key: land(item) for key, item in value.items()}
    if type(value) in (tuple, list) and value and type(value[0]) in _CARRIERS:
        return type(value)(land(item) for item in value)
    return value


_CARRIERS = (torch.Tensor, _Shipped, dict, tuple, list)  # a tuple or list starting with one of these is looked into
_NUMPY_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.float32, torch.float64, torch.complex64, torch.complex128}


def _empty_batch() -> dict[str, Any]:
    """The default batch of a cut whose every item a filter dropped."""
    return {KEY_SAMPLE_ID: torch.zeros((0, 3), dtype=torch.int64), KEY_COMPONENT: []}

