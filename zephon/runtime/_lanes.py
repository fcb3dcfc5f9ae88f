"""Which lanes a rank owns, and which of those each DataLoader worker owns.

Lanes are the unit of determinism (``canonical_replicas`` of them, fixed for the whole run);
ranks and workers only decide who reads which lane. Both levels use the same rule:

* ``"contiguous"`` — item ``i`` of ``n`` goes to part ``floor(i · k / n)`` of ``k``
  (balanced contiguous blocks: 8 lanes on 3 ranks → ``[0, 1, 2]``, ``[3, 4, 5]``, ``[6, 7]``);
* ``"interleaved"`` — item ``i`` goes to part ``i mod k``.

Pure functions of integers: every rank computes every other rank's share locally.
"""
from __future__ import annotations

from typing import Sequence

CONTIGUOUS, INTERLEAVED = "contiguous", "interleaved"
MAPPINGS = (CONTIGUOUS, INTERLEAVED)


def check_mapping(mapping: object) -> str:
    if mapping not in MAPPINGS:
        raise ValueError(f"mapping={mapping!r} is not supported; pass one of {list(MAPPINGS)}")
    return mapping


def share(items: Sequence[int], part: int, parts: int, mapping: str) -> list[int]:
    """The items of ``part`` (of ``parts``) under ``mapping``; order kept, parts are disjoint."""
    if not 0 <= part < parts:
        raise ValueError(f"part {part} of {parts} does not exist: it must be in 0 .. {parts - 1}")
    n = len(items)
    if mapping == INTERLEAVED:
        return list(items[part::parts])
    return list(items[-(-part * n // parts):-(-(part + 1) * n // parts)])  # i with (i * parts) // n == part


def rank_lanes(canonical_replicas: int, rank: int, world_size: int, mapping: str) -> list[int]:
    """The lanes of ``rank`` (of ``world_size``); empty when there are more ranks than lanes."""
    return share(range(canonical_replicas), rank, world_size, mapping)


def worker_lanes(lanes: Sequence[int], worker: int, num_workers: int, mapping: str) -> list[int]:
    """The lanes of DataLoader worker ``worker`` among a rank's ``lanes``."""
    return share(list(lanes), worker, num_workers, mapping)
