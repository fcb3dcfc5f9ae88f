# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Batched random-access permutation: the doors to zephon/_ext/perm.pxd."""
import numpy as np
from libc.stdint cimport int64_t, uint64_t
from zephon._ext.perm cimport PERM_BATCH, Perm, perm_apply_many, perm_invert, perm_make


cdef void _fill(const Perm* p, uint64_t start, int64_t[::1] out) noexcept nogil:
    cdef uint64_t x[PERM_BATCH]
    cdef Py_ssize_t done = 0, m, j
    while done < out.shape[0]:
        m = out.shape[0] - done if out.shape[0] - done < PERM_BATCH else PERM_BATCH
        for j in range(m):
            x[j] = start + <uint64_t>(done + j)
        perm_apply_many(p, x, m)
        for j in range(m):
            out[done + j] = <int64_t>x[j]
        done += m


cdef void _fill_inverse(const Perm* p, uint64_t start, int64_t[::1] out) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(out.shape[0]):
        out[j] = <int64_t>perm_invert(p, start + <uint64_t>j)


def perm_range(uint64_t key, int64_t n, int64_t start, int64_t count):
    """int64 array of perm(start), ..., perm(start+count-1); the caller checked the range."""
    out = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] view = out
    cdef Perm p = perm_make(key, <uint64_t>n)
    with nogil:
        _fill(&p, <uint64_t>start, view)
    return out


def perm_inverse_range(uint64_t key, int64_t n, int64_t start, int64_t count):
    """int64 array of perm⁻¹(start), ..., perm⁻¹(start+count-1); the caller checked the range."""
    out = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] view = out
    cdef Perm p = perm_make(key, <uint64_t>n)
    with nogil:
        _fill_inverse(&p, <uint64_t>start, view)
    return out
