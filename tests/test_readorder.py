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
    iter_pairs,
    random_key,
    read_order,
    read_order_reference,
    read_pointers,
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


@settings(max_examples=100, deadline=None)
@given(counts=counts_lists, weighted_random=st.booleans(), shuffle=st.booleans(), seed=seeds,
       data=st.data())
def test_read_pointers_copies_the_reference_rows(counts, weighted_random, shuffle, seed, data):
    total = sum(counts)
    buffer = np.array(data.draw(st.lists(st.tuples(*[st.integers(0, 2**63 - 1)] * 3),
                                         min_size=total, max_size=total)),
                      dtype=np.int64).reshape(total, 3)
    buffer.flags.writeable = False  # a chunk's buffer is read-only
    out = (np.full((total, 3), -1, dtype=np.int64), np.full(total, -1, dtype=np.int64)) \
        if data.draw(st.booleans(), label="into arrays of the caller's") else None
    pointers, component = read_pointers(buffer, counts, weighted_random=weighted_random,
                                        shuffle=shuffle, seed=seed, out=out)
    expected_component, rows = read_order_reference(
        counts, weighted_random=weighted_random, shuffle=shuffle, seed=seed)
    assert pointers.dtype == component.dtype == np.int64 and pointers.shape == (total, 3)
    assert out is None or (pointers is out[0] and component is out[1])
    assert component.tolist() == expected_component
    assert pointers.tolist() == buffer[rows].tolist()


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 25), min_size=4, max_size=12))
def test_round_robin_matches_reference_for_many_components(counts):
    """Up to four non-empty components run in registers; more take the general loop."""
    component, rows = read_order(counts, weighted_random=False, shuffle=False, seed=0)
    expected = read_order_reference(counts, weighted_random=False, shuffle=False, seed=0)
    assert (component.tolist(), rows.tolist()) == expected


@pytest.mark.parametrize(
    "counts",
    [[1], [0, 3, 0], [2, 2], [2, 0, 2, 0, 2], [1, 1, 1, 1], [1, 1, 1, 1, 1], [9, 1, 1, 1],
     [0, 0, 0, 0, 0, 7, 1], [50, 1, 50, 1, 50]],
)
def test_round_robin_ties_and_empty_components_match_reference(counts):
    component, _ = read_order(counts, weighted_random=False, shuffle=False, seed=0)
    assert component.tolist() == round_robin_reference(counts)


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


def test_read_order_rejects_counts_whose_int64_sum_would_wrap():
    with pytest.raises(ValueError, match="counts"):
        read_order([2**62, 2**62, 2**62], weighted_random=False, shuffle=False, seed=0)


def test_read_pointers_rejects_a_buffer_that_does_not_match_the_counts():
    buffer = np.zeros((4, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="buffer"):
        read_pointers(buffer, [2, 1], weighted_random=False, shuffle=False, seed=0)
    with pytest.raises(ValueError):
        read_pointers(np.zeros((3, 2), dtype=np.int64), [2, 1], weighted_random=False,
                      shuffle=False, seed=0)
    for out in [(np.zeros((2, 3), dtype=np.int64), np.zeros(3, dtype=np.int64)),
                (np.zeros((3, 3), dtype=np.int64), np.zeros(4, dtype=np.int64))]:
        with pytest.raises(ValueError, match="output arrays"):
            read_pointers(np.zeros((3, 3), dtype=np.int64), [2, 1], weighted_random=False, shuffle=False, seed=0,
                          out=out)
    frozen = np.zeros((3, 3), dtype=np.int64)
    frozen.flags.writeable = False
    for pointers in [frozen, np.zeros((3, 3), dtype=np.int32), np.zeros((3, 4), dtype=np.int64)[:, :3]]:
        with pytest.raises(ValueError):  # Cython's own message: read-only, dtype mismatch, not contiguous
            read_pointers(np.zeros((3, 3), dtype=np.int64), [2, 1], weighted_random=False, shuffle=False, seed=0,
                          out=(pointers, np.zeros(3, dtype=np.int64)))


def test_kernel_rejects_wrong_number_of_shuffle_keys():
    with pytest.raises(ValueError, match="shuffle_keys"):
        kernel.read_order(np.array([1, 2], dtype=np.int64), False, 0,
                          np.zeros(3, dtype=np.uint64))


# -- Python pairs -----------------------------------------------------------------------


def _pair_arrays(n: int = 10) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    pointers = np.arange(3 * n, dtype=np.int64).reshape(n, 3) * 1000 + 2**40
    return pointers, np.arange(n, dtype=np.int64) % 3, ("a", "b", "c")


def _expected_pairs(pointers, component, names):
    return [(tuple(p), names[k]) for p, k in zip(pointers.tolist(), component.tolist())]


def test_iter_pairs_yields_plain_python_pairs():
    pointers, component, names = _pair_arrays()
    pairs = list(iter_pairs(pointers, component, names))
    assert pairs == _expected_pairs(pointers, component, names)
    assert all(type(p) is tuple and type(p[0]) is tuple and type(p[1]) is str for p in pairs)
    assert {type(v) for p in pairs for v in p[0]} == {int}
    assert len({id(p) for p in pairs}) == len(pairs)  # pairs that are kept are never refilled


def test_iter_pairs_never_changes_a_pair_or_id_someone_holds():
    pointers, component, names = _pair_arrays(12)
    expected = _expected_pairs(pointers, component, names)
    held, ids, names_seen = [], [], []
    for i, pair in enumerate(iter_pairs(pointers, component, names)):
        if i % 3 == 0:
            held.append((i, pair))
        ids.append(pair[0])
        names_seen.append(pair[1])
    assert all(pair == expected[i] for i, pair in held)
    assert ids == [sample_id for sample_id, _ in expected]
    assert names_seen == [name for _, name in expected]
    assert [sample_id for sample_id, _ in iter_pairs(pointers, component, names)] == ids
    it = iter_pairs(pointers, component, names)
    first, second = next(it), next(it)
    del first
    assert next(it) == expected[2] and second == expected[1]
    assert list(it) == expected[3:] and list(it) == []


def test_iter_pairs_checks_its_arrays():
    pointers, component, names = _pair_arrays()
    with pytest.raises(ValueError, match="outside"):
        iter_pairs(pointers, component, names[:2])
    with pytest.raises(ValueError, match="outside"):
        iter_pairs(pointers, component - 1, names)
    with pytest.raises(ValueError, match="shape"):
        iter_pairs(pointers[:-1], component, names)
    assert list(iter_pairs(pointers[:0], component[:0], ())) == []
