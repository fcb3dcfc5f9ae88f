"""ensure_mixture: the token mixture of a lane's packed stream, measured or enforced.

``"report"`` changes nothing: the loader counts the real tokens per component of what it
delivers and says when a share leaves ``tolerance`` of its target. ``"strict"`` (over a
``"concat"`` packer) queues the lane's documents per component and fills each sequence from
the component furthest behind its target share of the tokens placed so far, a piece at a time
(at most what the open sequence still takes), so every prefix of the lane's packed stream holds
each component within about one sequence of its target. It waits for a component only while
fewer than ``queue`` documents are queued and the lane may still deliver it; past that it
takes the queued component furthest behind (the one it waited for is counted as ``late``:
the lane delivers too little of it, or nothing more), and once the lane has ended it
finishes what is queued.

The state: the packer's (``zephon.ops.pack``), the queued documents (the lane's documents
from the oldest one held, those not yet fully placed, with the offset of any partly placed),
and the real tokens placed per component.
"""
from __future__ import annotations

import base64
import math
import numbers
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from zephon.limits import show
from zephon.ops import pack
from zephon.ops.pack import Doc, PackConfig, PackState, Piece

REPORT, STRICT = "report", "strict"
QUEUE = 256  # documents strict mode may queue per lane
MAX_QUEUE = 1 << 16


@dataclass(frozen=True)
class MixtureConfig:
    """The settings of ``Pipeline.ensure_mixture``, resolved: target token ``shares`` per
    component id (summing to 1)."""

    mode: str
    shares: tuple[float, ...]
    tolerance: float
    queue: int


@dataclass(frozen=True)
class StrictState:
    """Strict mode: the packer's state, the queued pieces per component id (the rest of each
    queued document), the real tokens placed per component, and whether the lane has ended."""

    pack: PackState
    queues: tuple[tuple[Piece, ...], ...]
    placed: tuple[int, ...]
    ended: bool = False
    late: tuple[int, ...] = ()  # per component: times it was furthest behind with nothing of it queued


def config(mode: str, shares: Mapping[str, float], vocabulary: Mapping[str, int], tolerance: float,
           queue: int) -> MixtureConfig:
    """Check ``ensure_mixture``'s settings against the pipeline's components (``vocabulary``)."""
    if mode not in (REPORT, STRICT):
        raise ValueError(f"ensure_mixture(mode={mode!r}) must be {REPORT!r} or {STRICT!r}")
    unknown = sorted(set(shares) - set(vocabulary))
    bad = {k: v for k, v in shares.items() if isinstance(v, bool) or not isinstance(v, numbers.Real)
           or not math.isfinite(v) or v < 0}
    if unknown or bad or not sum(shares.values()) > 0:
        raise ValueError(f"ensure_mixture(weights={show(dict(shares))}): weights must be finite numbers >= 0, "
                         f"not all 0, for components of the pipeline ({sorted(vocabulary)})")
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not 0 < tolerance < 1:
        raise ValueError(f"ensure_mixture(tolerance={tolerance!r}) must be a number in (0, 1): the relative error "
                         "of a share that is reported")
    if type(queue) is not int or not 1 <= queue <= MAX_QUEUE:
        raise ValueError(f"ensure_mixture(queue={queue!r}) must be an int in 1 .. {MAX_QUEUE} (documents)")
    total = float(sum(shares.values()))
    out = [0.0] * (max(vocabulary.values(), default=-1) + 1)
    for name, weight in shares.items():
        out[vocabulary[name]] = float(weight) / total
    return MixtureConfig(mode, tuple(out), float(tolerance), queue)


def init(config: MixtureConfig, packing: PackConfig) -> StrictState:
    if packing.strategy != pack.CONCAT:
        raise ValueError(f"ensure_mixture(mode='strict') fills sequences piece by piece: it needs "
                         f"pack(strategy='concat'), not {packing.strategy!r}")
    kinds = len(config.shares)
    return StrictState(pack.init(packing), ((),) * kinds, (0,) * kinds, False, (0,) * kinds)


