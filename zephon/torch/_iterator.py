"""The trainer side of zephon.torch.DataLoader: the readers' bundles reassembled into batches.

The main process unpacks the bundles the readers send (``zephon.torch._bundles``) and yields
their batches round robin over the readers, like a plain torch DataLoader; after every batch
it knows each reader's position, so the loader's ``state_dict()`` is exact for what the
training loop has received, whatever was prefetched.

With ``even_batches`` the iterator stops after the rank's equal-steps budget
(``zephon.runtime.Even``) and counts what it holds back; ``stats()`` counts what the loop
received (``zephon.runtime.LoaderStats``). A worker that dies is reported by name
(``zephon.torch._workers``).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Mapping, cast

from zephon._ext.handout import Cursor, RoundRobin
from zephon.limits import MAX_LAG
from zephon.runtime import (
    KEY_COMPONENT, KEY_SAMPLE_ID, SERVED, Entry, Even, Event, LoaderStats, Pipeline, RankCount, SealingLedger,
    Snapshot, Snapshots, Tracker, log_once,
)
from zephon.torch._bundles import Bundle, Plan, land, pointer_tensor
from zephon.torch._relay import Relay
from zephon.torch._workers import WorkerDiedError, dead_worker

OBSERVE_EVERY = 8  # bundles between the stats' looks at the readers' chunk starts (see LoaderIterator._observe) ...
OBSERVE_SAMPLES = 131072  # ... or fewer, once the bundles since the last look hold this many samples
VIEWS = 64  # a bundle of pointer batches has the views of this many made at a time (see _Cursor.more)


class _Cursor(Cursor):
    """The main process's place in one bundle (``zephon._ext.handout``): its units, ready to
    hand out, and how many of them :meth:`settle` has counted into the stats (counting once per
    bundle, not per batch, keeps the main process's work per batch to a few lookups). A bundle
    of pointer batches makes each batch's dict and names when it is handed out (see
    ``zephon._ext.labels``), and its views :data:`VIEWS` at a time (:meth:`more`)."""

    __slots__ = ()

    def __init__(self, bundle: Bundle, pipeline: Pipeline, size: int | None):
        self.bundle, self.next, self.counted, self.names = bundle, 0, 0, None
        self.make = land if bundle.shipped else None  # a lazy bundle's units are landed one by one
        self.ends = bundle.ends if bundle.ends is not None else range(bundle.start + 1, bundle.stop + 1)
        if bundle.units is not None:
            self.units = bundle.units
        elif size is None:
            self.units = _pointer_items(bundle, pipeline)
        else:
            assert bundle.pointers is not None and bundle.components is not None and bundle.bounds is not None
            bundle.pointers = pointer_tensor(bundle.pointers)
            self.units, self.names = [None] * (len(bundle.bounds) - 1), pipeline.batch_names(bundle.components,
                                                                                               bundle.bounds)
            self.count = 0
            self.more()
            return
        self.count = len(self.units)

    def more(self) -> bool:
        """Make the views of a bundle of pointer batches' next :data:`VIEWS` batches (False: it
        has no more). Made a bundle at once, a thousand views outlived the collector's young
        generations and set off a full collection of the trainer every second or so, 50 ms each."""
        a, units = self.count, self.units
        if a == len(units):
            return False
        b, bounds, pointers = min(a + VIEWS, len(units)), self.bundle.bounds, self.bundle.pointers
        units[a:b] = pointers[bounds[a]:bounds[b]].split_with_sizes([bounds[k + 1] - bounds[k] for k in range(a, b)])
        self.count = b
        return True

    def settle(self, stats: LoaderStats) -> None:
        """Count the units taken since the last call into ``stats``."""
        a, b = self.counted, self.next
        if a == b:
            return
        self.counted, bundle = b, self.bundle
        assert bundle.components is not None  # every bundle carries its units' component ids
        lo, hi = (a, b) if bundle.bounds is None else (bundle.bounds[a], bundle.bounds[b])
        stats.batches += b - a
        if bundle.counts is not None and (a, b) == (0, len(self.units)):
            stats.delivered += bundle.counts  # counted by its reader: a worker's core, not the trainer's
        else:
            stats.count(bundle.components[lo:hi])
        if bundle.tokens is not None:
            tokens = bundle.tokens[a:b].sum(axis=0)
            stats.count_tokens(tokens[:-2], int(tokens[-2]))
            stats.tokens_dropped += int(tokens[-1])
        if bundle.dropped is not None:
            stats.filtered += sum(bundle.dropped[a:b])
        if bundle.skipped is not None:
            stats.drop_last += sum(bundle.skipped[a:b])


def _tracker(plan: Plan, lanes: list[int]) -> Tracker | Snapshots:
    """The ledger of one reader's lanes: from snapshots when packed, else from positioned facts."""
    entries = {lane: plan.entries[lane] for lane in lanes}
    if plan.pipeline.packing is None:
        return Tracker(entries, plan.pipeline.source, plan.replicas)
    return Snapshots(entries, plan.operators)


