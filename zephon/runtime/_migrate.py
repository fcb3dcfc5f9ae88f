"""Migrate a loader checkpoint (every lane of a run) to a new source: one cut for all lanes."""
from __future__ import annotations

from typing import Any

from zephon.core.checkpoint import (
    KEY_FINGERPRINT, KEY_KIND, KEY_MIGRATIONS, KEY_ORDERS, KEY_RATIOS, KEY_REPLICAS, KEY_VERSION,
)
from zephon.limits import MAX_LOADER_STATE_NODES, MAX_REPLICAS, show
from zephon.runtime._columns import nodes
from zephon.runtime._packed import initial_operator, lane_reads
from zephon.runtime._state import (
    DatasetRecord, dataset_fingerprints, make_state, missing_lanes, parse_state, run_fingerprint,
)
from zephon.work.migration import Migration, lane_state, migrate_lanes
from zephon.work.phased_mixture import KEY_PHASES

_RUN_KEYS = frozenset((KEY_KIND, KEY_VERSION, KEY_REPLICAS, KEY_FINGERPRINT, KEY_RATIOS, KEY_ORDERS, KEY_MIGRATIONS,
                       KEY_PHASES))  # what every lane of a run holds alike: a loader state keeps it once


def migrate_checkpoint(checkpoint: Any, new_pipeline_or_source: Any, *, canonical_replicas: int | None = None,
                       requeue: bool = False) -> Migration:
    """Continue the run of a global loader checkpoint under a new pipeline or source.

    Parameters
    ----------
    checkpoint : dict
        A global loader state (``merge_states`` / ``all_gather_state`` of every rank, or a
        ``load_checkpoint`` result) covering every lane of the run.
    new_pipeline_or_source : Pipeline or StaticMixtureWorkSource
        What the run continues with (its unbound source is used); see ``zephon.work.migrate``
        for what may change. A packed pipeline's lanes start with empty packers.
    canonical_replicas : int or None, default None
        The new run's lane count; None keeps the checkpoint's.
    requeue : bool, default False
        Re-serve the assigned-but-unread samples first (see ``zephon.work.migrate``). A
        ``ValueError`` where every lane's state holding their ranges would make a loader state
        of ``canonical_replicas`` lanes larger than one may be; it names the most lanes allowed.

    Returns
    -------
    Migration
        ``state`` is what the new loader's ``load_state_dict`` takes (every lane at the start
        of the migrated stream); ``report`` is the JSON report of ``zephon.work.migrate``,
        with one cut across all lanes. From a packed run, the documents its packers held
        (partly delivered, or queued) count as assigned but unread, and ``report["packers"]``
        says how many there were per operator.
    """
    if canonical_replicas is not None and (type(canonical_replicas) is not int
                                           or not 1 <= canonical_replicas <= MAX_REPLICAS):
        raise ValueError(f"canonical_replicas must be None (keep the checkpoint's) or an int in 1 .. {MAX_REPLICAS}, "
                         f"got {show(canonical_replicas)}")
    parsed = parse_state(checkpoint)
    missing = missing_lanes(parsed, range(parsed.canonical_replicas))
    if missing:
        raise ValueError(f"migrate_checkpoint needs every lane of the run, the checkpoint lacks {missing}; pass the "
                         "global checkpoint (merge_states / all_gather_state of every rank's state)")
    source = getattr(new_pipeline_or_source, "source", new_pipeline_or_source)
    datasets = dataset_fingerprints(source.datasets_by_id)
    _refuse_renamed(parsed.datasets, datasets)
    replicas = parsed.canonical_replicas if canonical_replicas is None else canonical_replicas
    reads = lane_reads(parsed.entries, {lane: op for by_lane in parsed.operators.values() for lane, op in by_lane.items()})
    new_state, report, history, orders = migrate_lanes(reads, source, requeue)
    if requeue:
        _refuse_oversized_region(lane_state(new_state, source.clone_for_lane(0, replicas).config, history, orders),
                                 replicas)
    entries = {lane: (lane_state(new_state, source.clone_for_lane(lane, replicas).config, history, orders), 0, 0)
               for lane in range(replicas)}
    report["canonical_replicas"] = {"before": parsed.canonical_replicas, "after": replicas}
    report["packers"] = {name: {"documents_held": sum(len(reads[lane][2]) for lane in by_lane)}  # type: ignore[misc]
                         for name, by_lane in parsed.operators.items()}
    packing = getattr(new_pipeline_or_source, "packing", None)
    operators = None if packing is None else {packing.name: {lane: initial_operator(packing) for lane in entries}}
    state: dict[str, Any] = dict(make_state(replicas, entries, datasets, {}, run=run_fingerprint(source, replicas, datasets),
                                            operators=operators))
    return Migration(state, report)


def _refuse_renamed(saved: list[DatasetRecord], new: list[DatasetRecord]) -> None:
    """A dataset under a new name would start its passes again: refuse it, naming both names."""
    new_names, saved_names = {d["name"] for d in new}, {d["name"] for d in saved}
    gone: dict[str, str] = {}
    for d in saved:
        if d["fingerprint"] is not None and d["name"] not in new_names:
            gone.setdefault(d["fingerprint"], d["name"])
    renamed = [(gone[d["fingerprint"]], d["name"]) for d in new
               if d["fingerprint"] in gone and d["name"] not in saved_names]
    if renamed:
        old, now = renamed[0]
        raise ValueError(f"migrate_checkpoint: dataset {old!r} of the checkpoint is {now!r} in the new source (the "
                         f"same content fingerprint); under a new name it would start its passes again and repeat "
                         f"what the run read: keep the name {old!r}")


def _refuse_oversized_region(state: Any, replicas: int) -> None:
    """Every lane's state holds the requeued ranges until it has served them: a loader state of
    ``replicas`` lanes at ``state``'s size must stay within what a loader state holds (loading it
    checks the same), or the new run could not resume from its own checkpoints. A loader state
    keeps the run's settings once; the rest of a lane's state counts once per lane."""
    per_lane = sum(nodes(value) for key, value in state.items() if key not in _RUN_KEYS) + 3  # read, turn, lane
    if replicas * per_lane > MAX_LOADER_STATE_NODES:
        raise ValueError(f"requeue=True puts the unread samples' ranges in each lane's state until it has served "
                         f"them: {replicas} lanes of {per_lane} values, more than a loader state holds "
                         f"({MAX_LOADER_STATE_NODES}); migrate with requeue=False (the report lists them) or to at "
                         f"most {MAX_LOADER_STATE_NODES // per_lane} lanes")
