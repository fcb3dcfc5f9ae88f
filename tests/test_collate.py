"""zephon's collate of a batch's fields against torch's ``default_collate``."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from torch.utils.data import default_collate  # noqa: E402

from zephon.torch._collate import collate_values  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy.ndarrays:UserWarning")
INT64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
SCALARS = st.one_of(INT64, st.integers(), st.floats(), st.booleans(), st.none(), st.text(max_size=2),
                    st.just(np.int64(7)), st.just(np.float32(0.5)), st.lists(st.integers(0, 9), max_size=2),
                    st.tuples(st.floats(0, 1)), st.just(np.array([1, 2])), st.just(torch.tensor(3)),
                    st.just(torch.tensor([0.5])))
NUMPY_SCALARS = st.sampled_from([np.bool_(True), np.uint16(2), np.array(np.uint32(5)), np.int8(-1), np.float16(0.5)])


def _same(ours, theirs) -> bool:
    """Equal values, types and dtypes, through lists and tuples (NaN equal to NaN)."""
    if isinstance(theirs, np.ndarray):
        return isinstance(ours, np.ndarray) and ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    if isinstance(theirs, torch.Tensor):
        return (type(ours) is torch.Tensor and ours.dtype == theirs.dtype and ours.shape == theirs.shape
                and _same(ours.tolist(), theirs.tolist()))
    if isinstance(theirs, (list, tuple)):
        return type(ours) is type(theirs) and len(ours) == len(theirs) and all(map(_same, ours, theirs))
    return ours == theirs or (isinstance(ours, float) and isinstance(theirs, float) and math.isnan(ours)
                              and math.isnan(theirs))


def _outcome(collate, values):
    try:
        return "made", collate(values)
    except Exception as error:  # noqa: BLE001 - the two must fail alike
        return "raised", type(error)


@given(st.one_of(st.lists(INT64, min_size=1), st.lists(st.floats(), min_size=1),
                 st.lists(st.one_of(INT64, st.floats(), st.booleans()), min_size=1),
                 st.lists(SCALARS, min_size=1, max_size=6)))
def test_a_fields_values_collate_as_torch_collates_them(values):
    _assert_alike(values)


def _assert_alike(values: list) -> None:
    """``collate_values`` makes what ``default_collate`` makes of ``values``, or raises as it does."""
    ours, theirs = _outcome(collate_values, values), _outcome(default_collate, values)
    assert ours[0] == theirs[0] and (ours[1] is theirs[1] if ours[0] == "raised" else _same(ours[1], theirs[1]))


@given(st.lists(st.sampled_from(["int64", "uint16", "int8", "float32", "float16", "bool", "uint32", "U3"]), min_size=1,
                max_size=2), st.lists(st.sampled_from([(3,), (2,), (2, 2), ()]), min_size=1, max_size=2),
       st.integers(1, 4), st.booleans(), st.data())
def test_numpy_arrays_collate_as_torch_collates_them(dtypes, shapes, n, writable, data):
    """Arrays of one dtype and shape are stacked by numpy (read-only views of token files too);
    mixed ones, strings and the rest raise or collate as ``default_collate`` does."""
    values = [np.ones(data.draw(st.sampled_from(shapes)), dtype=data.draw(st.sampled_from(dtypes))) for _ in range(n)]
    for array in values:
        array.flags.writeable = writable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns (once) when it wraps a read-only array
        theirs = _outcome(default_collate, values)
    with warnings.catch_warnings():
        warnings.simplefilter("error" if theirs[0] == "made" else "ignore")  # a batch that owns its memory
        ours = _outcome(collate_values, values)
    assert ours[0] == theirs[0] and (ours[1] is theirs[1] if ours[0] == "raised" else _same(ours[1], theirs[1]))


@given(st.lists(st.one_of(INT64, st.floats(), NUMPY_SCALARS), min_size=2, max_size=5))
def test_numbers_with_numpy_scalars_among_them_collate_as_torch_collates_them(values):
    """torch refuses some mixes that numpy would make an array of (an int with a numpy bool or
    an unsigned scalar): so must zephon."""
    _assert_alike(values)


def test_numbers_take_the_numpy_way_and_the_batch_owns_them():
    values = [3, -1, 2 ** 62]
    batch = collate_values(values)
    assert batch.dtype == torch.int64 and batch.tolist() == values
    batch[0] = 9  # a training step may write into its batch
    assert collate_values([1.5, 2]).dtype == torch.float64
    assert collate_values([1, 2.5]).dtype == default_collate([1, 2.5]).dtype  # torch's float32, not numpy's float64
