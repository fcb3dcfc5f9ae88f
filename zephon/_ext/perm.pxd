"""Random-access Feistel permutation, inlined into every kernel that cimports it.

Defined by zephon/core/perm.py::perm_reference.
"""
from libc.stdint cimport uint64_t
from zephon._ext._keys cimport GOLDEN, mix64

cdef extern from *:
    int __builtin_clzll(unsigned long long) nogil

cdef enum:
    PERM_ROUNDS = 6  # must match ROUNDS in zephon/core/perm.py
    PERM_MIN_BITS = 6  # must match MIN_BITS in zephon/core/perm.py


cdef struct Perm:
    uint64_t key
    uint64_t n
    int bits


cdef inline Perm perm_make(uint64_t key, uint64_t n) noexcept nogil:
    cdef Perm p
    p.key = key
    p.n = n
    p.bits = PERM_MIN_BITS
    if n > (<uint64_t>1) << PERM_MIN_BITS:
        p.bits = 64 - __builtin_clzll(n - 1)
    return p


cdef inline uint64_t perm_apply(const Perm* p, uint64_t i) noexcept nogil:
    cdef uint64_t x = i, low, f
    cdef int r, low_bits, high_bits
    if p.n <= 1:
        return i
    while True:
        for r in range(PERM_ROUNDS):
            low_bits = p.bits // 2 if r % 2 == 0 else p.bits - p.bits // 2
            high_bits = p.bits - low_bits
            low = x & (((<uint64_t>1) << low_bits) - 1)
            f = mix64(low ^ (p.key + <uint64_t>r * GOLDEN)) & (((<uint64_t>1) << high_bits) - 1)
            x = (low << high_bits) | ((x >> low_bits) ^ f)
        if x < p.n:
            return x
