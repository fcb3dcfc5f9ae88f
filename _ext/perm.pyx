# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Batched random-access permutation: the doors to _ext/perm.pxd."""
import numpy as np
from libc.stdint cimport int64_t, uint64_t
from zephon._ext.perm cimport Perm, perm_apply_each, perm_apply_many, perm_invert, perm_make


cdef void _fill(const Perm* p, uint64_t start, int64_t[::1] out) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(out.shape[0]):
        out[j] = <int64_t>(start + <uint64_t>j)
    if out.shape[0]:
        perm_apply_many(p, <uint64_t*>&out[0], out.shape[0])


cdef void _fill_inverse(const Perm* p, uint64_t start, int64_t[::1] out) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(out.shape[0]):
        out[j] = <int64_t>perm_invert(p, start + <uint64_t>j)


cdef void _fill_each(const uint64_t[::1] keys, const int64_t[::1] ns, int64_t[::1] out) noexcept nogil:
    if out.shape[0]:
        perm_apply_each(<uint64_t*>&out[0], &keys[0], <const uint64_t*>&ns[0], out.shape[0])


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


def perm_each(const uint64_t[::1] keys, const int64_t[::1] ns, const int64_t[::1] xs):
    """int64 array of perm(keys[j], ns[j], xs[j]); the caller checked shapes and ranges."""
    out = np.array(xs, dtype=np.int64, copy=True)
    cdef int64_t[::1] view = out
    with nogil:
        _fill_each(keys, ns, view)
    return out
