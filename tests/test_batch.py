"""The batch kernel's radix sort against its twin, numpy's stable argsort, at every key width."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon._ext.batch import stable_order


@st.composite
def key_arrays(draw: st.DrawFn) -> np.ndarray:
    """Keys below 2**bits (0 to 6 radix passes), drawn from a few values so that many tie."""
    bits = draw(st.integers(0, 62))
    values = draw(st.lists(st.integers(0, 2**bits - 1), min_size=1, max_size=8))
    return np.array(draw(st.lists(st.sampled_from(values), max_size=300)), dtype=np.int64)


@given(key_arrays(), st.booleans())
def test_the_radix_sort_matches_a_stable_argsort(keys, presorted):
    keys = np.sort(keys) if presorted else keys
    order = stable_order(keys)
    assert order.dtype == np.int64
    assert order.tolist() == np.argsort(keys, kind="stable").tolist()


def test_negative_keys_are_refused():
    with pytest.raises(ValueError, match=r"keys\[1\] = -3"):
        stable_order(np.array([4, -3], dtype=np.int64))
