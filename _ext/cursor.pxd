"""The cursor kernel's C surface, for kernels that write pointers themselves (lookup.pyx).

Defined in cursor.pyx; see its docstring.
"""
from libc.stdint cimport int64_t, uint64_t
from zephon._ext.perm cimport Perm


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


cdef void _take_at(int64_t* out, const int64_t* rows, int64_t dataset_id, const Pass* P,
                   const int64_t* positions, Py_ssize_t n) noexcept nogil


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
