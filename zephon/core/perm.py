"""Random-access permutations of ``[0, n)``: the readable definition of the perm kernel.

A keyed Feistel network on ``Z_a × Z_b`` (Black–Rogaway's generalised Feistel with modular
addition). With ``N = max(n, 2**MIN_BITS)`` taking ``t`` bits, ``a = 2**(t // 2)`` and
``b = ceil(N / a)``, so ``n <= a·b < n + a``. Element ``x = high·a + low``, and the rounds
alternate

* even ``r``: ``high = (high + F_r(low) scaled to [0, b)) mod b`` (Lemire's multiply-shift
  ``F·b >> 32``, then one conditional subtract: no division);
* odd ``r``:  ``low = (low + F_r(high)) mod a`` (a mask).

``F_r(v)`` hashes ``v ^ (key + r·GOLDEN)`` (a key per round) with the core of the
SplitMix64 finaliser (multiply, xor-shift, multiply) and keeps the top 32 bits. An
output in ``[n, a·b)`` goes through the network again (cycle walking) until it lands in
``[0, n)``: fewer than ``a / n ≈ 1/sqrt(n)`` of the inputs walk once ``n > 2**MIN_BITS``,
so the kernels run many elements through the rounds side by side without branches and
walk the few afterwards.

``ROUNDS = 6`` and the 64-element floor keep small domains as uniform as Fisher–Yates,
and no round count below six is safe at any size: four rounds on a few bits are measurably
biased, and on any domain four rounds leave a structure a pair count finds at once
(tests/test_perm.py). ``perm_reference(key, n, i)`` is element ``i`` of the permutation and
``perm_inverse_reference(key, n, j)`` the ``i`` it sends to ``j``; nothing is materialised,
so seeking is O(1) and a global shuffle of 10**9 samples costs no memory.

**Compatibility**: the domain split, the round structure and function and the round keys
are frozen; they define sample order.
"""
from __future__ import annotations

import numpy as np

from zephon._ext import perm as _kernel
from zephon.core.keys import GOLDEN, MASK64

ROUNDS = 6  # must match PERM_ROUNDS in _ext/perm.pxd
MIN_BITS = 6  # must match PERM_MIN_BITS in _ext/perm.pxd


def perm_shape(n: int) -> tuple[int, int]:
    """``(a, b)``: the network runs on ``Z_a × Z_b``, ``a`` a power of two, ``n <= a·b < n + a``."""
    bits = max(MIN_BITS, (n - 1).bit_length())
    a = 1 << (bits // 2)
    return a, (max(n, 1 << MIN_BITS) - 1) // a + 1


_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # mix64's multipliers (zephon/core/keys.py)


def _round(key: int, r: int, v: int) -> int:
    """The round function ``F_r(v)``: 32 bits of ``v`` (< 2**32) keyed by ``key`` and ``r``."""
    z = ((v ^ ((key + r * GOLDEN) & MASK64)) * _M1) & MASK64
    z = ((z ^ (z >> 32)) * _M2) & MASK64
    return z >> 32


def _network(key: int, a: int, b: int, x: int, inverse: bool = False) -> int:
    """One pass of the network on ``x = high·a + low < a·b``, or of its inverse."""
    high, low = divmod(x, a)
    sign = -1 if inverse else 1
    for r in reversed(range(ROUNDS)) if inverse else range(ROUNDS):
        if r % 2 == 0:
            high = (high + sign * ((_round(key, r, low) * b) >> 32)) % b
        else:
            low = (low + sign * _round(key, r, high)) % a
    return high * a + low


def perm_reference(key: int, n: int, i: int) -> int:
    """Element ``i`` of the keyed permutation of ``[0, n)`` (pure Python twin of the kernel)."""
    if n <= 1:
        return i
    a, b = perm_shape(n)
    x = _network(key, a, b, i)
    while x >= n:
        x = _network(key, a, b, x)
    return x


def perm_inverse_reference(key: int, n: int, j: int) -> int:
    """The ``i`` with ``perm_reference(key, n, i) == j`` (pure Python twin of the kernel)."""
    if n <= 1:
        return j
    a, b = perm_shape(n)
    x = _network(key, a, b, j, inverse=True)
    while x >= n:
        x = _network(key, a, b, x, inverse=True)
    return x


def _check_range(name: str, n: int, start: int, count: int) -> None:
    if not (0 <= start and count >= 0 and start + count <= max(n, 0)):
        raise ValueError(
            f"{name}: [start, start+count) = [{start}, {start + count}) must lie in "
            f"[0, n={n}); pass a range inside the permuted domain"
        )


def perm_range(key: int, n: int, start: int, count: int) -> np.ndarray:
    """``[perm(start), …, perm(start + count - 1)]`` as int64, computed by the kernel."""
    _check_range("perm_range", n, start, count)
    return _kernel.perm_range(key & MASK64, n, start, count)


def perm_inverse_range(key: int, n: int, start: int, count: int) -> np.ndarray:
    """``[perm⁻¹(start), …, perm⁻¹(start + count - 1)]`` as int64, computed by the kernel."""
    _check_range("perm_inverse_range", n, start, count)
    return _kernel.perm_inverse_range(key & MASK64, n, start, count)


def perm_each(keys: np.ndarray, ns: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """``[perm(keys[j], ns[j], xs[j]) for j]`` as int64: a different permutation per element.

    ``keys`` are taken mod 2**64; every ``xs[j]`` must lie in ``[0, ns[j])`` (or ``ns[j] <= 1``,
    the identity).
    """
    keys = np.asarray(keys)
    if keys.dtype == object:  # Python ints beyond int64
        keys = np.array([int(k) & MASK64 for k in keys], dtype=np.uint64)
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    ns, xs = np.ascontiguousarray(ns, dtype=np.int64), np.ascontiguousarray(xs, dtype=np.int64)
    if not (keys.ndim == ns.ndim == xs.ndim == 1 and len(keys) == len(ns) == len(xs)):
        raise ValueError(
            f"perm_each: keys, ns and xs must be 1-d arrays of one length, got shapes "
            f"{keys.shape}, {ns.shape}, {xs.shape}; pass one key, size and index per element"
        )
    bad = (ns < 0) | (xs < 0) | ((xs >= ns) & (ns > 1))
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(f"perm_each: xs[{j}] = {int(xs[j])} must lie in [0, ns[{j}] = {int(ns[j])}) with "
                         f"ns[{j}] >= 0; pass sizes and indices of each permuted domain")
    return _kernel.perm_each(keys, ns, xs)
