"""Equal steps on every rank: how many batches each rank still has, counted without reading.

A rank's readers cut their lanes' streams into batches, lane by lane, so a rank has
``sum over its lanes of ceil(samples / batch_size)`` batches left (``floor`` with
``drop_last``; samples themselves when items are yielded). A lane's remaining samples come
from its source's random access (``remaining_samples()`` from the chunk-start state, less
what the loop already consumed of that chunk): nothing is generated or read.

With ``even_batches`` every rank yields the smallest of those counts; the surplus of the
longer ranks is *held back*: it is never yielded in this run, stays unread in the
checkpoint, and a resume on another topology counts it again like any remaining sample.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, TypedDict

from zephon.runtime._gc import paused_gc
from zephon.runtime._lanes import rank_lanes
from zephon.runtime._sealing import Entry


class EvenBatchesDict(TypedDict):
    """``stats()["even_batches"]``: the equal step count and what it held back."""

    steps: int  # the equal step count of this run, from where it was set
    given: int  # batches (or items) yielded of it so far
    held_back_batches: int  # the rank's surplus, never yielded in this run (left unread in the checkpoint)
    held_back_samples: int


def countable(template: Any) -> bool:
    """Whether the source can count a lane's remaining samples (a finite stream with random access)."""
    supports = getattr(template, "supports_indexing", None)
    return callable(supports) and bool(supports()) and hasattr(template, "remaining_samples")


def maybe_finite(template: Any) -> bool:
    """Whether the stream may end (False only for a mixture source known to repeat forever)."""
    from zephon.core.index import is_finite

    config = getattr(template, "config", None)
    return config is None or is_finite(config)


def lane_remaining(template: Any, lane: int, replicas: int, entry: Entry, checked: bool = False) -> int:
    """Samples ``lane`` still yields from ledger ``entry`` (its chunk-start state and consumed
    count); ``checked``: the state was checked for ``template`` already (see :func:`lanes_remaining`)."""
    state, consumed, _ = entry
    source = template.clone_for_lane(lane, replicas)
    restore = source.restore_checked if checked else source.load_state_dict
    restore(state)
    remaining: int = source.remaining_samples()
    return remaining - consumed


def units(samples: int, batch_size: int | None, drop_last: bool) -> int:
    """Batches (or items, without ``batch_size``) a lane's ``samples`` make."""
    if batch_size is None:
        return samples
    return samples // batch_size if drop_last else math.ceil(samples / batch_size)


@dataclass(frozen=True, slots=True)
class RankCount:
    """What one rank still has: ``units`` (batches, or items without batching) and ``samples``."""

    units: int
    samples: int


def lanes_remaining(template: Any, replicas: int, entries: Mapping[int, Entry], checked: bool = False
                    ) -> dict[int, int]:
    """Samples each lane of ``entries`` still yields: one walk of the global schedule for all of
    them where the source offers it (``remaining_by_lane``), else lane by lane. ``checked``: the
    states were checked for ``template`` already (a loader's ledger: made by the lanes' sources,
    or checked when loaded), so their form, seal and settings are not checked again where the
    source can skip that (``remaining_by_lane(..., checked=True)``, ``restore_checked``). The
    collector is paused (see ``paused_gc``): each lane's state is restored, and thousands of them
    set off full collections (a fifth of counting 16,384 lanes)."""
    by_lane = getattr(template, "remaining_by_lane", None)
    with paused_gc():
        if by_lane is None:
            return {lane: lane_remaining(template, lane, replicas, entry, checked) for lane, entry in entries.items()}
        states = {lane: entry[0] for lane, entry in entries.items()}
        counts = by_lane(states, replicas, checked=True) if checked and _takes_checked(by_lane) else \
            by_lane(states, replicas)
    return {lane: counts[lane] - entry[1] for lane, entry in entries.items()}


def _takes_checked(by_lane: Any) -> bool:
    """Whether a source's ``remaining_by_lane`` takes ``checked`` by keyword (a source's own may
    not; one that takes ``**kwargs`` is not trusted to and checks its states)."""
    try:
        parameter = inspect.signature(by_lane).parameters.get("checked")
    except (TypeError, ValueError):  # no signature to read
        return False
    return parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)


def count_rank(template: Any, replicas: int, entries: Mapping[int, Entry], rank: int, world_size: int,
               mapping: str, batch_size: int | None, drop_last: bool, checked: bool = False) -> RankCount:
    """The remaining batches and samples of ``rank`` (of ``world_size``): its lanes' batches,
    whatever the readers (each batch is one lane's). ``checked``: the entries' states were
    checked for ``template`` already (see :func:`lanes_remaining`)."""
    lanes = rank_lanes(replicas, rank, world_size, mapping)
    return _rank_count(lanes_remaining(template, replicas, {lane: entries[lane] for lane in lanes}, checked), lanes,
                       batch_size, drop_last)


def count_ranks(template: Any, replicas: int, entries: Mapping[int, Entry], world_size: int,
                mapping: str, batch_size: int | None, drop_last: bool, checked: bool = False) -> list[RankCount]:
    """:func:`count_rank` of every rank (``entries`` must cover every lane), in one count of all lanes."""
    remaining = lanes_remaining(template, replicas, {lane: entries[lane] for lane in range(replicas)}, checked)
    return [_rank_count(remaining, rank_lanes(replicas, rank, world_size, mapping), batch_size, drop_last)
            for rank in range(world_size)]


def _rank_count(remaining: Mapping[int, int], lanes: list[int], batch_size: int | None, drop_last: bool) -> RankCount:
    return RankCount(sum(units(remaining[lane], batch_size, drop_last) for lane in lanes),
                     sum(remaining[lane] for lane in lanes))


@dataclass(slots=True)
class Even:
    """The equal-steps budget of one rank: ``target`` units from where it was set, ``given`` so far;
    ``held_back_units`` and ``held_back_samples``, the rank's surplus, are set when the budget runs out."""

    target: int
    given: int = 0
    held_back_units: int = 0  # set when the budget runs out: the rank's surplus
    held_back_samples: int = 0

    @property
    def left(self) -> int:
        return self.target - self.given

    def as_json(self) -> EvenBatchesDict:
        return {"steps": self.target, "given": self.given, "held_back_batches": self.held_back_units,
                "held_back_samples": self.held_back_samples}


def even_target(counts: Sequence[RankCount]) -> int:
    """The number of units every rank yields: the smallest rank's."""
    return min(count.units for count in counts)
