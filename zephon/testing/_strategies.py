"""Hypothesis strategies for zephon's own suite and for downstream projects.

Every argument accepts a value or a strategy (``num_datasets=3`` or
``num_datasets=st.integers(1, 4)``). Examples shrink toward fewer, smaller datasets, small
chunks, seed 0 and no shuffling.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn, SearchStrategy

from zephon.io import Dataset
from zephon.runtime import MAPPINGS
from zephon.testing._streams import single_lane
from zephon.work import (ComponentOrder, MixtureReadConfig, MixtureReadMode, Phase, PhasedMixtureWorkSource,
                         StaticMixtureWorkSource, WorkChunk)

POLICY_CHOICES = ("repeat", "stop", "redistribute")
PASS_TAILS = ("carry", "drop")
Topology = tuple[int, int, str]  # (world size, DataLoader workers per rank (0: the main process), mapping)
MixtureSource = StaticMixtureWorkSource | PhasedMixtureWorkSource


def _strategy(value: Any) -> SearchStrategy[Any]:
    return value if isinstance(value, SearchStrategy) else st.just(value)


@st.composite
def datasets(draw: DrawFn, *, name: Any = "d", max_shards: Any = 6, max_count: Any = 40) -> Dataset:
    """A count-only :class:`Dataset` with 1..``max_shards`` shards of 0..``max_count`` rows.

    Shrinks toward one small shard.
    """
    shards, largest = draw(_strategy(max_shards)), draw(_strategy(max_count))
    if shards < 1 or largest < 0:
        raise InvalidArgument(f"datasets() needs max_shards >= 1 and max_count >= 0, got {shards}, {largest}")
    counts = draw(st.lists(st.integers(0, largest), min_size=1, max_size=shards))
    ids = draw(st.lists(st.integers(0, 10**6), min_size=len(counts), max_size=len(counts), unique=True))
    return Dataset.from_counts(draw(_strategy(name)), counts, shard_ids=sorted(ids))


@st.composite
def mixtures(draw: DrawFn, *, names: Any) -> dict[str, float]:
    """Weights for ``names``: positive floats between 0.05 and 1, some as users write them (0.6,
    0.3, 0.1: their sums round, and shares tie; shrinks toward equal weights)."""
    weight = st.floats(0.05, 1.0) | st.integers(1, 20).map(lambda k: k / 20)
    return {n: draw(weight) for n in draw(_strategy(names))}


def _valid(kwargs: dict[str, Any], kind: type[MixtureSource] = StaticMixtureWorkSource) -> bool:
    """Construction succeeds and the first chunk can be produced."""
    try:
        kind(**kwargs).clone_for_lane(0, 1).next_chunk()
    except ValueError:
        return False
    return True


@st.composite
def _source_configs(draw: DrawFn, num_datasets: Any, max_chunk_size: Any, policies: Any, block_sizes: Any,
                    allocations: Any, pass_tails: Any) -> dict[str, Any]:
    n = draw(_strategy(num_datasets))
    if n < 1:
        raise InvalidArgument(f"source_configs() needs num_datasets >= 1, got {n}")
    data = [draw(datasets(name=f"d{i}")) for i in range(n)]
    kwargs: dict[str, Any] = {
        "datasets": data,
        "mixture": draw(mixtures(names=[d.name for d in data])),
        "chunk_size": draw(st.integers(1, draw(_strategy(max_chunk_size)))),
        "seed": draw(st.integers(0, 2**64)),
        "shuffle_shards": draw(st.booleans()),
        "shuffle_within_shard": draw(st.booleans()),
        "shuffle_block_size": draw(_strategy(block_sizes)),
        "lane_assignment": draw(st.sampled_from(["permute", "modulo"])),
        "allocation": draw(_strategy(allocations)),
    }
    style = draw(st.sampled_from(["passes", "policies"]))
    if style == "passes":
        kwargs["stop_after_passes"] = draw(st.integers(1, 3))
    else:
        kwargs["exhausted_policy"] = {d.name: draw(_strategy(policies)) for d in data}
        per_dataset = st.fixed_dictionaries({d.name: st.integers(0, 2) for d in data})
        kwargs["max_repeats"] = draw(st.none() | st.integers(0, 2) | per_dataset)
        if kwargs["max_repeats"] is None:
            kwargs["stop_after_passes"] = None
    kwargs["reshuffle_on_repeat"] = not draw(st.booleans())
    kwargs["pass_tail"] = {d.name: draw(_strategy(pass_tails)) for d in data}
    _drop_settings_without_effect(kwargs)
    return kwargs


def _drop_settings_without_effect(kwargs: dict[str, Any]) -> None:
    """Reset what could not change the stream (the source would warn about it) to its default."""
    policies = kwargs.get("exhausted_policy") or dict.fromkeys(kwargs["pass_tail"], "repeat")
    repeats = "repeat" in policies.values()
    caps = kwargs.get("max_repeats")
    if isinstance(caps, dict):  # an entry for a dataset that never repeats would warn
        caps = kwargs["max_repeats"] = {name: cap for name, cap in caps.items() if policies[name] == "repeat"}
    if not repeats:
        kwargs["max_repeats"] = caps = None

    def cap_of(name: str) -> Any:
        return caps.get(name) if isinstance(caps, dict) else caps

    for name, policy in policies.items():
        if policy != "repeat" or cap_of(name) == 0:
            kwargs["pass_tail"][name] = "carry"
    shuffles = kwargs["shuffle_shards"] or kwargs["shuffle_within_shard"] or kwargs["shuffle_block_size"] not in (None, 1)
    never_again = all(cap_of(name) == 0 for name, policy in policies.items() if policy == "repeat")
    if not (repeats and shuffles) or never_again:
        kwargs["reshuffle_on_repeat"] = True


def source_configs(
    *,
    num_datasets: Any = st.integers(1, 3),
    max_chunk_size: Any = 24,
    policies: Any = st.sampled_from(POLICY_CHOICES),
    block_sizes: Any = st.none() | st.integers(1, 64) | st.sampled_from(["auto", "global"]),
    allocations: Any = st.sampled_from(["accumulator", "fixed"]),
    pass_tails: Any = st.sampled_from(PASS_TAILS),
) -> SearchStrategy[dict[str, Any]]:
    """Keyword arguments of a valid, *finite* :class:`StaticMixtureWorkSource`.

    Valid: it constructs and its first chunk can be produced.
    Finite: either ``stop_after_passes`` is set, or per-dataset policies with every repeating
    dataset capped by ``max_repeats`` (one cap, or one per dataset) — the stream always ends.
    Each repeating dataset draws its ``pass_tail`` from ``pass_tails``. Shrinks toward one dataset, chunk size 1,
    ``stop_after_passes=1``, carried pass tails.
    """
    def finite(kwargs: dict[str, Any]) -> bool:
        policies_ = kwargs.get("exhausted_policy") or {}
        return kwargs.get("stop_after_passes") is not None or kwargs["max_repeats"] is not None or \
            "repeat" not in policies_.values()

    return _source_configs(num_datasets, max_chunk_size, policies, block_sizes, allocations, pass_tails) \
        .filter(finite).filter(_valid)


@st.composite
def cut_points(draw: DrawFn, *, max_chunks: Any = 40, max_cuts: Any = 4) -> list[int]:
    """Sorted, distinct chunk indices in ``[0, max_chunks]`` at which to checkpoint.

    Shrinks toward ``[0]``.
    """
    top, cuts = draw(_strategy(max_chunks)), draw(_strategy(max_cuts))
    if top < 0 or cuts < 1:
        raise InvalidArgument(f"cut_points() needs max_chunks >= 0 and max_cuts >= 1, got {top}, {cuts}")
    return sorted(draw(st.lists(st.integers(0, top), min_size=1, max_size=cuts, unique=True)))


def sources(
    *,
    num_datasets: Any = st.integers(1, 3),
    max_chunk_size: Any = 24,
    policies: Any = st.sampled_from(POLICY_CHOICES),
    block_sizes: Any = st.none() | st.integers(1, 64) | st.sampled_from(["auto", "global"]),
    allocations: Any = st.sampled_from(["accumulator", "fixed"]),
    pass_tails: Any = st.sampled_from(PASS_TAILS),
    canonical_replicas: Any = None,
    lane: Any = None,
) -> SearchStrategy[StaticMixtureWorkSource]:
    """A built, finite :class:`StaticMixtureWorkSource` across every setting.

    Datasets, weights, chunk size, seed, shuffles, block sizes, per-dataset exhaustion
    policies, repeat caps, pass tails, routing and allocation are drawn as in :func:`source_configs`
    (the arguments are the same). Unbound (a template) unless ``canonical_replicas`` is
    given: then it is bound to ``lane`` (default: a drawn lane of ``canonical_replicas``).
    Shrinks toward one small dataset, chunk size 1, one pass, lane 0.
    """
    configs = source_configs(num_datasets=num_datasets, max_chunk_size=max_chunk_size, policies=policies,
                             block_sizes=block_sizes, allocations=allocations, pass_tails=pass_tails)
    return _built("sources", configs, StaticMixtureWorkSource, canonical_replicas, lane)


@st.composite
def _phased_source_configs(draw: DrawFn, configs: SearchStrategy[dict[str, Any]], max_phases: Any) -> dict[str, Any]:
    kwargs = dict(draw(configs))
    names = list(kwargs.pop("mixture"))
    most = draw(_strategy(max_phases))
    if type(most) is not int or most < 1:
        raise InvalidArgument(f"phased_source_configs() needs max_phases >= 1, got {most!r}")
    count, phases = draw(st.integers(1, most)), []
    chunk = sample = 0  # bounds of one kind increase: each is the last one of its kind plus a step
    for k in range(count):
        mixture = draw(mixtures(names=st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True)))
        if k == count - 1:
            phases.append(Phase(mixture))
        elif draw(st.booleans()):
            chunk += draw(st.integers(1, 6))
            phases.append(Phase(mixture, until_chunk=chunk))
        else:
            sample += draw(st.integers(1, 60))
            phases.append(Phase(mixture, until_sample=sample))
    kwargs["phases"] = phases
    return kwargs


def phased_source_configs(
    *,
    max_phases: Any = 3,
    num_datasets: Any = st.integers(1, 3),
    max_chunk_size: Any = 24,
    policies: Any = st.sampled_from(POLICY_CHOICES),
    block_sizes: Any = st.none() | st.integers(1, 64) | st.sampled_from(["auto", "global"]),
    allocations: Any = st.sampled_from(["accumulator", "fixed"]),
    pass_tails: Any = st.sampled_from(PASS_TAILS),
) -> SearchStrategy[dict[str, Any]]:
    """Keyword arguments of a valid, finite :class:`~zephon.work.PhasedMixtureWorkSource`.

    The settings are drawn as in :func:`source_configs` (the arguments are the same); the
    mixture becomes 1..``max_phases`` phases, each over a non-empty subset of the datasets
    (the others paused), every phase but the last ending at a drawn ``until_chunk`` or
    ``until_sample`` bound. Valid: it constructs and its first chunk can be produced.
    Shrinks toward one phase over one dataset.
    """
    configs = source_configs(num_datasets=num_datasets, max_chunk_size=max_chunk_size, policies=policies,
                             block_sizes=block_sizes, allocations=allocations, pass_tails=pass_tails)
    return _phased_source_configs(configs, max_phases).filter(functools.partial(_valid, kind=PhasedMixtureWorkSource))


def phased_sources(
    *,
    max_phases: Any = 3,
    num_datasets: Any = st.integers(1, 3),
    max_chunk_size: Any = 24,
    policies: Any = st.sampled_from(POLICY_CHOICES),
    block_sizes: Any = st.none() | st.integers(1, 64) | st.sampled_from(["auto", "global"]),
    allocations: Any = st.sampled_from(["accumulator", "fixed"]),
    pass_tails: Any = st.sampled_from(PASS_TAILS),
    canonical_replicas: Any = None,
    lane: Any = None,
) -> SearchStrategy[PhasedMixtureWorkSource]:
    """A built, finite :class:`~zephon.work.PhasedMixtureWorkSource` across every setting.

    Drawn as in :func:`phased_source_configs`, bound to a lane as in :func:`sources` (the
    arguments are the same). Shrinks toward one phase over one small dataset, lane 0.
    """
    configs = phased_source_configs(max_phases=max_phases, num_datasets=num_datasets, max_chunk_size=max_chunk_size,
                                    policies=policies, block_sizes=block_sizes, allocations=allocations,
                                    pass_tails=pass_tails)
    return _built("phased_sources", configs, PhasedMixtureWorkSource, canonical_replicas, lane)


def _built(caller: str, configs: SearchStrategy[dict[str, Any]], kind: type[MixtureSource], canonical_replicas: Any,
           lane: Any) -> SearchStrategy[Any]:
    """Sources of ``kind`` built from ``configs``, bound to a lane when ``canonical_replicas`` is given."""
    if canonical_replicas is None and lane is not None:
        raise InvalidArgument(f"{caller}(lane=...) needs canonical_replicas too (the number of lanes)")
    if canonical_replicas is not None:
        _check_binding(caller, canonical_replicas, lane)
    return _sources(caller, configs, kind, canonical_replicas, lane)


def _check_binding(caller: str, replicas: Any, lane: Any) -> None:
    """Refuse a lane binding that cannot exist (strategies are checked once drawn)."""
    if isinstance(replicas, SearchStrategy):
        return
    if type(replicas) is not int or replicas < 1:
        raise InvalidArgument(f"{caller}() needs canonical_replicas >= 1, got {replicas!r}")
    if lane is not None and not isinstance(lane, SearchStrategy) and (type(lane) is not int or not 0 <= lane < replicas):
        raise InvalidArgument(f"{caller}() needs 0 <= lane < canonical_replicas={replicas}, got {lane!r}")


@st.composite
def _sources(draw: DrawFn, caller: str, configs: SearchStrategy[dict[str, Any]], kind: type[MixtureSource],
             canonical_replicas: Any, lane: Any) -> MixtureSource:
    source = kind(**draw(configs))
    if canonical_replicas is None:
        return source
    replicas = draw(_strategy(canonical_replicas))
    chosen = draw(st.integers(0, replicas - 1) if lane is None else _strategy(lane))
    _check_binding(caller, replicas, chosen)
    return source.clone_for_lane(chosen, replicas)


@st.composite
def reachable_states(draw: DrawFn, source: Any, *, max_chunks: Any = 64) -> Mapping[str, Any]:
    """A checkpoint (``state_dict()``) that ``source`` actually reaches: after a drawn number of
    chunks, from none to the end of the stream (the end included when it comes within
    ``max_chunks``).

    ``source`` is a lane-bound source (its own position is the start; it is not advanced) or a
    template, whose states are those of its single-lane stream (lane 0 of 1); restore them
    into ``template.clone_for_lane(0, 1)``. It may be a strategy too: share it with the test
    (``s = st.shared(sources(), key="s")``, then ``@given(s, reachable_states(s))``) so that
    the source and its state agree. Shrinks toward the source's own state.
    """
    source = draw(_strategy(source))
    limit = draw(_strategy(max_chunks))
    if type(limit) is not int or limit < 0:
        raise InvalidArgument(f"reachable_states() needs max_chunks >= 0, got {limit!r}")
    probe, length = single_lane(source), 0
    while length < limit and probe.next_chunk() is not None:
        length += 1
    steps = draw(st.integers(0, length))  # END changes nothing: the state after the last chunk is the end
    walker = single_lane(source)
    for _ in range(steps):
        walker.next_chunk()
    return walker.state_dict()


@st.composite
def work_chunks(draw: DrawFn, *, max_components: Any = 3, max_pointers: Any = 12) -> WorkChunk:
    """A valid :class:`WorkChunk`: up to ``max_components`` named components of up to
    ``max_pointers`` pointers each, an optional seed, target mixture and exhausted names.

    Shrinks toward one empty component without seed or target.
    """
    most, size = draw(_strategy(max_components)), draw(_strategy(max_pointers))
    if most < 1 or size < 0:
        raise InvalidArgument(f"work_chunks() needs max_components >= 1 and max_pointers >= 0, got {most}, {size}")
    names = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=most, unique=True))
    pointer = st.tuples(st.integers(0, 3), st.integers(0, 50), st.integers(0, 10**6))
    components = {n: draw(st.lists(pointer, max_size=size)) for n in names}
    target = draw(st.none() | st.fixed_dictionaries({n: st.floats(0.01, 1.0) for n in names}))
    return WorkChunk(components, seed=draw(st.none() | st.integers(0, 2**63 - 1)), target_mixture=target,
                     source_exhausted=draw(st.lists(st.sampled_from(names), unique=True)))


def mixture_read_configs() -> SearchStrategy[MixtureReadConfig]:
    """Any :class:`MixtureReadConfig`; shrinks toward the default (weighted round robin, as is)."""
    return st.builds(MixtureReadConfig, mode=st.sampled_from(list(MixtureReadMode)),
                     seed=st.none() | st.integers(0, 2**63 - 1), precompute=st.booleans(),
                     within_component=st.sampled_from(list(ComponentOrder)))


@st.composite
def loader_topologies(draw: DrawFn, *, max_world_size: Any = 4, max_workers: Any = 3,
                      mappings: Any = st.sampled_from(MAPPINGS)) -> Topology:
    """``(world_size, num_workers, mapping)`` of a training job, for elastic-resume tests.

    ``num_workers`` 0 means the main process reads (as in torch). Shrinks toward
    ``(1, 0, "contiguous")``.
    """
    world, workers = draw(_strategy(max_world_size)), draw(_strategy(max_workers))
    if world < 1 or workers < 0:
        raise InvalidArgument(f"loader_topologies() needs max_world_size >= 1 and max_workers >= 0, got {world}, {workers}")
    return draw(st.integers(1, world)), draw(st.integers(0, workers)), draw(_strategy(mappings))
