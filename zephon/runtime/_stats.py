"""What a loader delivered and where its datasets stand: ``stats()`` and the INFO events.

The main process of a rank keeps one :class:`LoaderStats`. It counts what the training loop
received (samples per component, batches, items a filter dropped) and watches the chunk
starts its readers report: a dataset that starts a new pass, a ``"redistribute"`` dataset
that runs dry, and the end of the stream are logged once per rank on the ``zephon`` logger
at INFO. Everything :meth:`LoaderStats.as_json` returns is plain JSON.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping, TypedDict

import numpy as np

from zephon.runtime._even import EvenBatchesDict
from zephon.runtime._packed import lane_reads
from zephon.runtime._sealing import Entry
from zephon.work import DatasetCoverage, PhasedMixtureWorkSource, StaticMixtureWorkSource, received

log = logging.getLogger("zephon")
REDISTRIBUTE = "redistribute"
FEW_KINDS = 8  # up to this many component ids, a comparison pass per id is faster than np.bincount


class DatasetStatsDict(DatasetCoverage):
    """A dataset in ``stats()["datasets"]``: what the loop received of it, as ``coverage()``
    figures, and its exhaustion ``policy``."""

    policy: str


class LoaderStatsDict(TypedDict):
    """``DataLoader.stats()``: what this rank delivered and where its datasets stand."""

    rank: int
    batches: int
    samples: dict[str, int]  # per component
    filtered: int  # items that filter steps dropped
    drop_last: int  # samples of lanes' short last batches that drop_last dropped
    datasets: dict[str, DatasetStatsDict]
    redistributed: list[str]  # datasets that ran dry and whose share went to the others
    exhausted: list[str]  # what ended the stream (empty while it runs)
    ended: bool
    even_batches: EvenBatchesDict | None  # None without even_batches
    tokens: TokensDict | None  # packed pipelines: what the loop received, in tokens (None otherwise)
    shared_decoding: SharedDecodingDict | None  # workers sharing decoded row groups (None: they never did)


class SharedDecodingDict(TypedDict):
    """``stats()["shared_decoding"]``: the row groups this rank's DataLoader workers decoded and
    shared with each other, summed over its iterations."""

    decoded: int  # row groups the workers decoded
    shared: int  # row groups a worker read from another's decoding instead of decoding them
    unshared: int  # of those decoded, the ones kept by their worker alone (the store was full or unwritable)
    waited: int  # times a worker waited for another to finish decoding a row group it wanted


class TokensDict(TypedDict):
    """``stats()["tokens"]`` of a packed pipeline."""

    received: dict[str, int]  # real (not padding) tokens per component
    padding: int  # padding tokens in the sequences received
    dropped: int  # tokens of the sequences open at lanes' ends that pack(final="drop") dropped
    target: dict[str, float] | None  # ensure_mixture's target shares (None without it)
    late: dict[str, int] | None  # strict ensure_mixture, per component: times it was behind with none of it queued


def component_counts(ids: np.ndarray, kinds: int) -> np.ndarray:
    """How many of ``ids`` are each component id ``0 .. kinds - 1`` (int64). np.bincount casts
    the ids and scans them twice; a few counts of equality are cheaper, and the trainer counts
    every sample the loop receives."""
    if kinds <= FEW_KINDS:
        return np.array([np.count_nonzero(ids == k) for k in range(kinds)], dtype=np.int64)
    return np.bincount(ids, minlength=kinds)[:kinds]


def _plans(template: Any) -> list[Any]:
    """The source's dataset plans (name, policy, total per pass), when it is a mixture source."""
    config = getattr(template, "config", None)
    return list(getattr(config, "datasets", ()))


def _core(state: Any) -> dict[str, Any] | None:
    """The ``"state"`` of a mixture source's state (JSON): a phased source's is its inner state's."""
    outer = state.get("inner", state) if isinstance(state, dict) else None
    core = outer.get("state") if isinstance(outer, dict) else None
    return core if isinstance(core, dict) else None


def _cursors(state: Any) -> dict[str, dict[str, Any]] | None:
    """``{dataset: {"epoch", "position"}}`` of a mixture source's state (JSON), else None."""
    cursors = (_core(state) or {}).get("cursors")
    return cursors if isinstance(cursors, dict) else None


def _chunk_index(state: Any) -> int:
    index = (_core(state) or {}).get("chunk_index")
    return index if type(index) is int else -1


