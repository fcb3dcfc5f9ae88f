"""Random-access Feistel permutation on Z_a × Z_b, inlined into every kernel that cimports it.

Defined by zephon/core/perm.py::perm_reference and perm_inverse_reference.

* ``perm_make(key, n)`` builds a ``Perm``; ``perm_apply(&p, i)`` is element ``i`` and
  ``perm_invert(&p, j)`` the ``i`` with ``perm_apply(&p, i) == j``.
* ``perm_apply_many(&p, x, m)`` applies one permutation to ``x[0..m)`` in place and
  ``perm_apply_each(x, keys, ns, m)`` a different one per element. Both are the batched
  network of ``feistel.h``: groups of elements go through the rounds together in
  branch-free loops (SIMD over 64 elements with AVX-512 or AVX2 where GCC on x86-64 Linux
  can dispatch at run time, else 8 in registers), and the few outputs that land in
  ``[n, a·b)`` walk afterwards. Fewer than ``PERM_SCALAR`` elements go one by one through
  the scalar functions instead, since the network pads every group to a full one. The scalar
  functions here and the header compute the same bits; tests/test_perm.py checks both
  against the Python twin.
"""
from libc.stdint cimport uint64_t
from zephon._ext._keys cimport GOLDEN

cdef extern from *:
    int __builtin_clzll(unsigned long long) nogil

cdef enum:
    PERM_ROUNDS = 6  # must match ROUNDS in zephon/core/perm.py
    PERM_MIN_BITS = 6  # must match MIN_BITS in zephon/core/perm.py
    PERM_BATCH = 64  # elements a batched kernel stages at a time (must match ZEPHON_BATCH in feistel.h)
    PERM_SCALAR = 8  # fewer elements go one by one: the batched network pads every group to a full one


cdef struct Perm:  # build with perm_make
    uint64_t key
    uint64_t n
    int bits  # a = 2**bits
    uint64_t b  # the network runs on Z_a × Z_b, n <= a·b < n + a


cdef inline Perm perm_make(uint64_t key, uint64_t n) noexcept nogil:
    cdef Perm p
    cdef uint64_t least = (<uint64_t>1) << PERM_MIN_BITS
    cdef uint64_t domain = n if n > least else least
    p.key = key
    p.n = n
    p.bits = (64 - __builtin_clzll(domain - 1)) >> 1
    p.b = ((domain - 1) >> p.bits) + 1
    return p


cdef extern from "feistel.h" nogil:
    # The one C definition of the network (the twin is zephon/core/perm.py): the round
    # function, one scalar pass, and the batched network, SIMD where the CPU has it.
    uint64_t zephon_f(uint64_t round_key, uint64_t v)
    uint64_t zephon_network(uint64_t key, uint64_t bits, uint64_t b, uint64_t x)
    void zephon_perm_many(uint64_t* x, size_t m, uint64_t key, uint64_t n)
    void zephon_perm_each(uint64_t* x, const uint64_t* keys, const uint64_t* ns, size_t m)


cdef inline uint64_t _round(uint64_t key, int r, uint64_t v) noexcept nogil:
    """F_r(v): 32 bits of v < 2**32 (``zephon_f`` of round key ``key + r·GOLDEN``)."""
    return zephon_f(key + <uint64_t>r * GOLDEN, v)


cdef inline uint64_t _scale(uint64_t f, uint64_t b) noexcept nogil:
    """Lemire's multiply-shift: a 32-bit f mapped to [0, b), b <= 2**32, without division."""
    return (f * b) >> 32


cdef inline uint64_t _sub_mod(uint64_t x, uint64_t y, uint64_t b) noexcept nogil:
    """(x - y) mod b for x, y < b."""
    return x - y if x >= y else x + b - y


cdef inline uint64_t _network(const Perm* p, uint64_t x) noexcept nogil:
    """One pass of the network on x = high·a + low < a·b (``zephon_network``)."""
    return zephon_network(p.key, <uint64_t>p.bits, p.b, x)


cdef inline uint64_t _network_inverse(const Perm* p, uint64_t x) noexcept nogil:
    """The inverse of _network: the rounds backwards, subtracting."""
    cdef uint64_t mask = ((<uint64_t>1) << p.bits) - 1
    cdef uint64_t low = x & mask, high = x >> p.bits
    cdef int r
    for r in range(PERM_ROUNDS - 1, -1, -1):
        if (r & 1) == 0:
            high = _sub_mod(high, _scale(_round(p.key, r, low), p.b), p.b)
        else:
            low = (low - _round(p.key, r, high)) & mask
    return (high << p.bits) | low


cdef inline uint64_t _walk(const Perm* p, uint64_t x) noexcept nogil:
    """Cycle walking: x itself if x < n, else the first of its network images below n."""
    while x >= p.n:
        x = _network(p, x)
    return x


cdef inline uint64_t perm_apply(const Perm* p, uint64_t i) noexcept nogil:
    """Element i of the permutation (i < n)."""
    if p.n <= 1:
        return i
    return _walk(p, _network(p, i))


cdef inline uint64_t perm_invert(const Perm* p, uint64_t j) noexcept nogil:
    """The i < n with perm_apply(p, i) == j (j < n)."""
    cdef uint64_t x = j
    if p.n <= 1:
        return j
    x = _network_inverse(p, x)
    while x >= p.n:
        x = _network_inverse(p, x)
    return x



cdef inline void perm_apply_many(const Perm* p, uint64_t* x, Py_ssize_t m) noexcept nogil:
    """x[j] = perm_apply(p, x[j]) for j < m (fewer than PERM_SCALAR one by one)."""
    cdef Py_ssize_t j
    if m < PERM_SCALAR:
        for j in range(m):
            x[j] = perm_apply(p, x[j])
    else:
        zephon_perm_many(x, <size_t>m, p.key, p.n)


cdef inline void perm_apply_each(uint64_t* x, const uint64_t* keys, const uint64_t* ns,
                                 Py_ssize_t m) noexcept nogil:
    """x[j] = perm_apply(&perm_make(keys[j], ns[j]), x[j]) for j < m (fewer than PERM_SCALAR
    one by one)."""
    cdef Py_ssize_t j
    cdef Perm p
    if m < PERM_SCALAR:
        for j in range(m):
            p = perm_make(keys[j], ns[j])
            x[j] = perm_apply(&p, x[j])
    else:
        zephon_perm_each(x, keys, ns, <size_t>m)
