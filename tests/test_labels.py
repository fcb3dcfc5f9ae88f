"""The labels kernel (each batch's component names) against its twin, and its refusals."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon._ext.labels import BatchNames
from zephon.runtime.pipeline import batch_names_reference


@st.composite
def batches(draw: st.DrawFn) -> tuple[tuple, np.ndarray, np.ndarray]:
    names = tuple(draw(st.lists(st.one_of(st.text(max_size=3), st.none()), min_size=1, max_size=5)))
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    ids = np.array(draw(st.lists(st.integers(0, len(names) - 1), max_size=200)), dtype=dtype)
    cuts = sorted(draw(st.lists(st.integers(0, len(ids)), max_size=12)))
    return names, ids, np.array(cuts, dtype=np.int64)


@given(batches())
def test_the_kernel_matches_its_twin(case):
    names, ids, bounds = case
    batches = BatchNames(names, ids, bounds)
    got = [batches[k] for k in range(len(batches))]
    assert got == batch_names_reference(names, ids, bounds.tolist())
    assert all(type(batch) is list for batch in got) and len(got) == max(len(bounds) - 1, 0)
    with pytest.raises(IndexError):
        batches[len(batches)]


def test_ids_without_a_name_and_falling_or_outside_bounds_are_refused():
    with pytest.raises(ValueError, match=r"ids\[2\] = 5 names no component \(there are 2\)"):
        BatchNames(("a", "b"), np.array([0, 1, 5], dtype=np.int64), np.array([0, 3]))[0]
    with pytest.raises(ValueError, match=r"ids\[0\] = -1"):
        BatchNames(("a",), np.array([-1], dtype=np.int32), np.array([0, 1]))[0]
    int32 = BatchNames(("a", "b"), np.array([0, 1, 2, 1], dtype=np.int32), np.array([0, 2, 4]))
    assert int32[0] == ["a", "b"]  # an int32 id is checked when its batch is made
    with pytest.raises(ValueError, match=r"ids\[2\] = 2 names no component \(there are 2\)"):
        int32[1]
    with pytest.raises(ValueError, match=r"bounds\[1\] = 1 is outside 2 \.\. 3"):
        BatchNames(("a",), np.zeros(3, dtype=np.int64), np.array([2, 1]))
    with pytest.raises(ValueError, match=r"bounds\[1\] = 4 is outside 0 \.\. 3"):
        BatchNames(("a",), np.zeros(3, dtype=np.int64), np.array([0, 4]))
