"""zephon's collate of a batch's fields against torch's ``default_collate``."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from torch.utils.data import default_collate  # noqa: E402

from zephon.torch._collate import collate_values  # noqa: E402

INT64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
SCALARS = st.one_of(INT64, st.integers(), st.floats(), st.booleans(), st.none(), st.text(max_size=2),
                    st.just(np.int64(7)), st.just(np.float32(0.5)))


def _same(ours, theirs) -> bool:
    if isinstance(theirs, torch.Tensor):
        return (type(ours) is torch.Tensor and ours.dtype == theirs.dtype and ours.shape == theirs.shape
                and all(a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
                        for a, b in zip(ours.tolist(), theirs.tolist())))
    return ours == theirs


def _outcome(collate, values):
    try:
        return "made", collate(values)
    except Exception as error:  # noqa: BLE001 - the two must fail alike
        return "raised", type(error)


@given(st.one_of(st.lists(INT64, min_size=1), st.lists(st.floats(), min_size=1),
                 st.lists(st.one_of(INT64, st.floats(), st.booleans()), min_size=1),
                 st.lists(SCALARS, min_size=1, max_size=6)))
def test_a_fields_values_collate_as_torch_collates_them(values):
    ours, theirs = _outcome(collate_values, values), _outcome(default_collate, values)
    assert ours[0] == theirs[0] and (ours[1] is theirs[1] if ours[0] == "raised" else _same(ours[1], theirs[1]))


def test_numbers_take_the_numpy_way_and_the_batch_owns_them():
    values = [3, -1, 2 ** 62]
    batch = collate_values(values)
    assert batch.dtype == torch.int64 and batch.tolist() == values
    batch[0] = 9  # a training step may write into its batch
    assert collate_values([1.5, 2]).dtype == torch.float64
    assert collate_values([1, 2.5]).dtype == default_collate([1, 2.5]).dtype  # torch's float32, not numpy's float64
