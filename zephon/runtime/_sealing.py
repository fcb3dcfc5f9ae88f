"""Sealing a reader's ledger: the states its lanes recorded as cheap ``state_token()`` tuples,
turned into the ``state_dict()`` form a checkpoint holds only when one is asked for.

:class:`Sealer` seals one lane's token on a clone of that lane; :class:`SealingLedger` is a
ledger whose states are sealed as they are read, and gives a checkpoint of many lanes of a
``StaticMixtureWorkSource`` or a ``PhasedMixtureWorkSource`` their states field by field
instead, without a clone, a state dict or a seal per lane: sealed one by one, the lanes of a
process reading 16,384 took one second (three, phased) to save.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, NamedTuple, cast

from zephon.core.checkpoint import KEY_CHUNK, KEY_DIGEST, KEY_LANE, KEY_MIGRATIONS, KEY_STATE, canonical, state_fields
from zephon.work import PhasedMixtureWorkSource, StaticMixtureWorkSource, WorkSource
from zephon.work.phased_mixture import KEY_INNER, KEY_ORIGIN
from zephon.work.static_mixture import RESTORED_SETTINGS

# (lane state at the start of the chunk in flight, samples consumed from it, turn flags)
Entry = tuple[Mapping[str, Any], int, int]
# The sources whose states a loader state keeps without their seals, and :meth:`SealingLedger.fields`
# makes field by field (exactly these: a subclass may change its states), each with the keys of the
# states nested in its own that are sealed in their own right.
SEALING_SOURCES: dict[type, tuple[str, ...]] = {StaticMixtureWorkSource: (), PhasedMixtureWorkSource: (KEY_INNER,)}


def _chunk_reader(template: WorkSource) -> Callable[[Any], int] | None:
    """``template.token_chunk_index`` when it reads the tokens its ``state_token`` makes; None
    for a source without one, or a subclass that makes its own tokens without saying how to
    read their chunk index."""
    index = getattr(template, "token_chunk_index", None)
    mro = type(template).__mro__
    makes = next((c for c in mro if "state_token" in vars(c)), object)
    reads = next((c for c in mro if "token_chunk_index" in vars(c)), None)
    if index is None or reads is None or not issubclass(reads, makes):
        return None
    return cast(Callable[[Any], int], index)


class Sealer:
    """Lane states recorded as ``state_token()`` turned into ``state_dict()`` form, for the ledger
    entries a caller asks for (a checkpoint, a count, the stats). Each lane gets a clone of
    ``template`` (lane of ``canonical_replicas``), restored to its starting ``entries`` state
    (a ledger's, restored as :class:`LaneMux` restores them) the first time one of its tokens
    is sealed; states already in ``state_dict()`` form pass through, and a lane's last sealed
    token is remembered (a packed lane asks for the same one turn after turn)."""

    def __init__(self, template: WorkSource, canonical_replicas: int, entries: Mapping[int, Entry]):
        self._template, self._replicas = template, canonical_replicas
        self._starts = {lane: state for lane, (state, _, _) in entries.items()}
        self._clones: dict[int, WorkSource] = {}
        self._last: dict[int, tuple[Any, Mapping[str, Any]]] = {}
        self._chunk_of = _chunk_reader(template)

    @property
    def template(self) -> WorkSource:
        return self._template

    @property
    def canonical_replicas(self) -> int:
        return self._replicas

    def start(self, lane: int) -> Mapping[str, Any]:
        """Lane ``lane``'s starting state, which its clone is restored to."""
        return self._starts[lane]

    def __call__(self, lane: int, state: Any) -> Mapping[str, Any]:
        if type(state) is dict or isinstance(state, Mapping):  # dict first: the Mapping check is slow
            return state
        last = self._last.get(lane)
        if last is not None and last[0] is state:
            return last[1]
        clone = self._clones.get(lane)
        if clone is None:
            clone = self._clones[lane] = self._template.clone_for_lane(lane, self._replicas)
            clone.restore_checked(self._starts[lane])
        sealed = clone.state_from_token(state)
        self._last[lane] = (state, sealed)
        return sealed

    def furthest(self, states: Mapping[int, Any]) -> list[Mapping[str, Any]]:
        """Of ``states`` (lane -> token), the one of the furthest chunk, sealed, when the source
        reads its tokens' chunk index (``token_chunk_index``); else each one sealed. The stats
        keep only the furthest, and sealing a state costs tens of microseconds (a reader of eight
        lanes sealed eight at each look: a fifth of the trainer's time on pointers)."""
        index = self._chunk_of
        if index is None or not all(type(state) is tuple for state in states.values()):
            return [self(lane, state) for lane, state in states.items()]
        lane = max(states, key=lambda lane: index(states[lane]), default=None)
        return [] if lane is None else [self(lane, states[lane])]


class LaneColumns(NamedTuple):
    """A loader state's lanes, ascending, with their consumed counts and turn flags, and the rests
    of their source states past the part they all share: ``state`` is their column, or (from
    :meth:`SealingLedger.fields`) their values field by field, one list per field, nested as the
    states' dicts nest."""

    lanes: list[int]
    consumed: list[int]
    turn: list[int]
    state: Any


class SealingLedger(Mapping[int, Entry]):
    """Lane -> entry, each lane's state sealed when it is read, by the :class:`Sealer` of the
    reader that recorded it (:meth:`add`); :meth:`fields` gives them all at once."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Any, int, int]] = {}
        self._sealers: dict[int, Sealer | None] = {}

    def add(self, entries: Mapping[int, tuple[Any, int, int]], sealer: Sealer | None) -> None:
        """A reader's ``entries``, their states tokens that ``sealer`` seals (None: sealed already)."""
        self._entries.update(entries)
        self._sealers.update(dict.fromkeys(entries, sealer))

    def __getitem__(self, lane: int) -> Entry:
        state, consumed, flags = self._entries[lane]
        sealer = self._sealers[lane]
        return (state if sealer is None else sealer(lane, state)), consumed, flags

    def __contains__(self, lane: object) -> bool:
        return lane in self._entries  # without sealing it

    def __iter__(self) -> Iterator[int]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def fields(self, nested: tuple[str, ...] = ()) -> tuple[dict[str, Any], LaneColumns] | None:
        """The sealed states as a loader state stores them with their seals left out (and those
        of the states their ``nested`` keys hold), made from the tokens: the part they all share
        and :class:`LaneColumns` of the rest, field by field. Only where the lanes are two or more
        of one ``StaticMixtureWorkSource`` or ``PhasedMixtureWorkSource`` (exactly those classes,
        the same object and lane count for every sealer), every state is a token (a phased one's
        in one phase, never migrated, its ``"inner"`` seal left out), their chunk indices are not
        all the same, all or none of them have requeued samples to serve first, and every lane
        was restored to the same settings (``_settings`` of its starting state); None otherwise.
        Only the first lane is sealed (restored from its starting state, for the shared part):
        the others' starting states are taken as checked, as a loader checks them when it loads
        them."""
        lanes = sorted(self._entries)
        tokens = [self._entries[lane][0] for lane in lanes]
        sealer = self._sealer_of_alike(lanes, tokens)
        if sealer is None:
            return None
        phased = type(sealer.template) is PhasedMixtureWorkSource
        if phased and (KEY_INNER not in nested or any(token[0] != tokens[0][0] or token[2] is not None
                                                      for token in tokens)):
            return None
        config = cast(StaticMixtureWorkSource | PhasedMixtureWorkSource, sealer.template).config
        state = state_fields([token[1] for token in tokens], config.phases[tokens[0][0]]) if phased \
            else state_fields(tokens, config)
        if state is None or state[KEY_CHUNK].count(state[KEY_CHUNK][0]) == len(lanes):
            return None  # all at one chunk: their states may all be the same, so shared
        first = sealer(lanes[0], tokens[0])
        key = KEY_INNER if phased else KEY_STATE
        fields = {KEY_LANE: lanes, key: _inner_fields(first[KEY_INNER], lanes, state) if phased else state}
        common = {k: v for k, v in first.items() if k not in (KEY_LANE, key, KEY_DIGEST)}
        rests = {k: fields[k] for k in first if k in fields}  # in the sealed state's order
        return common, LaneColumns(lanes, [self._entries[lane][1] for lane in lanes],
                                   [self._entries[lane][2] for lane in lanes], rests)

    def _sealer_of_alike(self, lanes: list[int], tokens: list[Any]) -> Sealer | None:
        """The first lane's sealer where :meth:`fields` may apply to ``lanes`` (ascending) and
        their ``tokens``; None where it does not."""
        sealer = self._sealers[lanes[0]] if lanes else None
        if (len(lanes) < 2 or sealer is None or type(sealer.template) not in SEALING_SOURCES
                or any(type(token) is not tuple for token in tokens)):
            return None
        start = _settings(sealer.start(lanes[0]))
        for lane in lanes:
            other = self._sealers[lane]
            if (other is None or other.template is not sealer.template
                    or other.canonical_replicas != sealer.canonical_replicas
                    or not _same(_settings(other.start(lane)), start)):
                return None
        return sealer


def _inner_fields(inner: Mapping[str, Any], lanes: list[int], state: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``lanes``' inner states (a phased state's), their seals left out: ``inner``'s
    (the first lane's) lane binding and ``state`` replaced by the lanes' and their ``state``, the
    rest every lane has (each lane of one template in one phase has the same header)."""
    n = len(lanes)
    return {key: lanes if key == KEY_LANE else state if key == KEY_STATE else [value] * n
            for key, value in inner.items() if key != KEY_DIGEST}


def _settings(state: Mapping[str, Any]) -> tuple[Any, ...]:
    """The values of a lane's starting state that set its restored settings: a static state's
    ``RESTORED_SETTINGS``; a phased one's migration history and origin, and its inner state's."""
    inner = state.get(KEY_INNER)
    if not isinstance(inner, Mapping):
        return tuple(state.get(key) for key in RESTORED_SETTINGS)
    return (state.get(KEY_MIGRATIONS), state.get(KEY_ORIGIN), *(inner.get(key) for key in RESTORED_SETTINGS))


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two lanes' ``_settings`` agree."""
    return all(x is y or canonical(x) == canonical(y) for x, y in zip(a, b))
