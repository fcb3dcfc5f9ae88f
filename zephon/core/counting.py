"""Every lane's remaining samples in one walk of the global schedule (pure).

Each lane walks the same global schedule and keeps the chunks its routing gives it, so a lane's
remaining samples are the sizes of the chunks it owns from its chunk-start state on. Counting
lane by lane walks the schedule once per lane (``R × G`` chunk plans for ``R`` lanes and ``G``
global chunks); here one walk plans each global chunk once and adds its size to its owner's
total (``O(G)`` for all lanes together), starting from the earliest lane's state. When the
walk reaches a lane's chunk index it checks that its own state there is the lane's; a lane
whose state the walk does not reach (a state not on this schedule) is counted on its own.

The kernel (``Scheduler.count_lanes``) walks in stretches of :data:`COUNT_STRETCH` chunks, so
Ctrl-C is answered between them; :func:`count_lanes_reference` defines it.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from zephon.core.cache import scheduler
from zephon.core.config import SourceConfig
from zephon.core.index import check_indexable, remaining_samples
from zephon.core.schedule import Ended, SourceState, plan_next_reference, state_arrays, state_from_arrays

COUNT_STRETCH = 1 << 20  # global chunks one kernel call walks
_NEVER = np.iinfo(np.int64).max


def count_lanes_reference(config: SourceConfig, state: SourceState, replicas: int, starts: Sequence[int],
                          totals: list[int], stop: int) -> tuple[SourceState, bool]:
    """What ``Scheduler.count_lanes`` does, slowly: walk ``config`` (lane 0 of 1) from ``state``
    to global chunk ``stop`` or the end, adding each chunk's samples to the ``totals`` entry of
    its owner among ``replicas`` lanes when the chunk is at or after that lane's ``starts``
    entry. Returns the state reached and whether the stream ended."""
    while state.chunk_index < stop:
        planned = plan_next_reference(state, config)
        if isinstance(planned, Ended):
            return state, True
        owner = config.routing.lane_of(config.lane_key, planned.chunk_index, replicas)
        if planned.chunk_index >= starts[owner]:
            totals[owner] += sum(planned.quotas)
        state = planned.state
    return state, False


def remaining_by_lane(template: SourceConfig, states: Mapping[int, SourceState],
                      lane_config: Callable[[int], SourceConfig], replicas: int) -> dict[int, int]:
    """Samples each lane of ``states`` (its chunk-start state; lane -> state, of ``replicas``
    lanes) still yields under the unbound config ``template``; ``lane_config(lane)`` is a
    lane's own config, for a lane counted on its own."""
    kernel = scheduler(template)
    lanes = sorted(states, key=lambda lane: states[lane].chunk_index)
    if kernel is None or template.lane_binding != (0, 1) or not lanes or any(states[k].requeue for k in lanes):
        return {lane: remaining_samples(states[lane], lane_config(lane)) for lane in lanes}
    check_indexable(template)  # a stream that repeats forever (or is too long) has no count
    n = len(template.datasets)
    starts, totals = np.full(replicas, _NEVER, dtype=np.int64), np.zeros(replicas, dtype=np.int64)
    arrays = state_arrays(states[lanes[0]], n)
    g, ended, alone = states[lanes[0]].chunk_index, False, []
    for lane in lanes:
        target = states[lane].chunk_index
        while g < target and not ended:
            g, ended = kernel.count_lanes(g, *arrays, replicas, template.routing.code, template.lane_key, starts,
                                          totals, min(target, g + COUNT_STRETCH))
        if g == target and not ended and state_from_arrays(g, states[lane].alloc, *arrays) == states[lane]:
            starts[lane] = target
        else:
            alone.append(lane)
    while not ended:
        g, ended = kernel.count_lanes(g, *arrays, replicas, template.routing.code, template.lane_key, starts, totals,
                                      g + COUNT_STRETCH)
    out = {lane: int(totals[lane]) for lane in lanes}
    out.update({lane: remaining_samples(states[lane], lane_config(lane)) for lane in alone})
    return out

