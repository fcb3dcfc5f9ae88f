"""The permutation kernel: twin agreement, bijection, and quality against Fisher–Yates."""
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from zephon.core.keys import derive, mix64, purpose_key, seed_key
from zephon.core.perm import (
    perm_each,
    perm_inverse_range,
    perm_inverse_reference,
    perm_range,
    perm_reference,
    perm_shape,
)

keys = st.integers(0, 2**64 - 1)


@given(keys, st.integers(0, 3000), st.data())
def test_kernel_matches_reference(key, n, data):
    start = data.draw(st.integers(0, n))
    count = data.draw(st.integers(0, min(n - start, 200)))
    expected = [perm_reference(key, n, i) for i in range(start, start + count)]
    assert perm_range(key, n, start, count).tolist() == expected


@given(keys, st.integers(0, 3000), st.data())
def test_inverse_kernel_matches_reference(key, n, data):
    start = data.draw(st.integers(0, n))
    count = data.draw(st.integers(0, min(n - start, 200)))
    expected = [perm_inverse_reference(key, n, j) for j in range(start, start + count)]
    assert perm_inverse_range(key, n, start, count).tolist() == expected


@given(st.lists(st.tuples(keys, st.integers(0, 300) | st.integers(0, 2**62)), max_size=150), st.data())
def test_each_kernel_matches_reference(pairs, data):
    # One permutation per element, in groups of 64 with a short last group; n <= 1 is the identity.
    xs = [data.draw(st.integers(0, max(n - 1, 0))) for _, n in pairs]
    expected = [perm_reference(k, n, x) for (k, n), x in zip(pairs, xs)]
    got = perm_each(np.array([k for k, _ in pairs], dtype=np.uint64), [n for _, n in pairs], xs)
    assert got.tolist() == expected


@given(keys, st.integers(0, 5000))
def test_is_a_bijection(key, n):
    assert sorted(perm_range(key, n, 0, n).tolist()) == list(range(n))


@given(keys, st.integers(0, 5000))
def test_inverse_undoes_the_permutation(key, n):
    forward = perm_range(key, n, 0, n)
    assert (perm_inverse_range(key, n, 0, n)[forward] == np.arange(n)).all()


@given(keys, st.integers(2, 2**62), st.data())
def test_twins_invert_each_other_on_any_domain(key, n, data):
    i = data.draw(st.integers(0, n - 1))
    j = perm_reference(key, n, i)
    assert 0 <= j < n and perm_inverse_reference(key, n, j) == i
    assert perm_range(key, n, i, 1)[0] == j and perm_inverse_range(key, n, j, 1)[0] == i


@given(st.integers(0, 2**62))
def test_domain_exceeds_n_by_less_than_a(n):
    a, b = perm_shape(n)
    assert a & (a - 1) == 0 and max(n, 64) <= a * b < max(n, 64) + a


def test_large_domain_needs_no_materialisation():
    n = 10**12
    values = perm_range(7, n, n - 1000, 1000)
    assert len(set(values.tolist())) == 1000 and 0 <= values.min() and values.max() < n
    assert perm_inverse_range(7, n, int(values[0]), 1)[0] == n - 1000


def _chi2_upper(df: int, z: float = 3.5) -> float:
    """Wilson–Hilferty upper quantile of chi-square (z = 3.5: about 1 in 4000 false alarms)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _position_chi2(perms: np.ndarray) -> float:
    trials, n = perms.shape
    table = np.zeros((n, n))
    np.add.at(table, (np.tile(np.arange(n), trials), perms.ravel()), 1)
    expected = trials / n
    return float(((table - expected) ** 2 / expected).sum())


def test_positions_are_uniform_like_fisher_yates():
    n, trials = 12, 6000
    ours = np.array([perm_range(purpose_key(s, 1), n, 0, n) for s in range(trials)])
    rng = np.random.default_rng(0)
    fisher_yates = np.array([rng.permutation(n) for _ in range(trials)])
    bound = _chi2_upper((n - 1) ** 2)
    assert _position_chi2(fisher_yates) < bound
    assert _position_chi2(ours) < bound


def test_neighbours_are_uncorrelated_like_fisher_yates():
    n = 4000
    limit = 4 / math.sqrt(n)
    for seed in range(20):
        p = perm_range(purpose_key(seed, 2), n, 0, n).astype(float)
        assert abs(np.corrcoef(p[:-1], p[1:])[0, 1]) < limit
        assert abs(np.corrcoef(p, np.arange(n))[0, 1]) < limit
        q = perm_range(purpose_key(seed + 1, 2), n, 0, n).astype(float)
        assert abs(np.corrcoef(p, q)[0, 1]) < limit


def test_pairs_sharing_a_low_half_keep_no_structure():
    # Inputs i and i + k·a share their low half. After four rounds their outputs' high halves
    # differ by exactly k (mod b) about twice as often as chance (1/b); six rounds leave no
    # trace. This guards the round count: four rounds give about 2x the expected count.
    n = 2**16
    a, b = perm_shape(n)
    observed = expected = 0
    for seed in range(4):
        high = perm_range(purpose_key(seed, 3), n, 0, n) // a
        for k in range(1, 9):
            observed += int(((high[k * a:] - high[: n - k * a]) % b == k).sum())
            expected += (n - k * a) / b
    assert abs(observed - expected) < 5 * math.sqrt(expected)


def test_neighbouring_keys_give_unrelated_permutations():
    n = 1000
    agree = [int((perm_range(k, n, 0, n) == perm_range(k + 1, n, 0, n)).sum()) for k in range(50)]
    assert np.mean(agree) < 3  # fixed points shared by chance: about 1 expected


@given(st.integers(-(2**130), 2**130), st.integers(-(2**130), 2**130))
def test_seed_keys_differ_for_different_seeds(a, b):
    if a != b:
        assert seed_key(a) != seed_key(b)


def test_mix64_reference_values_are_pinned():
    # Changing these changes every stream zephon produces (a new checkpoint version).
    assert mix64(0) == 0xE220A8397B1DCDAF
    assert derive(1, 2) == derive(1, 2) != derive(2, 1)
