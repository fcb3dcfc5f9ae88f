# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Batched random-access permutation: the door to zephon/_ext/perm.pxd."""
import numpy as np
from libc.stdint cimport int64_t, uint64_t
from zephon._ext.perm cimport Perm, perm_apply, perm_make


cdef void _fill(const Perm* p, uint64_t start, int64_t[::1] out) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(out.shape[0]):
        out[j] = <int64_t>perm_apply(p, start + <uint64_t>j)


def perm_range(uint64_t key, int64_t n, int64_t start, int64_t count):
    """int64 array of perm(start), ..., perm(start+count-1); the caller checked the range."""
    out = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] view = out
    cdef Perm p = perm_make(key, <uint64_t>n)
    with nogil:
        _fill(&p, <uint64_t>start, view)
    return out