def end_causes(template: Any, replicas: int, entries: Mapping[int, Entry]) -> list[str]:
    """Names of the datasets that ended the lanes of ``entries`` (a ``"stop"`` dataset running
    dry, a repeat limit; ``"all passes done"`` when no single one did), walked on numbers."""
    if not isinstance(template, (StaticMixtureWorkSource, PhasedMixtureWorkSource)):
        return []
    causes: set[str] = set()
    for lane, (state, _, _) in entries.items():
        source = template.clone_for_lane(lane, replicas)
        source.restore_checked(state)
        causes.add(source.ended_by() or "all passes done")
    return sorted(causes)


class LoaderStats:
    """Counters of one rank's loader and the progress of its datasets (see module doc): the
    ``template`` source, the component ``names`` and the ``rank``."""

    def __init__(self, template: Any, names: list[str], rank: int):
        self._template, self.rank = template, rank
        self._names = names
        self.delivered = np.zeros(len(names), dtype=np.int64)
        self.batches = 0
        self.filtered = 0
        self.drop_last = 0
        self.ended = False
        self.exhausted: list[str] = []
        self._plans = _plans(template)
        self._latest: Mapping[str, Any] | None = None  # the lane state with the highest chunk index seen
        self._passes: dict[str, int] = {}
        self.redistributed: list[str] = []
        self.tokens: np.ndarray | None = None  # packed: real tokens received per component
        self.padding = self.tokens_dropped = 0
        self.target: np.ndarray | None = None  # ensure_mixture's shares per component id
        self.tolerance = 0.0
        self._off: set[str] = set()  # components whose share was said to be off its target
        self._late_said: set[str] = set()  # components said to have fallen behind with none queued
        self._shared: SharedDecodingDict | None = None  # the workers' stores of ended iterations, summed

    def add_shared(self, counts: Mapping[str, int]) -> None:
        """Fold in the counters of a store of decoded pieces (``PieceStore.counts()``; {}: none)."""
        self._shared = _shared_decoding(self._shared, counts)

    def pack(self, target: Any, tolerance: float) -> None:
        """The stream is packed: count tokens, and hold them to ``target`` shares (None: no target)."""
        self.tokens = np.zeros(len(self._names), dtype=np.int64)
        self.target = None if target is None else np.asarray(target, dtype=np.float64)
        self.tolerance = tolerance

    def count_tokens(self, tokens: np.ndarray, padding: int) -> None:
        """The loop received sequences with these real tokens per component (summed) and padding;
        a share more than ``tolerance`` off its target is said once per component (after a
        thousand tokens per component of the target)."""
        assert self.tokens is not None  # set by pack()
        self.tokens += tokens
        self.padding += padding
        total = int(self.tokens.sum())
        if self.target is None or total * self.target[self.target > 0].min() < 1000:
            return
        for c, name in enumerate(self._names):
            share, target = self.tokens[c] / total, self.target[c]
            if name is not None and target > 0 and abs(share / target - 1) > self.tolerance and name not in self._off:
                self._off.add(name)
                log.warning("zephon: rank %d: component %r has %.4f of the tokens received, its target is %.4f "
                            "(off by more than the tolerance %.3g) after %d tokens", self.rank, name, share, target,
                            self.tolerance, total)

    def count(self, components: np.ndarray) -> None:
        """The loop received samples of these component ids."""
        if len(components):
            self.delivered += component_counts(components, len(self.delivered))

    def observe(self, states: Iterable[Mapping[str, Any]]) -> None:
        """Chunk-start states the readers reported: log new passes and drained datasets once."""
        for state in states:
            if _chunk_index(state) > _chunk_index(self._latest):
                self._latest = state
        cursors = _cursors(self._latest)
        if cursors is None:
            return
        for plan in self._plans:
            cursor = cursors.get(plan.name)
            if not isinstance(cursor, dict):
                continue
            epoch = cursor.get("epoch", 0)
            if epoch > self._passes.get(plan.name, 0):
                log.info("zephon: rank %d: dataset %r starts pass %d", self.rank, plan.name, epoch + 1)
            self._passes[plan.name] = max(epoch, self._passes.get(plan.name, 0))
            drained = plan.policy == REDISTRIBUTE and cursor.get("position", 0) >= plan.total
            if drained and plan.name not in self.redistributed:
                self.redistributed.append(plan.name)
                log.info("zephon: rank %d: dataset %r is exhausted; its share is redistributed over the others",
                         self.rank, plan.name)

    def end(self, replicas: int, entries: Mapping[int, Entry], why: str) -> None:
        """The stream ended for this rank (``why``: what ended it); logged once."""
        if self.ended:
            return
        self.ended = True
        self.exhausted = end_causes(self._template, replicas, entries) if why == "end" else []
        cause = f" (ended by: {', '.join(self.exhausted)})" if self.exhausted else ""
        log.info("zephon: rank %d: the stream ended after %d batches%s", self.rank, self.batches,
                 cause if why == "end" else f" ({why})")

    def datasets(self, replicas: int, entries: Mapping[int, Entry], operators: Mapping[int, Any] | None = None
                 ) -> dict[str, DatasetStatsDict]:
        """Per dataset, what the loop received of it (``zephon.work.received`` over this rank's
        lanes: the source's ``coverage()`` figures, the received part of each chunk in flight
        counted) and its ``policy``."""
        if not entries or not isinstance(self._template, (StaticMixtureWorkSource, PhasedMixtureWorkSource)):
            return {}
        datasets = {d.name: self._template.datasets_by_id[c] for c, d in enumerate(self._plans)}
        covered = received(lane_reads(entries, operators or {}), datasets)
        return {plan.name: {**covered[plan.name], "policy": plan.policy} for plan in self._plans}

    def watch_late(self, lane: int, operator: Mapping[str, Any]) -> None:
        """A strict lane's state after a turn: say once per component that it fell behind with
        none of it queued."""
        late = operator.get("state", {}).get("late", ())
        for c, count in enumerate(late):
            name = self._names[c] if c < len(self._names) else None
            if count and name is not None and name not in self._late_said:
                self._late_said.add(name)
                log.warning("zephon: rank %d: strict ensure_mixture: component %r fell behind its target in lane %d "
                            "with none of it queued (the queue was full): the lane delivers too little of it, or "
                            "nothing more; the others continue (counted in stats()['tokens']['late'])",
                            self.rank, name, lane)

    def late(self, operators: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        """Strict lanes' ``late`` counts summed per component."""
        totals = np.zeros(len(self._names), dtype=np.int64)
        for operator in operators:
            late = operator["state"]["late"]
            totals[:len(late)] += np.asarray(late, dtype=np.int64)[:len(totals)]
        return {n: int(t) for n, t in zip(self._names, totals.tolist()) if n is not None}

    def tokens_json(self, late: dict[str, int] | None) -> TokensDict | None:
        if self.tokens is None:
            return None
        names = self._names
        return {"received": {n: int(t) for n, t in zip(names, self.tokens.tolist()) if n is not None},
                "padding": self.padding, "dropped": self.tokens_dropped,
                "target": None if self.target is None else
                {n: float(t) for n, t in zip(names, self.target.tolist()) if n is not None},
                "late": late}

    def as_json(self, replicas: int, entries: Mapping[int, Entry], even: EvenBatchesDict | None,
                late: dict[str, int] | None = None, shared: Mapping[str, int] | None = None,
                operators: Mapping[int, Any] | None = None) -> LoaderStatsDict:
        """The stats (``shared``: the running iteration's store counters, if it has a store;
        ``operators``: a packed pipeline's lane states, whose packers hold documents back)."""
        return {
            "rank": self.rank,
            "batches": self.batches,
            "samples": {name: int(n) for name, n in zip(self._names, self.delivered.tolist()) if name is not None},
            "filtered": self.filtered,
            "drop_last": self.drop_last,
            "datasets": self.datasets(replicas, entries, operators),
            "redistributed": list(self.redistributed),
            "exhausted": list(self.exhausted),
            "ended": self.ended,
            "even_batches": even,
            "tokens": self.tokens_json(late),
            "shared_decoding": _shared_decoding(self._shared, shared or {}),
        }


def _shared_decoding(total: SharedDecodingDict | None, counts: Mapping[str, int]) -> SharedDecodingDict | None:
    """``total`` with a store's counters added (``counts`` empty: ``total`` as it is)."""
    if not counts:
        return total
    before = total or SharedDecodingDict(decoded=0, shared=0, unshared=0, waited=0)
    return SharedDecodingDict(decoded=before["decoded"] + counts["published"] + counts["unshared"],
                              shared=before["shared"] + counts["shared"],
                              unshared=before["unshared"] + counts["unshared"],
                              waited=before["waited"] + counts["waited"])
