"""Assertions over one source's stream: replay, lane partition, mixture prefix bound, complete passes.

Each takes a zero-argument ``factory`` that builds a fresh source (or pipeline), so every
check starts from the same place. Checkpoints are tested Grain's way: save the state before
every chunk, restore each saved state into a *fresh* source (through a JSON round trip), and
compare the rest of the stream with the uninterrupted run.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from zephon.core.schedule import lane_of
from zephon.testing._streams import as_source, chunk_divergence, collect, read_order, single_lane, stream_of
from zephon.work import MixtureSpec, WorkChunk, WorkSource

SourceFactory = Callable[[], Any]  # () -> a fresh WorkSource or Pipeline
Pointer = tuple[int, int, int]  # (dataset id, shard id, row offset)


def assert_replay_equivalent(factory: SourceFactory, cuts: Iterable[int], *, max_chunks: int = 1000) -> None:
    """Restoring the checkpoint taken before chunk ``c`` replays exactly the rest, for every cut.

    ``factory()`` returns a fresh lane-bound source (a template is read as its lane 0 of 1).
    Cuts past the end of the stream are taken at the end (where the restored source must
    return None). The failure says at which chunk and position the replay parts, with both
    pointers.

    Parameters
    ----------
    factory : callable
        ``factory()`` returns a fresh source or pipeline; a lane-bound source is read from
        where it stands (a copy; it is not advanced).
    cuts : iterable of int
        Chunk indices whose checkpoints are restored (see ``cut_points()``).
    max_chunks : int, default 1000
        Read at most this many chunks of the uninterrupted stream.
    """
    source = single_lane(factory())
    states: list[Any] = []
    chunks: list[WorkChunk] = []
    ended = False
    while len(chunks) < max_chunks and not ended:
        states.append(json.loads(json.dumps(source.state_dict())))
        chunk = source.next_chunk()
        if chunk is None:
            ended = True
        else:
            chunks.append(chunk)
    for cut in cuts:
        cut = min(cut, len(states) - 1)
        fresh = single_lane(factory())
        fresh.load_state_dict(states[cut])
        replay = collect(fresh, len(chunks) - cut + (1 if ended else 0))
        where = f"lane {fresh.lane_id} of {fresh.canonical_replicas}, restored before chunk {cut}"
        problem = chunk_divergence(chunks[cut:], replay, where=where, first_chunk=cut)
        if problem:
            raise AssertionError(problem)


def _owner_of(template: WorkSource, replicas: int) -> Callable[[int], int] | None:
    """The routing function of a StaticMixtureWorkSource, or None for other sources."""
    config = getattr(template, "config", None)
    if config is None:
        return None
    bound = dataclasses.replace(config, lane=0, canonical_replicas=replicas)
    return lambda g: lane_of(bound, g)


def assert_lanes_partition(factory: SourceFactory, replicas: int, *, max_chunks: int = 1000) -> None:
    """The lanes' streams are disjoint and, merged in global chunk order, equal lane 0 of 1.

    ``factory()`` must return a fresh *template* (or a pipeline over one). The merge takes,
    for each chunk of the single-lane stream, the next chunk of the lane that owns it (by the
    source's routing when it exposes ``config``, else any lane whose next chunk matches); a
    mismatch, or chunks left over on any lane, fail the assertion.

    Parameters
    ----------
    factory : callable
        ``factory()`` returns a fresh template source or a pipeline over one.
    replicas : int
        The number of lanes (``canonical_replicas``).
    max_chunks : int, default 1000
        Read at most this many chunks per stream.
    """
    single = collect(as_source(factory()).clone_for_lane(0, 1), max_chunks)
    template = as_source(factory())
    lanes = [collect(template.clone_for_lane(lane, replicas), max_chunks) for lane in range(replicas)]
    owner = _owner_of(template, replicas)
    taken = [0] * replicas
    for g, chunk in enumerate(single):
        candidates = [owner(g)] if owner else range(replicas)
        owners = [lane for lane in candidates if taken[lane] < len(lanes[lane]) and lanes[lane][taken[lane]] == chunk]
        if not owners:
            lane = candidates[0]
            got = lanes[lane][taken[lane]:taken[lane] + 1]
            problem = chunk_divergence([chunk], got, where=f"global chunk {g} on lane {lane} of {replicas}")
            raise AssertionError(f"global chunk {g} of the single-lane stream is not the next chunk of its lane: "
                                 f"{problem or 'the lane has ended'}")
        taken[owners[0]] += 1
    left = {lane: len(lanes[lane]) - taken[lane] for lane in range(replicas) if taken[lane] < len(lanes[lane])}
    if left and len(single) < max_chunks:
        raise AssertionError(f"lanes hold chunks the single-lane stream does not: {left}")


def _target(chunk: WorkChunk, weights: Mapping[str, float]) -> Mapping[str, float]:
    return chunk.target_mixture if chunk.target_mixture is not None else weights


def assert_mixture_prefix_bound(factory: SourceFactory, bound: float, *, max_chunks: int = 1000) -> None:
    """Every prefix of the stream holds each component within ``bound`` samples of its target.

    The stream is read in default read order (lane 0 of 1 for a template). After ``n``
    samples a component's target is the sum, over the chunks read so far, of its target
    share times the samples read from that chunk; the share is the chunk's
    ``target_mixture`` when it has one (redistribution), else the source's normalised
    weights. Sample-mode sources only: a token-aware source targets tokens, not samples.
    The failure names the component, the chunk, the position and both counts.

    Parameters
    ----------
    factory : callable
        ``factory()`` returns a fresh source or pipeline (a template is read as lane 0 of 1).
    bound : float
        The largest allowed gap, in samples, between a component's count and its target.
    max_chunks : int, default 1000
        Check the prefixes of at most this many chunks.
    """
    source = single_lane(factory())
    config = getattr(source, "config", None)
    if config is None or config.token_mode:
        raise TypeError("assert_mixture_prefix_bound needs a sample-mode StaticMixtureWorkSource (a token-aware "
                        "source targets tokens, not samples)")
    weights = MixtureSpec({d.name: d.weight for d in config.datasets}).normalized
    names = list(weights)
    have, want, read = np.zeros(len(names)), np.zeros(len(names)), 0
    for k, chunk in enumerate(stream_of(source, max_chunks)):
        _, components = read_order(chunk)
        share = _target(chunk, weights)
        steps = np.arange(1, len(components) + 1)[:, None]
        counts = have + np.cumsum(np.array([[c == n for n in names] for c in components], dtype=float), axis=0)
        targets = want + steps * np.array([share.get(n, 0.0) for n in names])
        gap = np.abs(counts - targets)
        if gap.size and gap.max() > bound + 1e-9:
            i, c = np.unravel_index(int(gap.argmax()), gap.shape)
            raise AssertionError(
                f"component {names[c]!r} is {gap[i, c]:.3f} samples off its target after {read + i + 1} samples "
                f"(chunk {k}, position {i}): {int(counts[i, c])} read, target {targets[i, c]:.3f}; bound {bound}")
        if len(components):
            have, want = counts[-1], targets[-1]
        read += len(components)


def _all_samples(plan: Any, dataset_id: int) -> set[Pointer]:
    return {(dataset_id, int(shard), offset) for shard, count in zip(plan.shard_ids, plan.shard_counts)
            for offset in range(int(count))}


def _carries(plan: Any) -> bool:
    return getattr(plan, "pass_tail", None) == "carry"


def _passes_of(source: Any, max_chunks: int) -> tuple[list[dict[int, list[tuple[Pointer, int]]]], list[set[int]]]:
    """Per dataset: pass -> [(pointer, chunk)], and the passes the stream moved past.

    A ``pass_tail="carry"`` dataset reads its passes back to back, so its ``i``-th
    pointer belongs to pass ``i // total``. Otherwise pointers are assigned by the cursors
    in ``source.state`` before and after each chunk: a dataset that started new passes
    inside a chunk drew the rest of its old pass (none if its tail was dropped), any whole
    passes, then the start of its new one.
    """
    config = source.config
    passes: list[dict[int, list[tuple[Pointer, int]]]] = [{} for _ in config.datasets]
    moved: list[set[int]] = [set() for _ in config.datasets]
    drawn = [0] * len(config.datasets)
    for k in range(max_chunks):
        before = source.state.cursors
        chunk = source.next_chunk()
        if chunk is None:
            break
        for c, (plan, old, new) in enumerate(zip(config.datasets, before, source.state.cursors)):
            pointers = [(tuple(p), k) for p in chunk.components.get(plan.name, np.zeros((0, 3))).tolist()]
            if not plan.total:  # an empty dataset has no passes: any pointer to it is reported as no sample of it
                passes[c].setdefault(old.epoch, []).extend(pointers)
                continue
            if _carries(plan):
                for i, pointer in enumerate(pointers, start=drawn[c]):
                    passes[c].setdefault(i // plan.total, []).append(pointer)
                drawn[c] += len(pointers)
                moved[c].update(range(drawn[c] // plan.total))
                continue
            if new.epoch == old.epoch:
                passes[c].setdefault(old.epoch, []).extend(pointers)
                continue
            head = len(pointers) - new.position - (new.epoch - old.epoch - 1) * plan.total
            if not 0 <= head <= plan.total - old.position:
                raise AssertionError(f"dataset {plan.name!r}: chunk {k} holds {len(pointers)} of its pointers, which "
                                     f"no split over passes {old.epoch}..{new.epoch} explains")
            cuts = [0, head] + [head + j * plan.total for j in range(1, new.epoch - old.epoch)] + [len(pointers)]
            for epoch, (a, b) in zip(range(old.epoch, new.epoch + 1), zip(cuts, cuts[1:])):
                passes[c].setdefault(epoch, []).extend(pointers[a:b])
            moved[c].update(range(old.epoch, new.epoch))
    return passes, moved


def assert_passes_complete(factory: SourceFactory, *, max_chunks: int = 1000) -> None:
    """Every completed pass over a dataset holds each of its samples exactly once.

    Read on the single-lane stream of a :class:`StaticMixtureWorkSource` (the global chunk
    order, where passes are defined). A pass is completed once it has given as many samples
    as the dataset holds; every other pass (the one in progress, or one whose tail was
    dropped at a pass boundary) must hold no sample twice, and every pointer must name a
    sample of its dataset. Where a dataset carries its pass tail (``pass_tail="carry"``),
    every pass the stream moved past must be complete. The failure names the dataset, the
    pass, the sample and the chunks it came in.

    Parameters
    ----------
    factory : callable
        ``factory()`` returns a fresh template (or its lane 0 of 1, or a pipeline over it).
    max_chunks : int, default 1000
        Read at most this many chunks; a pass still open there is checked for repeats only.
    """
    source: Any = single_lane(factory())
    if getattr(source, "config", None) is None or getattr(source, "state", None) is None:
        raise TypeError("assert_passes_complete needs a StaticMixtureWorkSource (it reads passes off source.state)")
    if source.canonical_replicas != 1:
        raise ValueError(f"assert_passes_complete reads the global stream; the factory returned lane "
                         f"{source.lane_id} of {source.canonical_replicas}: return the template instead")
    passes, moved = _passes_of(source, max_chunks)
    for c, plan in enumerate(source.config.datasets):
        samples = _all_samples(plan, c)
        for epoch, drawn in sorted(passes[c].items()):
            seen: dict[Pointer, int] = {}
            for pointer, k in drawn:
                if pointer not in samples:
                    raise AssertionError(f"dataset {plan.name!r} pass {epoch}: chunk {k} holds {pointer}, which is "
                                         f"not a sample of the dataset")
                if pointer in seen:
                    raise AssertionError(f"dataset {plan.name!r} pass {epoch} holds {pointer} twice (chunks "
                                         f"{seen[pointer]} and {k})")
                seen[pointer] = k
            if _carries(plan) and epoch in moved[c] and len(seen) < plan.total:
                raise AssertionError(f"dataset {plan.name!r} pass {epoch} was left after {len(seen)} of its "
                                     f"{plan.total} samples, although its pass tail is carried")
