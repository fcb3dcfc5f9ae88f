"""Random-access permutations of ``[0, n)``: the readable definition of the perm kernel.

A keyed Feistel network over the smallest power of two ``2**b >= n`` with ``b >= MIN_BITS``, split
into halves of ``b // 2`` and ``b - b // 2`` bits that swap roles every round, made a
bijection on ``[0, n)`` by cycle walking (fewer than two passes on average once
``n > 2**MIN_BITS``). Six rounds and the 64-element floor keep small domains as uniform as
Fisher–Yates (four rounds on a few bits are measurably biased; tests/test_perm.py). ``perm_reference(key,
n, i)`` is the ``i``-th element of the permutation; nothing is materialised, so seeking is
O(1) and a global shuffle of 10**9 samples costs no memory.

**Compatibility**: the round structure and round keys are frozen; they define sample order.
"""
from __future__ import annotations

import numpy as np

from zephon._ext import perm as _kernel
from zephon.core.keys import GOLDEN, MASK64, mix64

ROUNDS = 6  # must match PERM_ROUNDS in zephon/_ext/perm.pxd
MIN_BITS = 6  # must match PERM_MIN_BITS in zephon/_ext/perm.pxd


def perm_reference(key: int, n: int, i: int) -> int:
    """Element ``i`` of the keyed permutation of ``[0, n)`` (pure Python twin of the kernel)."""
    if n <= 1:
        return i
    bits = max(MIN_BITS, (n - 1).bit_length())
    x = i
    while True:
        for r in range(ROUNDS):
            low_bits = bits // 2 if r % 2 == 0 else bits - bits // 2
            high_bits = bits - low_bits
            low, high = x & ((1 << low_bits) - 1), x >> low_bits
            f = mix64(low ^ ((key + r * GOLDEN) & MASK64)) & ((1 << high_bits) - 1)
            x = (low << high_bits) | (high ^ f)
        if x < n:
            return x


def perm_range(key: int, n: int, start: int, count: int) -> np.ndarray:
    """``[perm(start), …, perm(start + count - 1)]`` as int64, computed by the kernel."""
    if not (0 <= start and count >= 0 and start + count <= max(n, 0)):
        raise ValueError(
            f"perm_range: [start, start+count) = [{start}, {start + count}) must lie in "
            f"[0, n={n}); pass a range inside the permuted domain"
        )
    return _kernel.perm_range(key & MASK64, n, start, count)