def step(config: MixtureConfig, packing: PackConfig, state: StrictState, doc: Doc) -> StrictState:
    """Queue ``doc`` and fill sequences as far as the rule allows without waiting."""
    queues = list(state.queues)
    if doc.component >= len(queues) or config.shares[doc.component] == 0:
        raise ValueError(f"ensure_mixture(mode='strict'): the lane delivered component id {doc.component}, which "
                         "has no target share; give every component of the source a weight")
    if len(doc.tokens):
        queues[doc.component] += (Piece(doc, 0, len(doc.tokens)),)
    return _fill(config, packing, state, queues)


def finish(config: MixtureConfig, packing: PackConfig, state: StrictState) -> tuple[StrictState, int]:
    """The lane ended: place everything queued, then finish the packer."""
    state = _fill(config, packing, replace(state, ended=True), list(state.queues))
    packed, dropped = pack.finish(packing, state.pack)
    return replace(state, pack=packed), dropped


def _behind(shares: Sequence[float], placed: Sequence[int], candidates: Sequence[int]) -> int:
    """The candidate (ascending ids) furthest below its share of the tokens placed (shares
    renormalised over the candidates; ties: the lowest id)."""
    total = sum([placed[c] for c in candidates]) + 1
    weight = sum([shares[c] for c in candidates])
    best, most = candidates[0], shares[candidates[0]] / weight * total - placed[candidates[0]]
    for c in candidates[1:]:
        need = shares[c] / weight * total - placed[c]
        if need > most:
            best, most = c, need
    return best


def _fill(config: MixtureConfig, packing: PackConfig, state: StrictState,
          queues: list[tuple[Piece, ...]]) -> StrictState:
    """``state`` with ``queues`` in place of its own, filled as far as the rule allows."""
    placed, packed, late = list(state.placed), state.pack, list(state.late)
    shares = config.shares
    alive = [c for c, share in enumerate(shares) if share > 0]
    waiting = sum(map(len, queues))  # what is held, weighted or not (a restored state may hold either)
    while any(queues[c] for c in alive):
        if state.ended:
            c = _behind(shares, placed, [c for c in alive if queues[c]])
        else:
            c = _behind(shares, placed, alive)
            if not queues[c]:
                if waiting < config.queue:
                    break  # wait: the lane may still deliver it
                late[c] += 1
                c = _behind(shares, placed, [c for c in alive if queues[c]])
        head = queues[c][0]
        k = min(pack.free(packing, packed), head.size)
        if k < head.size:
            packed = pack.place(packing, packed, Piece(head.doc, head.start, head.start + k))
            queues[c] = (Piece(head.doc, head.start + k, head.end),) + queues[c][1:]
        else:
            packed = pack.place(packing, packed, head)
            queues[c] = queues[c][1:]
            waiting -= 1
        placed[c] += k
    return StrictState(packed, tuple(queues), tuple(placed), state.ended, tuple(late))


def oldest(state: StrictState) -> int | None:
    queued = (q[0].doc.index for q in state.queues if q)
    return min([*queued, *([] if (o := pack.oldest(state.pack)) is None else [o])], default=None)


def _bits(flags: Sequence[bool]) -> str:
    return base64.b64encode(np.packbits(np.array(flags, dtype=bool)).tobytes()).decode()


def state_to_json(state: StrictState, base: int, window: int) -> dict[str, Any]:
    """The state as JSON over the ``window`` documents from lane index ``base``: which are
    queued (a bitmap), where each partly placed one resumes, the tokens placed per component."""
    queued = [False] * window
    heads = []
    for q in state.queues:
        for piece in q:
            queued[piece.doc.index - base] = True
        if q and q[0].start:
            heads.append([q[0].doc.index - base, q[0].start])
    return {"pack": pack.state_to_json(state.pack, base), "queued": _bits(queued), "heads": heads,
            "placed": list(state.placed), "late": list(state.late), "ended": state.ended}


