"""Lane routing: which lane owns global chunk ``g``, stated forwards and inversely side by side.

Every lane walks the same global chunk schedule; a routing decides ownership. The forward rule
``lane_of(key, g, R)`` defines it; the inverse ``next_own(key, g, lane, R)`` (the first chunk
``>= g`` the lane owns) is what the scheduling kernel runs to skip other lanes' chunks
(``_next_own`` in ``_ext/schedule.pyx``, which switches on ``code``). tests/test_routing.py
checks that each inverse agrees with its forward rule.

| ``lane_assignment`` | :class:`Routing` | ``code`` |
|---|---|---|
| ``"modulo"`` | :class:`ModuloRouting`: ``g % R`` | 0 |
| ``"permute"`` | :class:`PermuteRouting`: a keyed permutation of the lanes per block of ``R`` chunks | 1 |

A new routing is one class here with the next code, one entry in ``ROUTINGS`` and one case in
``_next_own``.

**Compatibility**: both rules define streams; changing one changes the checkpoint version.
"""
from __future__ import annotations

from typing import Protocol

from zephon.core.keys import derive
from zephon.core.perm import perm_inverse_reference, perm_reference


class Routing(Protocol):
    """A lane routing: a pure rule from ``(key, g, R)`` to the owning lane, and its inverse."""

    name: str  # the ``lane_assignment`` value that selects it
    code: int  # its case in the scheduling kernel

    def lane_of(self, key: int, g: int, replicas: int) -> int:
        """The lane that owns global chunk ``g`` of ``replicas`` lanes (``key``: the lane key)."""
        ...

    def next_own(self, key: int, g: int, lane: int, replicas: int) -> int:
        """The first global chunk ``>= g`` that ``lane`` owns."""
        ...


class ModuloRouting:
    """Chunk ``g`` belongs to lane ``g % R``."""

    name, code = "modulo", 0

    def lane_of(self, key: int, g: int, replicas: int) -> int:
        return g % replicas

    def next_own(self, key: int, g: int, lane: int, replicas: int) -> int:
        return g + (lane - g % replicas) % replicas


class PermuteRouting:
    """Each block of ``R`` chunks goes to the lanes in a keyed order: chunk ``g`` belongs to
    ``perm(derive(key, g // R))(g % R)``."""

    name, code = "permute", 1

    def lane_of(self, key: int, g: int, replicas: int) -> int:
        return perm_reference(derive(key, g // replicas), replicas, g % replicas)

    def next_own(self, key: int, g: int, lane: int, replicas: int) -> int:
        block = g // replicas
        while True:
            own = block * replicas + perm_inverse_reference(derive(key, block), replicas, lane)
            if own >= g:
                return own
            block += 1


ROUTINGS: dict[str, Routing] = {r.name: r for r in (ModuloRouting(), PermuteRouting())}
