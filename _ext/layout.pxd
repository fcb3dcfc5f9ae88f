# cython: cdivision=True
# (A .pxd takes no directives from the .pyx that cimports it: without cdivision, the inline
# lookups below would check every // for a zero divisor and round it as Python does.)
"""The pass layout's C surface: ``Pass``, the fields of ``ShardTable`` and ``PassLayout``, and
the lookups on a ``Pass``, for kernels that walk a pass (cursor.pyx) or hand it on (lookup.pyx).

Defined in layout.pyx; see its docstring. The lookups (``_locate`` for a batch of positions,
and ``_find``, ``_start``, ``_rows``, ``_id``, ``_within_key`` that the loops walk shards
with) are inline here, compiled into every kernel that cimports them: they run once per batch
or per shard, too often for a call into another extension module.
"""
from libc.stdint cimport int64_t, uint64_t
from zephon._ext._keys cimport derive
from zephon._ext.perm cimport PERM_BATCH, Perm, perm_apply, perm_apply_each, perm_apply_many


cdef struct Pass:
    # A C hand-off of one PassLayout: the loops read it, the object owns what it points to.
    int64_t total  # samples in the pass
    int64_t block_size  # mosaic block size; <= 1: no mosaic
    uint64_t block_key  # level key of the mosaic
    Py_ssize_t shards  # S, empty shards included
    bint within  # within-shard shuffle
    bint uniform
    # uniform: every shard has u rows but the one at order position kstar, which has t
    # (kstar = S, t = 0: no odd shard); order position k holds shard index order(k).
    int64_t u, t, kstar
    bint shuffle  # order is a permutation (else the identity)
    Perm order
    uint64_t within_key  # level key: shard s's key is derive(within_key, shard_ids[s])
    const int64_t* shard_ids  # the dataset's table, in shard index order
    # Tables in pass order: always for general shards (cum_end NULL for uniform ones);
    # ordered_ids and within_keys for uniform shards once materialised (else NULL).
    const int64_t* ordered_ids
    const int64_t* cum_end
    const uint64_t* within_keys  # NULL without within-shard shuffle


cdef class ShardTable:
    cdef const int64_t[::1] shard_ids
    cdef const int64_t[::1] counts
    cdef object arrays  # the two arrays above, for pickling
    cdef int64_t u, odd, t, block_size, total
    cdef bint shuffle, within
    cdef uint64_t order_prefix, within_prefix, block_prefix


cdef class PassLayout:
    cdef Pass p
    cdef readonly ShardTable table
    cdef readonly uint64_t epoch  # the key epoch (the pass, or 0 without reshuffle_on_repeat)
    cdef object tables  # (ordered_ids, cum_end, within_keys), which p points into, or None

    cdef void _build(self, bint cumulative)
    cdef void _prepare(self, Py_ssize_t count)


# -- one position or shard at a time ------------------------------------------------------