def _checked(config: MixtureConfig, data: Any) -> tuple[np.ndarray, dict[int, int]]:
    """The queued bitmap and the heads of a JSON state, refused unless this rule could have
    made it (all that can be told without its documents)."""
    keys, kinds = ["ended", "heads", "late", "pack", "placed", "queued"], len(config.shares)
    if not (isinstance(data, dict) and sorted(data) == keys and type(data["queued"]) is str
            and isinstance(data["heads"], list) and isinstance(data["placed"], list)
            and all(type(v) is int and v >= 0 for v in data["placed"]) and isinstance(data["late"], list)
            and all(type(v) is int and v >= 0 for v in data["late"]) and type(data["ended"]) is bool
            and len(data["placed"]) == len(data["late"]) == kinds):
        raise ValueError(f"ensure_mixture state must be a dict of {keys} ('placed' and 'late': {kinds} counts), "
                         f"got {show(data)}")
    queued = _bitmap(data["queued"])
    heads: dict[int, int] = {}
    for head in data["heads"]:
        if not (isinstance(head, list) and len(head) == 2 and all(type(v) is int for v in head)
                and 0 <= head[0] < len(queued) and head[1] > 0 and queued[head[0]] and head[0] not in heads):
            raise ValueError(f"ensure_mixture state: a head must be [document, offset > 0] of a queued document, "
                             f"once, got {show(head)}")
        heads[head[0]] = head[1]
    return queued, heads


def _bitmap(queued: Any) -> np.ndarray:
    try:
        return np.unpackbits(np.frombuffer(base64.b64decode(queued, validate=True), dtype=np.uint8))
    except (ValueError, TypeError):
        raise ValueError(f"ensure_mixture state: 'queued' is not a base64 bitmap: {show(queued)}") from None


def held(data: Any) -> tuple[int, ...]:
    """The documents (from the base) a JSON state holds, queued or packed, ascending; refuses one
    not of its form."""
    if not (isinstance(data, dict) and "pack" in data and "queued" in data):
        raise ValueError(f"ensure_mixture state must hold 'pack' and 'queued', got {show(data)}")
    return tuple(sorted(set(np.flatnonzero(_bitmap(data["queued"])).tolist()) | set(pack.held(data["pack"]))))


def documents_held(config: MixtureConfig, packing: PackConfig, data: Any) -> tuple[int, int] | None:
    """The first and one past the last document (from the base) a JSON state holds, None when
    it holds none; refuses a state this rule could not have made."""
    queued = np.flatnonzero(_checked(config, data)[0]).tolist()
    packed = pack.documents_held(packing, data["pack"])
    ends = ([(queued[0], queued[-1] + 1)] if queued else []) + ([packed] if packed else [])
    return (min(a for a, _ in ends), max(b for _, b in ends)) if ends else None


def state_from_json(config: MixtureConfig, packing: PackConfig, data: Any, docs: Sequence[Doc | None]) -> StrictState:
    """The state of :func:`state_to_json`, with ``docs[i]`` the document ``i`` it names."""
    queued, heads = _checked(config, data)
    queues: list[tuple[Piece, ...]] = [()] * len(config.shares)
    for i in np.flatnonzero(queued).tolist():
        doc = docs[i] if i < len(docs) else None
        start = heads.get(i, 0)
        if doc is None or doc.component >= len(queues) or not 0 <= start < len(doc.tokens):
            raise ValueError(f"ensure_mixture state: queued document {i} does not fit (the data or the tokenizer "
                             "changed since the checkpoint)")
        queues[doc.component] += (Piece(doc, start, len(doc.tokens)),)
    return StrictState(pack.state_from_json(packing, data["pack"], docs), tuple(queues), tuple(data["placed"]),
                       data["ended"], tuple(data["late"]))
