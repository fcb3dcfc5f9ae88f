"""migrate: continue a run under a new mixture, new or removed datasets, another chunk size or lane count.

``load_state_dict`` stays strict; this is the explicit door. The old run is rebuilt from its
checkpoint alone (sample mode: the schedule needs only the counts and settings it records; token
mode: the old datasets must be in the new template, same shards), the cut and the unread
samples come from ``zephon.core.migration``, and the new state continues every dataset's
cursor: same pass, same order, nothing served twice.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from zephon.core import checkpoint
from zephon.core.checkpoint import KEY_MIGRATIONS, MigrationRecord, StaticMixtureStateDict
from zephon.core.config import REPEAT, SourceConfig, shard_digest
from zephon.core.coverage import DatasetCoverage, read_figures
from zephon.core.migration import Cut, LaneAt, as_phased, cut
from zephon.core.phases import PhasedConfig, PhasedState, bind
from zephon.core.requeue import past_region
from zephon.core.schedule import CursorState, SourceState, initial_state
from zephon.io import Dataset
from zephon.limits import show
from zephon.work import phased_mixture
from zephon.work._mixture import MAX_HISTORY, check_history, with_history
from zephon.work._resolve import resolve
from zephon.work.phased_mixture import PhasedMixtureStateDict, PhasedMixtureWorkSource
from zephon.work.static_mixture import StaticMixtureWorkSource
from zephon.work.tokens import TokenEstimation

REPORT_KIND = "zephon.Migration"


@dataclass(frozen=True)
class Migration:
    """The result of :func:`migrate`.

    ``state`` loads into the new template's clone of the same lane (or into the template for a
    template state) with ``load_state_dict``; ``report`` is JSON: the cut, and per dataset what
    was read, what was assigned but not read (position ranges of a pass, with counts) and where
    its cursor continues.
    """

    state: Mapping[str, Any]  # migrate: a StaticMixtureStateDict or PhasedMixtureStateDict; migrate_checkpoint: a loader state
    report: dict[str, Any]


def _stand_in(entry: Mapping[str, Any], new: Mapping[str, Dataset]) -> Dataset:
    """The old dataset for scheduling: the new template's if it has the same shards, else a
    count-only one of the same size (sample-mode scheduling needs only the count)."""
    dataset = new.get(entry["name"])
    if dataset is not None and shard_digest(dataset.ids(), dataset.counts()) == entry["shards"]:
        return dataset
    return Dataset.from_counts(entry["name"], [entry["total"]])


def _old_base(fingerprint: Mapping[str, Any], ratios: Any, new: Mapping[str, Dataset]) -> SourceConfig:
    """The old run's settings as a config (uniform weights), with each dataset's sample order as
    the run had it (block size, an order an earlier migration kept): a token-mode schedule
    draws by the costs of the samples that order takes."""
    names = [d["name"] for d in fingerprint["datasets"]]
    datasets = [_stand_in(d, new) for d in fingerprint["datasets"]]
    estimation = None
    if fingerprint["mode"] == "tokens":
        missing = [n for n, d in zip(names, datasets) if n not in new or d is not new[n]]
        if missing or not isinstance(ratios, dict):
            raise ValueError(f"migrating a token-mode run needs its datasets {missing} in the new template (token "
                             "costs come from their shards); keep them there, paused if need be")
        estimation = TokenEstimation(primer={n: ratios[n]["ratio"] for n in names})
    if fingerprint["allocation"] not in ("accumulator", "fixed"):
        raise ValueError(f"migrate supports the built-in allocators, this run used {fingerprint['allocation']!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = resolve(
            datasets, {n: 1.0 for n in names}, chunk_size=fingerprint["chunk_size"], seed=fingerprint["seed"],
            shuffle_shards=fingerprint["shuffle_shards"], shuffle_within_shard=fingerprint["shuffle_within_shard"],
            shuffle_block_size=None, exhausted_policy=dict(zip(names, fingerprint["policies"])),
            reshuffle_on_repeat=dict(zip(names, fingerprint["reshuffle_on_repeat"])),
            max_repeats=dict(zip(names, fingerprint["max_repeats"])),
            stop_after_passes=fingerprint["stop_after_passes"], lane_assignment=fingerprint["lane_assignment"],
            allocation=fingerprint["allocation"], token_estimation=estimation,
            pass_tail=dict(zip(names, fingerprint["pass_tail"])), liveness=False,
        )
    columns = [fingerprint.get("orders") or [None] * len(names), fingerprint["block_sizes"],
               fingerprint["reshuffle_on_repeat"]]
    if not all(type(column) is list and len(column) == len(names) for column in columns):
        raise ValueError(f"checkpoint fingerprint: orders, block_sizes and reshuffle_on_repeat must each list the "
                         f"{len(names)} datasets; the checkpoint is corrupted")
    orders = {n: [*(order or (base.seed, j, base.shuffle_shards, base.shuffle_within_shard)), blocks, reshuffle]
              for j, (n, order, blocks, reshuffle) in enumerate(zip(names, *columns))}
    return checkpoint.with_orders(base, orders)


def _phase(base: SourceConfig, entry: Mapping[str, Any]) -> SourceConfig:
    """A phase of the old run (or its static mixture) from its fingerprint ``entry``: weighted
    by name in mixture order, and normalised exactly as the run was (the entry's weights)."""
    names = list(base.names)
    by_name = dict(zip(names, entry["weights"]))
    weights = {n: by_name[n] for n in entry["mixture_order"] or names if by_name[n] > 0}
    return phased_mixture.phase_config(base, weights).with_normalised(entry["weights"])


BaseOf = Callable[[Mapping[str, Any], Any], SourceConfig]  # (fingerprint, token ratios) -> the old run's settings


def _parse(state: Any, base_of: BaseOf) -> tuple[PhasedConfig, PhasedState, dict[str, Any]]:
    """The old run's config (bound to the state's lane), its state and its settings fingerprint;
    ``base_of`` rebuilds the settings (``_old_base``)."""
    if isinstance(state, dict) and state.get(checkpoint.KEY_KIND) == phased_mixture.KIND:
        phases_ = state[phased_mixture.KEY_PHASES]
        phased_mixture.check_state(state, len(phases_), len(phases_[0]["weights"]))
        inner = state[phased_mixture.KEY_INNER]
        settings = inner[checkpoint.KEY_FINGERPRINT]
        base = base_of(settings, inner.get(checkpoint.KEY_RATIOS))
        checkpoint.check_header(inner, base)
        names = list(base.names)
        config = PhasedConfig(
            phases=tuple(_phase(base, e) for e in phases_),
            bounds=tuple(tuple(e["until"]) if e["until"] else None for e in phases_))
        p = state[phased_mixture.KEY_PHASE]
        lane, replicas = inner[checkpoint.KEY_LANE], inner[checkpoint.KEY_REPLICAS]
        config = bind(config, lane, replicas)
        settings = {**{k: v for k, v in settings.items() if k not in ("weights", "mixture_order")},
                    phased_mixture.KEY_PHASES: state[phased_mixture.KEY_PHASES]}  # the same on every lane
        origin = state.get(phased_mixture.KEY_ORIGIN)
        phased = PhasedState(p, checkpoint.parse_state(inner[checkpoint.KEY_STATE], config.phases[p]),
                             None if origin is None else checkpoint.parse_state(origin, config.base))
        return config, phased, settings
    settings = state[checkpoint.KEY_FINGERPRINT]
    base = base_of(settings, state.get(checkpoint.KEY_RATIOS))
    checkpoint.check_header(state, base)
    static = _phase(base, settings)
    static = static.for_lane(state[checkpoint.KEY_LANE], state[checkpoint.KEY_REPLICAS])  # keeps its normalised weights
    config, phased = as_phased(static, checkpoint.parse_state(state[checkpoint.KEY_STATE], static))
    return config, phased, settings


def _continued(old: Mapping[str, Any], new: SourceConfig, at_cut: Mapping[str, CursorState]
               ) -> tuple[tuple[CursorState, ...], dict[str, list[Any]]]:
    """The new state's cursors (old datasets continue, new ones start) and the sample orders
    kept for continuing datasets whose order the new template would key otherwise (another
    seed, position, shuffle or block size; ``reshuffle_on_repeat`` once past pass 0)."""
    old_names = [d["name"] for d in old["datasets"]]
    old_orders = old.get("orders") or [None] * len(old_names)
    problems: list[str] = []
    cursors: list[CursorState] = []
    orders: dict[str, list[Any]] = {}
    for i, d in enumerate(new.datasets):
        if d.name not in at_cut:
            cursors.append(CursorState(epoch=0, position=0))
            continue
        j, cursor = old_names.index(d.name), at_cut[d.name]
        if old["datasets"][j]["shards"] != d.digest:
            problems.append(f"dataset {d.name!r} has other shards than in the run, so its cursor cannot continue "
                            "(give it another name to start it afresh)")
        kept = tuple(old_orders[j]) if old_orders[j] else (old["seed"], j, old["shuffle_shards"],
                                                             old["shuffle_within_shard"])
        reshuffle = old["reshuffle_on_repeat"][j] if cursor.epoch else d.reshuffle_on_repeat
        if (kept != (new.seed, i, new.shuffle_shards, new.shuffle_within_shard)
                or old["block_sizes"][j] != d.block_size or reshuffle != d.reshuffle_on_repeat):
            orders[d.name] = [*kept, old["block_sizes"][j], reshuffle]
        limit = (d.max_repeats if d.max_repeats is not None else cursor.epoch) if d.policy == REPEAT else 0
        if cursor.epoch > limit:
            problems.append(f"dataset {d.name!r} is in pass {cursor.epoch}, which its new policy "
                            f"({d.policy!r}, max_repeats={d.max_repeats}) does not allow; let it repeat")
        cursors.append(cursor)
    if problems:
        raise ValueError("the new template cannot continue this run: " + "; ".join(problems))
    return tuple(cursors), orders


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _report(result: Cut, old: PhasedConfig, new: SourceConfig | PhasedConfig, lanes: list[LaneAt], requeue: bool
            ) -> dict[str, Any]:
    old_names = list(old.names)
    datasets: dict[str, dict[str, Any]] = {}
    for c, name in enumerate(old_names):
        cursor = result.cursors[c]
        unread = [[e, a, b, b - a] for e, a, b in result.unread[c]]
        in_pass = sum(r[3] for r in unread if r[0] == cursor.epoch)
        datasets[name] = {
            "status": "continues" if name in new.names else "removed",
            "cut": {"pass": cursor.epoch, "position": cursor.position},
            "read_in_pass": cursor.position - in_pass,
            "unread": unread,
            "unread_count": sum(r[3] for r in unread),
            "requeued": requeue and name in new.names and bool(unread),
            "continues_at": {"pass": cursor.epoch, "position": cursor.position} if name in new.names else None,
        }
    for name in new.names:
        if name not in datasets:
            datasets[name] = {"status": "new", "cut": None, "read_in_pass": 0, "unread": [], "unread_count": 0,
                              "continues_at": {"pass": 0, "position": 0}}
    return {
        "kind": REPORT_KIND,
        "cut_chunk": result.chunk_index,
        "lanes": {str(at.lane): {"chunk_in_flight": result.in_flight[at.lane], "consumed": at.consumed}
                  for at in lanes},
        "requeue": requeue,
        "unread_count": sum(d["unread_count"] for d in datasets.values()),
        "datasets": datasets,
    }


LaneRead = tuple[Mapping[str, Any], int] | tuple[Mapping[str, Any], int, tuple[int, ...]]


def _lanes_of(states: Mapping[int, LaneRead], datasets: Mapping[str, Dataset]
              ) -> tuple[PhasedConfig, list[LaneAt], dict[str, Any]]:
    """The run's config, its lanes and their settings fingerprint, from lane -> (state_dict,
    samples read from its chunk's start on[, those of them held unread]: ``LaneAt``);
    ``datasets`` by name replace the count-only stand-ins."""
    lanes: list[LaneAt] = []
    settings: dict[str, Any] | None = None
    config: PhasedConfig | None = None
    bases: dict[str, SourceConfig] = {}

    def base_of(fingerprint: Mapping[str, Any], ratios: Any) -> SourceConfig:  # one rebuild for the lanes of a run
        key = json.dumps([fingerprint, ratios], sort_keys=True)
        if key not in bases:
            bases[key] = _old_base(fingerprint, ratios, datasets)
        return bases[key]

    for lane, (state, consumed, *held) in sorted(states.items()):
        first = settings
        try:
            config, phased, settings = _parse(state, base_of)
        except (KeyError, TypeError, AttributeError, IndexError) as error:
            raise ValueError(f"lane {lane}: the state is malformed ({error!r}); pass the state_dict() of a mixture "
                             "source, or a loader checkpoint") from None
        if first is not None and settings != first:
            raise ValueError(f"lane {lane} was taken with other settings than the lanes before it; migrate the "
                             "lanes of one run together")
        lanes.append(LaneAt(lane, phased, consumed, *held))
    if config is None or settings is None:
        raise ValueError("no lane states given; pass at least one lane's state_dict()")
    return config, lanes, settings


def received(states: Mapping[int, LaneRead],
             datasets: Mapping[str, Dataset] | None = None) -> dict[str, DatasetCoverage]:
    """What the readers of these lanes received, per dataset, as ``coverage()`` figures.

    ``states`` maps lane -> (its source's state_dict() at its chunk in flight, samples read
    from that chunk's start on[, those of them held unread]), as a loader checkpoint holds them.
    The figures count every pointer of the global chunks before the lanes' cut (``migrate``)
    less those assigned but not received: exact for all of a run's lanes, and for some of them
    they count the other lanes' chunks before the cut as read. From the states alone in sample mode; a token-mode run needs its
    ``datasets`` (by name: draw costs come from their shards).
    """
    config, lanes, _ = _lanes_of(states, datasets or {})
    result = cut(config, lanes)
    out: dict[str, DatasetCoverage] = {}
    for d, cursor, unread, skipped in zip(config.datasets, result.cursors, result.unread, result.skipped):
        read = cursor.epoch * d.total + cursor.position - sum(stop - start for _, start, stop in unread)
        out[d.name] = read_figures(d, read, skipped)
    return out


def migrate_lanes(states: Mapping[int, LaneRead],
                  new_template: StaticMixtureWorkSource | PhasedMixtureWorkSource, requeue: bool = False
                  ) -> tuple[SourceState | PhasedState, dict[str, Any], tuple[MigrationRecord, ...], dict[str, list[Any]]]:
    """The core of :func:`migrate` for several lanes of one run: the new global state, the
    report, the new history and the kept sample orders (see :func:`lane_state`). ``states``
    maps lane -> (its state_dict, samples read from its chunk's start on[, those of them held
    unread, ascending offsets])."""
    if not isinstance(new_template, (StaticMixtureWorkSource, PhasedMixtureWorkSource)) \
            or new_template.lane_id is not None:
        raise TypeError(f"new_template must be an unbound StaticMixtureWorkSource or PhasedMixtureWorkSource, "
                        f"got {new_template!r}")
    if type(requeue) is not bool:
        raise TypeError(f"requeue must be True or False, got {show(requeue)}")
    new_config = new_template.config
    base = new_config.base if isinstance(new_config, PhasedConfig) else new_config
    new_datasets = {d.name: new_template.datasets_by_id[i] for i, d in enumerate(new_config.datasets)}
    config, lanes, settings = _lanes_of(states, new_datasets)
    if any(at.state.inner.requeue for at in lanes):
        lane = next(at.lane for at in lanes if at.state.inner.requeue)
        raise ValueError(f"lane {lane} is still re-serving the samples of an earlier migration; migrate after it "
                         "has served them (a few chunks)")
    history: tuple[MigrationRecord, ...] = ()
    for lane in sorted(states):
        history = check_history(states[lane][0].get(KEY_MIGRATIONS, []))
    result = cut(config, lanes)
    at_cut = {name: result.cursors[c] for c, name in enumerate(config.names) if name in new_config.names}
    cursors, orders = _continued(settings, base, at_cut)
    served = tuple(sorted((base.names.index(name), *r) for c, name in enumerate(config.names)
                          if name in base.names for r in result.unread[c])) if requeue else ()
    if len(served) > checkpoint.MAX_REQUEUE:
        raise ValueError(f"requeue=True would put {len(served)} ranges of unread samples in every lane's state, "
                         f"more than {checkpoint.MAX_REQUEUE}; migrate with requeue=False (the report lists them)")
    new_state: Any = SourceState(chunk_index=0, alloc=initial_state(base).alloc, cursors=cursors,
                                 requeue=served)
    if isinstance(new_config, PhasedConfig):  # its phase 0 starts after the requeued chunks, from the cut's cursors
        new_state = PhasedState(0, new_state, past_region(new_state, base))
    report = _report(result, config, new_config, lanes, requeue)
    record: MigrationRecord = {"cut_chunk": result.chunk_index, "from": _digest(settings), "unread": report["unread_count"],
              "requeued": requeue}
    return new_state, report, (history + (record,))[-MAX_HISTORY:], orders


def lane_state(new_state: Any, config: SourceConfig | PhasedConfig, history: tuple[MigrationRecord, ...],
               orders: dict[str, list[Any]]) -> StaticMixtureStateDict | PhasedMixtureStateDict:
    """The state_dict of the migrated stream for ``config``'s lane: the state, the kept orders
    and the history."""
    if isinstance(config, PhasedConfig):
        return with_history(phased_mixture.state_to_json(new_state, phased_mixture.with_orders(config, orders)), history)
    return with_history(checkpoint.state_to_json(new_state, checkpoint.with_orders(config, orders)), history)


def migrate(state: Mapping[str, Any], new_template: StaticMixtureWorkSource | PhasedMixtureWorkSource, *,
            requeue: bool = False) -> Migration:
    """Continue the run that wrote ``state`` under ``new_template``.

    Parameters
    ----------
    state : dict
        A ``state_dict()`` of a template, or of one lane of a run that has one lane per
        reader (for a multi-lane loader checkpoint use ``zephon.torch.migrate_checkpoint``,
        which cuts every lane at once). The lane is taken as the only reader: its own chunks
        before its position count as read.
    new_template : StaticMixtureWorkSource or PhasedMixtureWorkSource
        The unbound source to continue with (a phased one starts its phase 0 at the cut, after
        the requeued chunks: its bounds count from there). A dataset that keeps its name (and its shards)
        continues its pass where it stood, in the same order: the state keeps the seed,
        position and shuffles that key its order if the template would key it otherwise.
        New datasets start at pass 0; datasets left out are reported.
    requeue : bool, default False
        Re-serve the assigned-but-unread samples of the datasets that continue first, as the
        first chunks of the new stream (shared by the lanes like any chunk); the report still
        lists them, marked ``requeued``.

    Returns
    -------
    Migration
        ``state`` for the new template's clone of the same lane (the template for a template
        state), and the JSON ``report``. Deterministic: a pure function of the arguments.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a state_dict() (a dict), got {type(state).__name__}")
    lane, replicas = state.get(checkpoint.KEY_LANE), state.get(checkpoint.KEY_REPLICAS)
    new_state, report, history, orders = migrate_lanes({0 if lane is None else lane: (state, 0)}, new_template,
                                                       requeue)
    target = new_template
    if lane is not None:
        assert isinstance(replicas, int)  # the header was checked by migrate_lanes
        target = new_template.clone_for_lane(lane, replicas)
    return Migration(lane_state(new_state, target.config, history, orders), report)
