"""The rounds kernels (a reader's lanes' turns interleaved in place; whether a piece lies in its
place) against their twins, and the refusals."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon._ext.rounds import interleave, same_place
from zephon.runtime._stream import interleave_reference, same_place_reference


@st.composite
def rounds(draw: st.DrawFn) -> tuple[int, int, int, int, int, type, bool]:
    """(lanes, unit, rounds, samples to spare after them, seed, dtype of the component ids, stream)."""
    return (draw(st.integers(1, 5)), draw(st.integers(1, 7)), draw(st.integers(0, 6)), draw(st.integers(0, 9)),
            draw(st.integers(0, 2**32 - 1)), draw(st.sampled_from([np.int32, np.int64])), draw(st.booleans()))


@given(rounds())
def test_the_kernel_matches_its_twin(case):
    lanes, unit, k, spare, seed, dtype, stream = case
    rng = np.random.default_rng(seed)
    n = k * lanes * unit + spare
    start = rng.integers(-2**62, 2**62, (n, 3)), rng.integers(0, 2**31, n).astype(dtype)  # what was there stays
    kernel, twin = (start[0].copy(), start[1].copy()), (start[0].copy(), start[1].copy())
    for lane in rng.permutation(lanes).tolist():  # lanes in any order, as they are written one by one
        pointers, components = rng.integers(-2**62, 2**62, (k * unit, 3)), rng.integers(0, 2**31, k * unit)
        interleave(*kernel, pointers, components, lane, lanes, unit, stream)
        interleave_reference(*twin, pointers, components, lane, lanes, unit)
    assert np.array_equal(kernel[0], twin[0]) and np.array_equal(kernel[1], twin[1])
    assert np.array_equal(kernel[0][k * lanes * unit:], start[0][k * lanes * unit:])  # nothing past the rounds


def test_a_lane_outside_the_round_or_arrays_that_cannot_hold_it_are_refused():
    pointers, components = np.zeros((8, 3), dtype=np.int64), np.zeros(8, dtype=np.int64)
    lane = np.ones((4, 3), dtype=np.int64), np.ones(4, dtype=np.int64)
    with pytest.raises(ValueError, match="lane 2 of 2 with turns of 2"):
        interleave(pointers, components, *lane, 2, 2, 2, True)
    with pytest.raises(ValueError, match="with turns of 0"):
        interleave(pointers, components, *lane, 0, 2, 0, True)
    with pytest.raises(ValueError, match=r"shapes \(4, 3\) and \(3,\); pass \(k \* unit, 3\)"):
        interleave(pointers, components, lane[0], lane[1][:3], 0, 2, 2, True)
    with pytest.raises(ValueError, match=r"shapes \(4, 3\) and \(4,\)"):
        interleave(pointers, components, *lane, 0, 2, 3, True)  # 4 samples are not whole turns of 3
    with pytest.raises(ValueError, match=r"2 rounds of 3 lanes need 12 samples"):
        interleave(pointers, components, *lane, 0, 3, 2, True)
    assert not pointers.any() and not components.any()


@st.composite
def places(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Two views of one buffer: each a window of some start, step, dtype and shape of it."""
    base = np.arange(96, dtype=np.int64)

    def view() -> np.ndarray:
        start, step = draw(st.integers(0, 8)), draw(st.sampled_from([1, 2, -1]))
        window = base[start:start + 48] if step > 0 else base[start + 48:start:-1]
        window = window[::step] if step > 0 else window
        dtype = draw(st.sampled_from([np.int64, np.uint64, np.int32]))
        window = np.ascontiguousarray(window).view(dtype) if dtype != np.int64 and step == 1 and draw(
            st.booleans()) else window
        return window.reshape(-1, 3) if draw(st.booleans()) and window.shape[0] % 3 == 0 else window

    return view(), view()


@given(places())
def test_same_place_matches_its_twin(pair):
    array, place = pair
    assert same_place(array, place) == same_place_reference(array, place)
    assert same_place(array, array) and same_place(array, array[:]) and same_place(place, place.view())