cdef inline Py_ssize_t _shard_of(const int64_t* cum_end, int64_t q, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    """First k in [lo, hi) with cum_end[k] > q."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if cum_end[mid] > q:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef inline Py_ssize_t _uniform_shard_of(const Pass* P, int64_t q) noexcept nogil:
    """The order position of the non-empty shard holding pass position q (uniform shards)."""
    cdef int64_t head = P.kstar * P.u  # rows before the odd shard
    if q < head:
        return q // P.u
    if q < head + P.t:
        return P.kstar
    return P.kstar + 1 + (q - head - P.t) // P.u


cdef inline Py_ssize_t _find(const Pass* P, int64_t q) noexcept nogil:
    """The order position of the non-empty shard holding pass position q."""
    if P.uniform:
        return _uniform_shard_of(P, q)
    return _shard_of(P.cum_end, q, 0, P.shards)


cdef inline int64_t _start(const Pass* P, Py_ssize_t k) noexcept nogil:
    """First pass position of the shard at order position k."""
    if P.uniform:
        return k * P.u if k <= P.kstar else (k - 1) * P.u + P.t
    return P.cum_end[k - 1] if k > 0 else 0


cdef inline int64_t _rows(const Pass* P, Py_ssize_t k, int64_t start) noexcept nogil:
    """Rows of the shard at order position k, which starts at start."""
    if P.uniform:
        return P.t if k == P.kstar else P.u
    return P.cum_end[k] - start


cdef inline int64_t _id(const Pass* P, Py_ssize_t k) noexcept nogil:
    """Shard id at order position k."""
    if P.ordered_ids != NULL:
        return P.ordered_ids[k]
    return P.shard_ids[perm_apply(&P.order, <uint64_t>k) if P.shuffle else k]


cdef inline uint64_t _within_key(const Pass* P, Py_ssize_t k, int64_t shard_id) noexcept nogil:
    """Within-shard key of the shard at order position k, whose id is shard_id."""
    if P.within_keys != NULL:
        return P.within_keys[k]
    return derive(P.within_key, <uint64_t>shard_id)


# -- a batch of positions at a time -------------------------------------------------------


cdef inline void _shards_of(const int64_t* cum_end, const int64_t* q, Py_ssize_t* shard, Py_ssize_t m,
                            Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    """shard[j] = first k in [lo, hi) with cum_end[k] > q[j], for j < m, given one exists.

    A binary search without branches: every q takes the same steps (the halvings of hi - lo),
    each a conditional add, and the m searches advance side by side, so the CPU overlaps their
    loads and nothing is mispredicted.
    """
    cdef Py_ssize_t length = hi - lo, half, j
    for j in range(m):
        shard[j] = lo
    while length > 1:
        half = length >> 1
        for j in range(m):
            shard[j] += half & -<Py_ssize_t>(cum_end[shard[j] + half - 1] <= q[j])
        length -= half


cdef inline void _locate(const Pass* P, const int64_t* q, Py_ssize_t m, Py_ssize_t lo, Py_ssize_t hi,
                         int64_t* ids, uint64_t* rows) noexcept nogil:
    """ids[j], rows[j] = shard id and offset of pass position q[j] (after the mosaic), j < m.

    For general shards the search is limited to order positions [lo, hi), which must hold
    every q[j]; uniform shards ignore lo and hi.
    """
    cdef Py_ssize_t shard[PERM_BATCH]
    cdef uint64_t index[PERM_BATCH]
    cdef uint64_t keys[PERM_BATCH]
    cdef uint64_t ns[PERM_BATCH]
    cdef Py_ssize_t j, k
    cdef int64_t start
    if P.uniform:
        for j in range(m):
            k = _uniform_shard_of(P, q[j])
            start = _start(P, k)
            rows[j] = <uint64_t>(q[j] - start)
            ns[j] = <uint64_t>_rows(P, k, start)
            index[j] = <uint64_t>k
        if P.ordered_ids != NULL:  # materialised
            for j in range(m):
                ids[j] = P.ordered_ids[index[j]]
                if P.within:
                    keys[j] = P.within_keys[index[j]]
        else:
            if P.shuffle:
                perm_apply_many(&P.order, index, m)
            for j in range(m):
                ids[j] = P.shard_ids[index[j]]
            if P.within:
                for j in range(m):
                    keys[j] = derive(P.within_key, <uint64_t>ids[j])
    else:
        _shards_of(P.cum_end, q, shard, m, lo, hi)
        for j in range(m):
            k = shard[j]
            start = P.cum_end[k - 1] if k > 0 else 0
            rows[j] = <uint64_t>(q[j] - start)
            ids[j] = P.ordered_ids[k]
            if P.within:
                keys[j] = P.within_keys[k]
                ns[j] = <uint64_t>(P.cum_end[k] - start)
    if P.within:
        perm_apply_each(rows, keys, ns, m)
