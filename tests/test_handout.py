"""The handout kernel (a loader's units round robin over its readers) against its twin."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon._ext.handout import Cursor, RoundRobin
from zephon.runtime._handout import RoundRobinReference

KEYS = ("unit", "names")


class _Budget:
    """An equal-steps budget as the handout reads it: ``left`` falls as ``given`` grows."""

    def __init__(self, target: int):
        self.target, self.given = target, 0

    @property
    def left(self) -> int:
        return self.target - self.given


def _scripted(base: type) -> type:
    """``base`` with each reader's bundles played from a script: ``{reader: [(units, names or None, make or
    None)]}``."""

    class Scripted(base):  # type: ignore[misc, valid-type]
        def setup(self, scripts: dict[int, list[tuple[list[Any], Any, Any]]], record: type) -> None:
            self.scripts, self.record, self.ended = {r: list(s) for r, s in scripts.items()}, record, []

        def refill(self, reader: int) -> Any:
            while self.scripts[reader]:  # a bundle without units is passed over, as the loader's are
                units, names, make = self.scripts[reader].pop(0)
                if units:
                    cursor = self.record()
                    start = self.positions[reader]
                    cursor.bundle, cursor.units, cursor.names, cursor.make = None, list(units), names, make
                    cursor.ends = list(range(start + 1, start + len(units) + 1))
                    cursor.next, cursor.count, cursor.counted = 0, len(units), 0
                    self.cursors[reader] = cursor
                    return cursor
            return None

        def finish(self) -> None:
            self.ended.append("finish")

        def run_out(self) -> None:
            self.ended.append("run_out")

    return Scripted


class _Names:
    """A bundle's names, whose unit ``bad`` raises as a batch of a wrong component id does."""

    def __init__(self, names: list[list[str]], bad: int | None):
        self.names, self.bad = names, bad

    def __getitem__(self, k: int) -> list[str]:
        if k == self.bad:
            raise ValueError(f"unit {k}: an id names no component")
        return self.names[k]


class _Make:
    """Makes a unit as it is handed out (``("made", unit)``); the unit ``bad`` raises."""

    def __init__(self, bad: str | None):
        self.bad = bad

    def __call__(self, unit: str) -> tuple[str, str]:
        if unit == self.bad:
            raise ValueError(f"{unit}: cannot be made")
        return "made", unit


@st.composite
def plays(draw: st.DrawFn) -> tuple[list[int], dict[int, list[Any]], int | None]:
    readers = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4, unique=True))
    scripts = {}
    for reader in readers:
        bundles = []
        for count in draw(st.lists(st.integers(0, 4), max_size=4)):
            units = [f"{reader}.{k}" for k in range(count)]
            named, bad = draw(st.booleans()), draw(st.none() | st.integers(0, 3))
            names = _Names([[f"n{reader}"] * k for k in range(count)], bad)
            make = draw(st.none() | st.builds(_Make, st.none() | st.sampled_from(units or ["-"])))
            bundles.append((units, names if named else None, make))
        scripts[reader] = bundles
    return readers, scripts, draw(st.none() | st.integers(0, 12))


def _play(base: type, record: type, readers: list[int], scripts: dict[int, list[Any]], target: int | None
          ) -> tuple[list[Any], list[str]]:
    even = None if target is None else _Budget(target)
    robin = _scripted(base)(readers, dict.fromkeys(readers, 0), 3, KEYS, even)
    robin.setup(scripts, record)
    seen = []
    while True:
        try:
            unit = next(robin)
        except (StopIteration, ValueError) as stop:  # a unit whose making or names raise changes nothing
            seen.append((type(stop).__name__, dict(robin.positions), list(robin.recent), robin.yielded,
                         robin.upcoming(), [(r, c.next) for r, c in robin.cursors.items() if c is not None]))
            return seen, robin.ended
        seen.append((unit, dict(robin.positions), list(robin.recent), robin.yielded, robin.upcoming(),
                     None if even is None else even.given))


@given(plays())
def test_the_kernel_matches_its_twin(play):
    readers, scripts, target = play
    assert _play(RoundRobin, Cursor, *play) == _play(RoundRobinReference, SimpleNamespace, *play)
    units, ended = _play(RoundRobin, Cursor, *play)
    if units[-1][0] == "ValueError":  # stopped at a unit whose making or names raised: none of it was taken
        before = units[-2][1:4] if len(units) > 1 else (dict.fromkeys(readers, 0), [], 0)
        assert units[-1][1:4] == before
        return
    made = sum(len(bundle[0]) for script in scripts.values() for bundle in script)
    assert len(units) - 1 == (made if target is None else min(made, target))
    assert ended == (["finish"] if target is None or made < target else ["run_out"])


def test_readers_take_turns_and_the_ended_ones_are_passed_over():
    scripts = {0: [(["a0", "a1"], None, None)], 1: [(["b0"], None, None), ([], None, None), (["b1", "b2"], None, None)],
               2: []}
    robin = _scripted(RoundRobin)([1, 2, 0], dict.fromkeys([0, 1, 2], 0), 2, KEYS)
    robin.setup(scripts, Cursor)
    assert list(robin) == ["b0", "a0", "b1", "a1", "b2"]
    assert robin.positions == {0: 2, 1: 3, 2: 0} and list(robin.recent) == [(0, 1), (1, 2)]
    assert robin.ended == ["finish"] and robin.upcoming() is None


def test_a_named_unit_is_handed_out_with_its_names():
    robin = _scripted(RoundRobin)([0], {0: 5}, 1, KEYS)
    robin.setup({0: [(["p0", "p1"], [["x"], ["y", "z"]], None)]}, Cursor)
    assert list(robin) == [{"unit": "p0", "names": ["x"]}, {"unit": "p1", "names": ["y", "z"]}]
    assert robin.positions == {0: 7}


def test_a_cursor_past_its_units_raises_in_the_kernel_as_in_its_twin():
    for base, record in ((RoundRobin, Cursor), (RoundRobinReference, SimpleNamespace)):
        robin = _scripted(base)([0], {0: 0}, 1, KEYS)
        robin.setup({0: [(["p0"], None, None)]}, record)
        cursor = robin.refill(0)
        cursor.count = 3  # a cursor that claims more units than it holds
        assert next(robin) == "p0"
        with pytest.raises(IndexError):
            next(robin)
        assert robin.positions == {0: 1} and robin.yielded == 1
