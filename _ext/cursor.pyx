# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cursor kernel: write one dataset's pointers for a range, or any list, of pass positions.

Defined by zephon/core/cursor.py::pointer_reference. A position ``p`` goes through the block
mosaic (if any), here, then through the pass layout (layout.pyx): the shard lookup and the
within-shard permutation (if any). Positions go through each stage a batch at a time, so the
permutations of a batch's elements run side by side (the batched network of feistel.h).

* ``take``: a range of positions. Without a mosaic they are consecutive, so the loop walks
  shard by shard and permutes each shard's rows a batch at a time; with one, each block's
  permutation moves a batch of positions, which the layout then looks up.
* ``take_at``: positions in any order, each batch through its own blocks' permutations.
* ``shard_runs``: only the shard ids of a range, as runs (token mode prices draws by shard).

cursor.pxd declares ``_take_at`` (and passes on ``Pass`` and ``PassLayout`` from
layout.pxd) for kernels that write pointers themselves (lookup.pyx).
"""
import numpy as np
from libc.stdint cimport int64_t, uint64_t
from zephon._ext._keys cimport derive
from zephon._ext.layout cimport Pass, PassLayout, _find, _id, _locate, _rows, _shard_of, _start, _within_key
from zephon._ext.perm cimport PERM_BATCH, Perm, perm_apply_each, perm_apply_many, perm_make


# -- the loops ----------------------------------------------------------------------------


cdef void _take_runs(int64_t[:, ::1] out, Py_ssize_t row, int64_t dataset_id, const Pass* P,
                     int64_t position, int64_t count) noexcept nogil:
    """No block mosaic: positions are consecutive, so walk shard by shard."""
    cdef int64_t p = position, end = position + count, start, stop, shard_id
    cdef Py_ssize_t k = _find(P, p), j, m
    cdef uint64_t rows[PERM_BATCH]
    cdef Perm shard_perm
    while p < end:
        start = _start(P, k)
        stop = start + _rows(P, k, start)
        if stop > end:
            stop = end
        if p < stop:
            shard_id = _id(P, k)
            if P.within:
                shard_perm = perm_make(_within_key(P, k, shard_id), <uint64_t>_rows(P, k, start))
            while p < stop:
                m = stop - p if stop - p < PERM_BATCH else PERM_BATCH
                for j in range(m):
                    rows[j] = <uint64_t>(p - start + j)
                if P.within:
                    perm_apply_many(&shard_perm, rows, m)
                for j in range(m):
                    out[row + j, 0] = dataset_id
                    out[row + j, 1] = shard_id
                    out[row + j, 2] = <int64_t>rows[j]
                row += m
                p += m
        k += 1


cdef void _take_blocks(int64_t[:, ::1] out, Py_ssize_t row, int64_t dataset_id, const Pass* P,
                       int64_t position, int64_t count) noexcept nogil:
    """Block mosaic: permute positions inside each block, then look each one up."""
    cdef int64_t p = position, end = position + count, block, block_start, block_len, block_stop
    cdef int64_t q[PERM_BATCH]
    cdef int64_t ids[PERM_BATCH]
    cdef uint64_t x[PERM_BATCH]
    cdef Py_ssize_t lo = 0, hi = 0, j, m
    cdef Perm block_perm
    while p < end:
        block = p // P.block_size
        block_start = block * P.block_size
        block_len = P.block_size if P.total - block_start > P.block_size else P.total - block_start
        block_stop = block_start + block_len if block_start + block_len < end else end
        block_perm = perm_make(derive(P.block_key, <uint64_t>block), <uint64_t>block_len)
        if not P.uniform:  # the shards this block spans
            lo = _shard_of(P.cum_end, block_start, 0, P.shards)
            hi = _shard_of(P.cum_end, block_start + block_len - 1, lo, P.shards) + 1
        while p < block_stop:
            m = block_stop - p if block_stop - p < PERM_BATCH else PERM_BATCH
            for j in range(m):
                x[j] = <uint64_t>(p - block_start + j)
            perm_apply_many(&block_perm, x, m)
            for j in range(m):
                q[j] = block_start + <int64_t>x[j]
            _locate(P, q, m, lo, hi, ids, x)
            for j in range(m):
                out[row + j, 0] = dataset_id
                out[row + j, 1] = ids[j]
                out[row + j, 2] = <int64_t>x[j]
            row += m
            p += m


cdef void _take_at(int64_t* out, const int64_t* rows, int64_t dataset_id, const Pass* P,
                   const int64_t* positions, Py_ssize_t n) noexcept nogil:
    """Positions in any order: each batch goes through its own blocks' permutations.

    The pointer of ``positions[j]`` (j < n) goes to row ``rows[j]`` of ``out`` (rows of 3
    int64), or row j when ``rows`` is NULL.
    """
    cdef Py_ssize_t done = 0, j, m
    cdef int64_t p, block, block_start
    cdef int64_t* row
    cdef int64_t q[PERM_BATCH]
    cdef int64_t ids[PERM_BATCH]
    cdef int64_t starts[PERM_BATCH]
    cdef uint64_t x[PERM_BATCH]
    cdef uint64_t keys[PERM_BATCH]
    cdef uint64_t lens[PERM_BATCH]
    while done < n:
        m = n - done if n - done < PERM_BATCH else PERM_BATCH
        if P.block_size > 1:
            for j in range(m):
                p = positions[done + j]
                block = p // P.block_size
                block_start = block * P.block_size
                starts[j] = block_start
                x[j] = <uint64_t>(p - block_start)
                keys[j] = derive(P.block_key, <uint64_t>block)
                lens[j] = <uint64_t>(P.block_size if P.total - block_start > P.block_size else P.total - block_start)
            perm_apply_each(x, keys, lens, m)
            for j in range(m):
                q[j] = starts[j] + <int64_t>x[j]
        else:
            for j in range(m):
                q[j] = positions[done + j]
        _locate(P, q, m, 0, P.shards, ids, x)
        for j in range(m):
            row = out + 3 * (rows[done + j] if rows != NULL else done + j)
            row[0] = dataset_id
            row[1] = ids[j]
            row[2] = <int64_t>x[j]
        done += m


# -- doors --------------------------------------------------------------------------------


def take(int64_t[:, ::1] out, Py_ssize_t row, int64_t dataset_id, PassLayout layout, int64_t position,
         int64_t count):
    """Write pointers for pass positions [position, position+count) into out[row:row+count].

    The caller guarantees ``0 <= position``, ``position + count <= total`` and that ``out`` fits.
    """
    cdef const Pass* P = &layout.p
    if P.block_size > 1:
        layout._prepare(count)
    with nogil:
        if P.block_size > 1:
            _take_blocks(out, row, dataset_id, P, position, count)
        else:
            _take_runs(out, row, dataset_id, P, position, count)


def take_at(int64_t[:, ::1] out, int64_t dataset_id, PassLayout layout, const int64_t[::1] positions):
    """Write the pointer at pass position ``positions[j]`` into ``out[j]`` for every j.

    Positions may come in any order and repeat. Returns -1, or, writing nothing, the first j
    whose position lies outside ``[0, total)``. The caller guarantees
    ``out.shape[0] == len(positions)``.
    """
    cdef Py_ssize_t j
    cdef int64_t total = layout.p.total
    for j in range(positions.shape[0]):
        if not 0 <= positions[j] < total:
            return j
    layout._prepare(positions.shape[0])
    if positions.shape[0]:
        with nogil:
            _take_at(&out[0, 0], NULL, dataset_id, &layout.p, &positions[0], positions.shape[0])
    return -1


cdef Py_ssize_t _shard_runs(const Pass* P, int64_t position, int64_t count, int64_t* ends,
                            int64_t* ids) noexcept nogil:
    """Runs of equal shard id over pass positions [position, position+count): run r covers
    offsets [ends[r-1], ends[r]) (ends[-1] = 0) of shard ids[r]. Returns the number of runs;
    without a mosaic, ``ends`` NULL only counts them.

    Without a mosaic a run is a shard's stretch, O(runs); with one, positions are looked up a
    batch at a time (O(count)) with the within-shard shuffle off, which moves no shard id.
    """
    cdef int64_t p = position, end = position + count, start, stop, block, block_start, block_len
    cdef Py_ssize_t k, runs = 0, j, m
    cdef int64_t q[PERM_BATCH]
    cdef int64_t found[PERM_BATCH]
    cdef uint64_t x[PERM_BATCH]
    cdef Pass plain = P[0]
    cdef Perm block_perm
    plain.within = False
    if P.block_size <= 1:
        k = _find(P, p)
        while p < end:
            start = _start(P, k)
            stop = start + _rows(P, k, start)
            if p < stop:
                p = stop if stop < end else end
                if ends != NULL:
                    ids[runs], ends[runs] = _id(P, k), p - position
                runs += 1
            k += 1
        return runs
    while p < end:
        block = p // P.block_size
        block_start = block * P.block_size
        block_len = P.block_size if P.total - block_start > P.block_size else P.total - block_start
        block_perm = perm_make(derive(P.block_key, <uint64_t>block), <uint64_t>block_len)
        m = min(block_start + block_len - p, end - p, PERM_BATCH)
        for j in range(m):
            x[j] = <uint64_t>(p - block_start + j)
        perm_apply_many(&block_perm, x, m)
        for j in range(m):
            q[j] = block_start + <int64_t>x[j]
        _locate(&plain, q, m, 0, P.shards, found, x)
        for j in range(m):
            if runs == 0 or ids[runs - 1] != found[j]:
                ids[runs] = found[j]
                runs += 1
            ends[runs - 1] = p - position + j + 1
        p += m
    return runs


def shard_runs(PassLayout layout, int64_t position, int64_t count):
    """``(ends, ids)``: the shard ids of pass positions [position, position+count) as runs.

    Run r covers offsets ``[ends[r-1], ends[r])`` from ``position`` (``ends[-1]`` = 0) and
    reads shard ``ids[r]`` (adjacent runs differ). Token mode prices draws by shard, so it
    needs these, never the rows. The caller guarantees ``0 <= position`` and
    ``position + count <= total``.
    """
    cdef const Pass* P = &layout.p
    cdef Py_ssize_t runs = count
    if count > 0 and P.block_size > 1:
        layout._prepare(count)
    elif count > 0:
        runs = _shard_runs(P, position, count, NULL, NULL)
    ends = np.empty(runs, dtype=np.int64)
    ids = np.empty(runs, dtype=np.int64)
    cdef int64_t[::1] ends_view = ends, ids_view = ids
    if count > 0:
        with nogil:
            runs = _shard_runs(P, position, count, &ends_view[0], &ids_view[0])
    return ends[:runs], ids[:runs]
