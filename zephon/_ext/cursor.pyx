# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cursor kernel: write one dataset's pointers for a range of epoch positions.

Defined by zephon/core/cursor.py::pointer_reference. A position ``p`` goes through the block
mosaic (if any), then a search in the epoch's cumulative shard counts, then the within-shard
permutation (if any). Positions go through each stage a batch at a time, so the
permutations of a batch's elements run side by side.
"""
import numpy as np
from libc.stdint cimport int64_t, uint64_t
from zephon._ext._keys cimport derive
from zephon._ext.perm cimport PERM_BATCH, Perm, perm_apply_each, perm_apply_many, perm_make


cdef inline Py_ssize_t _shard_of(const int64_t[::1] cum_end, int64_t q, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    """First k in [lo, hi) with cum_end[k] > q."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if cum_end[mid] > q:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef inline void _shards_of(const int64_t[::1] cum_end, const int64_t* q, Py_ssize_t* shard, Py_ssize_t m,
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


cdef inline int64_t _start_of(const int64_t[::1] cum_end, Py_ssize_t k) noexcept nogil:
    """First epoch position of the k-th shard (branch-free)."""
    cdef Py_ssize_t after_first = k > 0
    return cum_end[k - after_first] * after_first


cdef void _take_runs(int64_t[:, ::1] out, Py_ssize_t row, int64_t dataset_id, int64_t position, int64_t count,
                     const int64_t[::1] ids, const int64_t[::1] cum_end, const uint64_t[::1] within_keys) noexcept nogil:
    """No block mosaic: positions are consecutive, so walk shard by shard."""
    cdef int64_t p = position, end = position + count, start, stop
    cdef Py_ssize_t k = _shard_of(cum_end, p, 0, cum_end.shape[0]), j, m
    cdef bint within = within_keys.shape[0] > 0
    cdef uint64_t rows[PERM_BATCH]
    cdef Perm shard_perm
    while p < end:
        start = _start_of(cum_end, k)
        stop = cum_end[k] if cum_end[k] < end else end
        if within:
            shard_perm = perm_make(within_keys[k], <uint64_t>(cum_end[k] - start))
        while p < stop:
            m = stop - p if stop - p < PERM_BATCH else PERM_BATCH
            for j in range(m):
                rows[j] = <uint64_t>(p - start + j)
            if within:
                perm_apply_many(&shard_perm, rows, m)
            for j in range(m):
                out[row + j, 0] = dataset_id
                out[row + j, 1] = ids[k]
                out[row + j, 2] = <int64_t>rows[j]
            row += m
            p += m
        k += 1


cdef void _take_blocks(int64_t[:, ::1] out, Py_ssize_t row, int64_t dataset_id, int64_t position, int64_t count,
                       const int64_t[::1] ids, const int64_t[::1] cum_end, const uint64_t[::1] within_keys,
                       int64_t block_size, uint64_t block_key, int64_t total) noexcept nogil:
    """Block mosaic: permute positions inside each block, then look each one up."""
    cdef int64_t p = position, end = position + count, block, block_start, block_len, block_stop, start
    cdef int64_t q[PERM_BATCH]
    cdef Py_ssize_t lo, hi, j, m, k, shards = cum_end.shape[0]
    cdef bint within = within_keys.shape[0] > 0
    cdef Perm block_perm
    cdef uint64_t x[PERM_BATCH]
    cdef Py_ssize_t shard[PERM_BATCH]
    cdef uint64_t keys[PERM_BATCH]
    cdef uint64_t ns[PERM_BATCH]
    while p < end:
        block = p // block_size
        block_start = block * block_size
        block_len = block_size if total - block_start > block_size else total - block_start
        block_stop = block_start + block_len if block_start + block_len < end else end
        block_perm = perm_make(derive(block_key, <uint64_t>block), <uint64_t>block_len)
        lo = _shard_of(cum_end, block_start, 0, shards)
        hi = _shard_of(cum_end, block_start + block_len - 1, lo, shards) + 1
        while p < block_stop:
            m = block_stop - p if block_stop - p < PERM_BATCH else PERM_BATCH
            for j in range(m):
                x[j] = <uint64_t>(p - block_start + j)
            perm_apply_many(&block_perm, x, m)
            for j in range(m):
                q[j] = block_start + <int64_t>x[j]
            _shards_of(cum_end, q, shard, m, lo, hi)
            for j in range(m):
                k = shard[j]
                start = _start_of(cum_end, k)
                x[j] = <uint64_t>(q[j] - start)
                if within:
                    keys[j] = within_keys[k]
                    ns[j] = <uint64_t>(cum_end[k] - start)
            if within:
                perm_apply_each(x, keys, ns, m)
            for j in range(m):
                out[row + j, 0] = dataset_id
                out[row + j, 1] = ids[shard[j]]
                out[row + j, 2] = <int64_t>x[j]
            row += m
            p += m


def take(int64_t[:, ::1] out, Py_ssize_t row, int64_t dataset_id, int64_t position, int64_t count,
         const int64_t[::1] ordered_ids, const int64_t[::1] cum_end, const uint64_t[::1] within_keys,
         int64_t block_size, uint64_t block_key, int64_t total):
    """Write pointers for epoch positions [position, position+count) into out[row:row+count].

    ``within_keys`` is empty without within-shard shuffle; ``block_size <= 1`` means no
    mosaic. The caller guarantees ``position + count <= total`` and that ``out`` fits.
    """
    with nogil:
        if block_size > 1:
            _take_blocks(out, row, dataset_id, position, count, ordered_ids, cum_end, within_keys,
                         block_size, block_key, total)
        else:
            _take_runs(out, row, dataset_id, position, count, ordered_ids, cum_end, within_keys)


cdef void _derive_all(uint64_t key, const int64_t[::1] values, uint64_t[::1] out) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(values.shape[0]):
        out[i] = derive(key, <uint64_t>values[i])


def derive_many(uint64_t key, const int64_t[::1] values):
    """uint64 array of derive(key, v) for every v (e.g. one within-shard key per shard id)."""
    out = np.empty(values.shape[0], dtype=np.uint64)
    cdef uint64_t[::1] view = out
    with nogil:
        _derive_all(key, values, view)
    return out
