"""The readorder kernel against its Python twin, and the properties of both interleavings."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon._ext import readorder as kernel
from zephon.core.keys import derive
from zephon.core.readorder import (
    MAX_CHUNK,
    random_key,
    read_order,
    read_order_reference,
    round_robin_reference,
)

counts_lists = st.lists(st.integers(0, 40), max_size=6)
seeds = st.integers(-(2**70), 2**70)


def _starts(counts: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])


@settings(max_examples=150, deadline=None)
@given(counts=counts_lists, weighted_random=st.booleans(), shuffle=st.booleans(), seed=seeds)
def test_kernel_matches_reference(counts, weighted_random, shuffle, seed):
    component, rows = read_order(counts, weighted_random=weighted_random, shuffle=shuffle,
                                 seed=seed)
    assert component.dtype == rows.dtype == np.int64
    expected = read_order_reference(counts, weighted_random=weighted_random, shuffle=shuffle,
                                    seed=seed)
    assert (component.tolist(), rows.tolist()) == expected


@pytest.mark.parametrize(
    ("counts", "expected"),
    [([3, 1], "ABAA"), ([5, 3, 2], "ABCABACABA")],
)
def test_round_robin_worked_examples(counts, expected):
    letters = [chr(ord("A") + k) for k in round_robin_reference(counts)]
    assert "".join(letters) == expected
    component, _ = read_order(counts, weighted_random=False, shuffle=False, seed=0)
    assert "".join(chr(ord("A") + k) for k in component) == expected


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 300), min_size=1, max_size=8))
def test_round_robin_prefixes_stay_within_two_of_share(counts):
    component, _ = read_order(counts, weighted_random=False, shuffle=False, seed=0)
    total = sum(counts)
    emitted = np.cumsum(component[:, None] == np.arange(len(counts)), axis=0)  # E_k after t+1
    t = np.arange(1, total + 1)[:, None]
    assert np.all(np.abs(emitted * total - np.array(counts) * t) <= 2 * total)


@settings(max_examples=100, deadline=None)
@given(counts=counts_lists, weighted_random=st.booleans(), shuffle=st.booleans(), seed=seeds)
def test_every_row_once_and_inside_its_component(counts, weighted_random, shuffle, seed):
    component, rows = read_order(counts, weighted_random=weighted_random, shuffle=shuffle,
                                 seed=seed)
    assert sorted(rows.tolist()) == list(range(sum(counts)))
    starts = _starts(counts)
    assert np.all((starts[component] <= rows) & (rows < starts[component + 1]))


@settings(max_examples=100, deadline=None)
@given(counts=counts_lists, weighted_random=st.booleans(), seed=seeds)
def test_as_is_reads_each_component_in_stored_order(counts, weighted_random, seed):
    component, rows = read_order(counts, weighted_random=weighted_random, shuffle=False,
                                 seed=seed)
    for k in range(len(counts)):
        assert np.all(np.diff(rows[component == k]) == 1)


def test_shuffle_permutes_each_component_and_depends_on_the_seed():
    counts = [64, 0, 37, 1]
    starts = _starts(counts)
    orders = []
    for seed in range(10):
        component, rows = read_order(counts, weighted_random=False, shuffle=True, seed=seed)
        local = [sorted(rows[component == k] - starts[k]) for k in range(len(counts))]
        assert local == [list(range(n)) for n in counts]
        orders.append(tuple(rows[component == 0]))
    assert len(set(orders)) == len(orders)
    assert orders[0] != tuple(range(64))


def test_weighted_random_is_deterministic_per_seed_and_differs_across_seeds():
    counts = [100, 100]
    runs = [read_order(counts, weighted_random=True, shuffle=False, seed=s)[0]
            for s in range(20)]
    again = read_order(counts, weighted_random=True, shuffle=False, seed=7)[0]
    assert np.array_equal(runs[7], again)
    agreement = [np.mean(a == b) for i, a in enumerate(runs) for b in runs[i + 1:]]
    assert 0.4 < np.mean(agreement) < 0.6  # independent draws agree about half the time
    assert max(agreement) < 0.8


def test_weighted_random_draws_by_count_share():
    first = [read_order([1, 3], weighted_random=True, shuffle=False, seed=s)[0][0]
             for s in range(2000)]
    assert 0.70 < np.mean(first) < 0.80  # component 1 holds 3/4 of the samples


def test_weighted_random_first_draw_follows_the_formula():
    counts = [2, 5, 3]
    for seed in range(50):
        u = (derive(random_key(seed), 0) >> 11) * 2.0**-53
        x = min(int(u * 10), 9)
        expected = int(np.searchsorted(np.cumsum(counts), x, side="right"))
        component, _ = read_order(counts, weighted_random=True, shuffle=False, seed=seed)
        assert component[0] == expected


def test_empty_and_all_zero_counts_give_empty_orders():
    for counts in ([], [0, 0]):
        for weighted_random in (False, True):
            component, rows = read_order(counts, weighted_random=weighted_random,
                                         shuffle=True, seed=1)
            assert len(component) == len(rows) == 0


@pytest.mark.parametrize("counts", [[-1, 2], [[1, 2]], [MAX_CHUNK, 1]])
def test_read_order_rejects_bad_counts(counts):
    with pytest.raises(ValueError, match="counts"):
        read_order(counts, weighted_random=False, shuffle=False, seed=0)


def test_kernel_rejects_wrong_number_of_shuffle_keys():
    with pytest.raises(ValueError, match="shuffle_keys"):
        kernel.read_order(np.array([1, 2], dtype=np.int64), False, 0,
                          np.zeros(3, dtype=np.uint64))
