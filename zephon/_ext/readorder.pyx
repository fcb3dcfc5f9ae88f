# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Interleaved read order of a WorkChunk: the kernel behind zephon/core/readorder.py.

Defined by zephon/core/readorder.py::read_order_reference.
"""
import numpy as np
from libc.stdint cimport int64_t, uint64_t
from zephon._ext._keys cimport derive
from zephon._ext.perm cimport Perm, perm_apply, perm_make

cdef double UNIT = 1.0 / 9007199254740992.0  # 2**-53, must match zephon/core/readorder.py


cdef Py_ssize_t _start(const int64_t[::1] counts, int64_t[::1] active) noexcept nogil:
    """Put the components with samples, in order, at the front of active; return how many."""
    cdef Py_ssize_t k, n_active = 0
    for k in range(counts.shape[0]):
        if counts[k] > 0:
            active[n_active] = k
            n_active += 1
    return n_active


cdef Py_ssize_t _drop(int64_t[::1] active, Py_ssize_t n_active, Py_ssize_t a) noexcept nogil:
    """Remove active[a], keeping the order of the rest; return the new length."""
    cdef Py_ssize_t b
    for b in range(a, n_active - 1):
        active[b] = active[b + 1]
    return n_active - 1


cdef void _round_robin(const int64_t[::1] counts, int64_t total, int64_t[::1] active,
                       int64_t[::1] emitted, int64_t[::1] component) noexcept nogil:
    """Exact weighted round robin: max n_k * max(1, t) - E_k * N, ties to the earlier."""
    cdef Py_ssize_t n_active = _start(counts, active), a, best
    cdef int64_t t, k, scale, priority, best_priority
    for t in range(total):
        scale = t if t > 1 else 1
        best = 0
        best_priority = counts[active[0]] * scale - emitted[active[0]] * total
        for a in range(1, n_active):
            k = active[a]
            priority = counts[k] * scale - emitted[k] * total
            if priority > best_priority:
                best, best_priority = a, priority
        k = active[best]
        component[t] = k
        emitted[k] += 1
        if emitted[k] == counts[k]:
            n_active = _drop(active, n_active, best)


cdef void _weighted_random(const int64_t[::1] counts, int64_t total, uint64_t key,
                           int64_t[::1] active, int64_t[::1] emitted,
                           int64_t[::1] component) noexcept nogil:
    """Draw x in [0, W) per step; emit the first component whose running count exceeds x."""
    cdef Py_ssize_t n_active = _start(counts, active), a
    cdef int64_t t, k, x, running, weight = total
    cdef double u
    for t in range(total):
        u = <double>(derive(key, <uint64_t>t) >> 11) * UNIT
        x = <int64_t>(u * <double>weight)
        if x > weight - 1:
            x = weight - 1
        a = 0
        running = counts[active[0]]
        while running <= x:
            a += 1
            running += counts[active[a]]
        k = active[a]
        component[t] = k
        emitted[k] += 1
        if emitted[k] == counts[k]:
            weight -= counts[k]
            n_active = _drop(active, n_active, a)


cdef void _rows(const int64_t[::1] counts, const uint64_t[::1] keys, bint shuffle,
                const int64_t[::1] component, int64_t[::1] starts, int64_t[::1] bits,
                int64_t[::1] emitted, int64_t[::1] rows) noexcept nogil:
    """Buffer row of every step: component start + (perm of) its emitted count."""
    cdef Py_ssize_t k, t
    cdef int64_t start = 0, j
    cdef Perm p
    for k in range(counts.shape[0]):
        starts[k] = start
        start += counts[k]
        emitted[k] = 0
        if shuffle:
            bits[k] = perm_make(keys[k], <uint64_t>counts[k]).bits
    for t in range(component.shape[0]):
        k = component[t]
        j = emitted[k]
        emitted[k] += 1
        if shuffle:
            p.key, p.n, p.bits = keys[k], <uint64_t>counts[k], bits[k]
            j = <int64_t>perm_apply(&p, <uint64_t>j)
        rows[t] = starts[k] + j


cdef void _read_order(const int64_t[::1] counts, int64_t total, bint weighted_random,
                      uint64_t random_key, const uint64_t[::1] keys, bint shuffle,
                      int64_t[:, ::1] scratch, int64_t[::1] component,
                      int64_t[::1] rows) noexcept nogil:
    """Fill component and rows; scratch holds three zeroed rows of one int64 per component."""
    if weighted_random:
        _weighted_random(counts, total, random_key, scratch[0], scratch[1], component)
    else:
        _round_robin(counts, total, scratch[0], scratch[1], component)
    _rows(counts, keys, shuffle, component, scratch[0], scratch[2], scratch[1], rows)


def read_order(const int64_t[::1] counts, bint weighted_random, uint64_t random_key,
               const uint64_t[::1] shuffle_keys):
    """(component, rows) int64 arrays of every step; the caller checked the counts.

    shuffle_keys is None to read each component in stored order, else one key per component.
    """
    cdef Py_ssize_t k, n = counts.shape[0]
    cdef int64_t total = 0
    cdef bint shuffle = shuffle_keys is not None
    if shuffle and shuffle_keys.shape[0] != n:
        raise ValueError(f"read_order: shuffle_keys has {shuffle_keys.shape[0]} keys, "
                         f"counts has {n}; pass one key per component")
    for k in range(n):
        total += counts[k]
    component = np.empty(total, dtype=np.int64)
    rows = np.empty(total, dtype=np.int64)
    scratch = np.zeros((3, n), dtype=np.int64)
    cdef int64_t[::1] component_view = component, rows_view = rows
    cdef int64_t[:, ::1] scratch_view = scratch
    with nogil:
        _read_order(counts, total, weighted_random, random_key, shuffle_keys, shuffle,
                    scratch_view, component_view, rows_view)
    return component, rows