def _pointer_items(bundle: Bundle, pipeline: Pipeline) -> list[Any]:
    """The items of an unbatched bundle of pointers, as the loop receives them."""
    assert bundle.pointers is not None and bundle.components is not None  # the pointer fast path
    names = pipeline.component_names(bundle.components)
    return [{KEY_SAMPLE_ID: tuple(ids), KEY_COMPONENT: name}
            for ids, name in zip(pointer_tensor(bundle.pointers).tolist(), names)]


class LoaderIterator(RoundRobin):
    """Yields the readers' batches round robin (reader 0, 1, …, skipping finished ones; the
    loop is ``zephon._ext.handout``'s) and tracks, per reader, how far the training loop has
    consumed."""

    def __init__(self, base: Any, plan: Plan, stats: LoaderStats, even: Even | None,
                 count_left: Callable[[Mapping[int, Entry], Mapping[int, Any]], RankCount], relay: Relay | None = None):
        self._base, self._relay = base, relay  # relay: bundles come from (or go to) the replica's other ranks
        self._plan = plan
        self._stats, self._count_left = stats, count_left
        readers = [w for w, lanes in sorted(plan.lanes.items()) if lanes]
        # resume the round robin after the readers that already gave their batch of this cycle
        served = [w for w in readers if all(plan.entries[lane][2] & SERVED for lane in plan.lanes[w])]
        first = next((k for k, w in enumerate(readers) if w not in served), 0)
        super().__init__(readers[first:] + readers[:first], dict.fromkeys(readers, 0), MAX_LAG,
                         (KEY_SAMPLE_ID, KEY_COMPONENT), even)  # recent: the last units' (reader, position before)
        self._trackers: dict[int, Tracker | Snapshots] = {w: _tracker(plan, plan.lanes[w]) for w in readers}
        self._pending: dict[int, deque[Bundle]] = {w: deque() for w in readers}
        self._unobserved: dict[int, dict[int, Any]] = {w: {} for w in readers}  # see _observe
        self._pulled = 0  # bundles pulled
        self._unlooked = 0  # samples of the bundles pulled since the stats' last look

    def run_out(self) -> None:
        """The equal-steps budget ran out (the handout ends the iteration)."""
        self._hold_back()
        self.close_pieces()

    def finish(self) -> None:
        """Every reader ended (the handout ends the iteration)."""
        self.settle()
        self._stats.end(self._plan.replicas, self.entries(), "end")
        self.close_pieces()

    def close_pieces(self) -> None:
        """Remove the workers' store of decoded pieces, its counters added to the stats (once)."""
        self._stats.add_shared(self._plan.close_pieces())

    def piece_counts(self) -> dict[str, int]:
        """The counters of the workers' store of decoded pieces while it is there, else {}."""
        return self._plan.piece_counts()

    def dead_worker(self) -> WorkerDiedError | None:
        """The error for a worker of this iteration that died, if one did."""
        return dead_worker(self._base, self._plan.lanes)

    def refill(self, worker: int) -> _Cursor | None:
        """:meth:`_refill`, with torch's "worker exited unexpectedly" and the like said as the
        :class:`WorkerDiedError` of the worker that died."""
        try:
            return self._refill(worker)
        except RuntimeError as error:
            if isinstance(error, WorkerDiedError) or (died := self.dead_worker()) is None:
                raise
            raise died from error

    def _refill(self, worker: int) -> _Cursor | None:
        """The reader's cursor on its next bundle with something to yield; None after its last."""
        cursor: _Cursor | None = self.cursors[worker]
        while cursor is None or cursor.next == cursor.count:
            if cursor is not None:
                if cursor.more():
                    break
                cursor.settle(self._stats)
                if cursor.bundle.last:
                    return None
            bundle = self._pull(worker)
            tracker = self._trackers[worker]
            tracker.fold(min([p for w, p in self.recent if w == worker], default=self.positions[worker]))
            if isinstance(tracker, Snapshots):
                snapshots = cast(list[Snapshot], bundle.events)
                tracker.extend(snapshots)
                if self._plan.pipeline.packing is not None and self._plan.pipeline.packing.strict:
                    for snapshot in snapshots:
                        self._stats.watch_late(snapshot.lane, snapshot.operator)
            else:
                tracker.extend(bundle.segments, cast(list[Event], bundle.events))
            self._unobserved[worker].update((event.lane, event.state) for event in bundle.events)
            self._pulled += 1
            self._unlooked += bundle.stop - bundle.start
            if self._pulled % OBSERVE_EVERY == 0 or self._unlooked >= OBSERVE_SAMPLES:
                self._unlooked = 0
                self._observe()
            cursor = self.cursors[worker] = _Cursor(bundle, self._plan.pipeline, self._plan.batch_size)
            if not cursor.count:  # nothing to yield (drop_last dropped every batch): the loop passes over it
                self._stats.drop_last += bundle.stop - self.positions[worker]
                self._stats.filtered += bundle.filtered_left
                self._stats.tokens_dropped += bundle.tokens_dropped
                self.positions[worker] = bundle.stop
        return cursor

    def _pull(self, worker: int) -> Bundle:
        pending = self._pending[worker]
        while not pending:
            try:
                bundle = next(self._base) if self._relay is None else self._relay.next(self._base)
            except StopIteration:
                raise RuntimeError(f"zephon: DataLoader worker {worker} stopped before its last batch") from None
            self._pending[bundle.worker].append(bundle.land())  # at once: it frees the worker's slot
        return pending.popleft()

    def _observe(self) -> None:
        """Show the stats each lane's latest chunk start since the last call (the furthest the
        readers reached is one of them): their news of passes and drained datasets. Sealing a
        state costs tens of microseconds, so this runs every ``OBSERVE_EVERY`` bundles (or
        ``OBSERVE_SAMPLES`` samples) and whenever the stats are read."""
        for worker, pending in self._unobserved.items():
            if not pending:
                continue
            tracker = self._trackers[worker]
            if isinstance(tracker, Tracker):
                self._stats.observe(tracker.sealer.furthest(pending))
            else:
                self._stats.observe(pending.values())
            pending.clear()

    def settle(self) -> None:
        """Count every unit the loop received (and the batches) into the stats: they are counted
        a bundle at a time."""
        self._observe()
        for cursor in self.cursors.values():
            if cursor is not None:
                cursor.settle(self._stats)

    def _hold_back(self) -> None:
        """The equal-steps budget ran out: count and say (once) what this rank holds back."""
        even, stats = self.even, self._stats
        assert even is not None  # only an equal-steps budget runs out
        if even.held_back_units or stats.ended:
            return
        self.settle()
        entries = self.entries()
        left = self._count_left(entries, self.operators())
        even.held_back_units, even.held_back_samples = left.units, left.samples
        if left.units:
            log_once(f"zephon: rank {stats.rank}: even_batches holds back {left.units} batches ({left.samples} "
                     f"samples) so that every rank takes {even.target} steps; they stay unread in the checkpoint")
        stats.end(self._plan.replicas, entries, f"even_batches: {even.target} steps on every rank" if left.units
                  else "end")

    def _view(self, lag: int) -> tuple[dict[int, int], int | None]:
        """Each reader's position, and the reader whose unit comes next, as of ``lag`` units
        before the last one yielded."""
        if not 0 <= lag <= len(self.recent):
            raise ValueError(f"state_dict(lag={lag}): the loader has yielded {len(self.recent)} units it can step "
                             f"back over (at most {MAX_LAG}, in this iteration)")
        positions = dict(self.positions)
        upcoming = self.upcoming()
        for worker, before in list(self.recent)[len(self.recent) - lag:][::-1]:
            positions[worker], upcoming = before, worker
        return positions, upcoming

    def operators(self, lag: int = 0) -> dict[int, Any]:
        """A packed pipeline's operator states of the rank's lanes ``lag`` units before the last
        one yielded ({} unpacked)."""
        positions, _ = self._view(lag)
        out: dict[int, Any] = {}
        for worker, tracker in self._trackers.items():
            if isinstance(tracker, Snapshots):
                out.update(tracker.operators_at(positions[worker]))
        return out

    def entries(self, lag: int = 0) -> SealingLedger:
        """The ledger of the rank's lanes ``lag`` units before the last one yielded (default:
        after it), with both turn flags; its states are sealed as they are read."""
        positions, upcoming = self._view(lag)
        out = SealingLedger()
        for worker, tracker in self._trackers.items():
            served = SERVED if upcoming is not None and worker < upcoming else 0
            if isinstance(tracker, Snapshots):
                recorded, sealer = tracker.entries_at(positions[worker]), None
            else:
                recorded, sealer = tracker.tokens_at(positions[worker]), tracker.sealer
            out.add({lane: (state, consumed, flags | served) for lane, (state, consumed, flags) in recorded.items()},
                    sealer)
        return out
