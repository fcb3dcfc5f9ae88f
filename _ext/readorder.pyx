# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Interleaved read order of a WorkChunk: the kernel behind zephon/core/readorder.py.

Defined by zephon/core/readorder.py::read_order_reference. Two doors share the loops:
``read_order`` returns ``(component, rows)``; ``read_pointers`` also copies those rows out
of the chunk's buffer and returns ``(pointers, component)``. ``iter_pairs`` is the one place
that builds Python objects: the ``((d, s, o), name)`` pairs a chunk iterates. readorder.pxd
declares ``round_robin`` (and the scratch rows) for the random-access kernel's shapes (shapes.pyx).
"""
import numpy as np
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, _Py_REFCNT
from libc.stdint cimport INT64_MIN, int64_t, uint64_t
from libc.stdlib cimport free, malloc
from zephon._ext._keys cimport derive
from zephon._ext.perm cimport Perm, perm_apply, perm_make
from zephon._ext.stream cimport stream_fence, stream_put

cdef double UNIT = 1.0 / 9007199254740992.0  # 2**-53, must match zephon/core/readorder.py


cdef Py_ssize_t _start(const int64_t[::1] counts, int64_t[::1] live, int64_t[::1] starts,
                       int64_t[::1] next_row) noexcept nogil:
    """List the non-empty components in live, set starts and next_row; return how many live."""
    cdef Py_ssize_t k, n_live = 0
    cdef int64_t start = 0
    for k in range(counts.shape[0]):
        starts[k] = next_row[k] = start
        start += counts[k]
        if counts[k] > 0:
            live[n_live] = k
            n_live += 1
    return n_live


cdef Py_ssize_t _drop(int64_t[::1] active, Py_ssize_t n_active, Py_ssize_t a) noexcept nogil:
    """Remove active[a], keeping the order of the rest; return the new length."""
    cdef Py_ssize_t b
    for b in range(a, n_active - 1):
        active[b] = active[b + 1]
    return n_active - 1


# Exact weighted round robin emits, at step t, the component with samples left that
# maximises s_k(t) = n_k * max(1, t) - E_k * N, ties to the earlier one. The loops below
# keep s_k incrementally (from t = 1 on, s_k gains n_k per step and loses N when emitted)
# and never drop exhausted components, which is exact: for 1 <= t < N the scores of all
# components sum to (sum of n_k) * t - N * (sum of E_k) = N * t - N * t = 0; an exhausted one has
# s_k = n_k * (t - N) < 0 and an empty one 0, so the components with samples left sum to
# >= 0, and their maximum (>= 0) beats every exhausted score. At t = 0 none is exhausted.
# Empty components are left out up front: they would tie at 0 and win when earlier.
# Scores stay in (-2**62, 2**62] because N <= 2**31 (readorder.py's MAX_CHUNK).


cdef inline int _argmax4(int64_t s0, int64_t s1, int64_t s2, int64_t s3) noexcept nogil:
    """Index of the largest of four scores, ties to the earliest, without branches."""
    cdef bint c01 = s1 > s0, c23 = s3 > s2
    cdef bint cf = (s3 if c23 else s2) > (s1 if c01 else s0)
    return (2 + <int>c23) if cf else <int>c01


cdef void _round_robin_lanes(const int64_t[::1] counts, int64_t total, const int64_t[::1] live,
                             Py_ssize_t n_live, int64_t[::1] next_row,
                             int64_t[::1] component, int64_t[::1] rows) noexcept nogil:
    """Round robin over at most LANES non-empty components, scores and rows in registers.

    Unused lanes grow by 0 from INT64_MIN, so they never win.
    """
    cdef int64_t lane_k[LANES]
    cdef int64_t lane_row[LANES]
    cdef int64_t n[LANES]
    cdef int64_t s0, s1, s2, s3, g0 = 0, g1 = 0, g2 = 0, g3 = 0
    cdef Py_ssize_t a, t
    cdef int b
    for a in range(LANES):
        lane_k[a] = live[a] if a < n_live else 0
        lane_row[a] = next_row[lane_k[a]] if a < n_live else 0
        n[a] = counts[lane_k[a]] if a < n_live else 0
    s0 = n[0] if n_live > 0 else INT64_MIN  # scores at t = 0
    s1 = n[1] if n_live > 1 else INT64_MIN
    s2 = n[2] if n_live > 2 else INT64_MIN
    s3 = n[3] if n_live > 3 else INT64_MIN
    for t in range(total):
        b = _argmax4(s0, s1, s2, s3)
        component[t] = lane_k[b]
        rows[t] = lane_row[b]
        lane_row[b] += 1
        s0 += g0 - (total if b == 0 else 0)
        s1 += g1 - (total if b == 1 else 0)
        s2 += g2 - (total if b == 2 else 0)
        s3 += g3 - (total if b == 3 else 0)
        g0, g1, g2, g3 = n[0], n[1], n[2], n[3]  # max(1, t) grows by one from t = 1 on


cdef void _round_robin_any(const int64_t[::1] counts, int64_t total, const int64_t[::1] live,
                           Py_ssize_t n_live, int64_t[::1] score, int64_t[::1] grow,
                           int64_t[::1] next_row, int64_t[::1] component,
                           int64_t[::1] rows) noexcept nogil:
    """Round robin over any number of non-empty components, one scan of the scores a step.

    The scan first applies the previous step's update (score += grow, minus N for the
    component emitted), so grow is zero until step t = 1 is done (max(1, t) is 1 for t = 0
    and t = 1) and prev names no component at t = 0. Every score exceeds INT64_MIN.
    """
    cdef Py_ssize_t a, best, prev = -1, t
    cdef int64_t best_score, k
    for a in range(n_live):
        score[a] = counts[live[a]]
        grow[a] = 0
    for t in range(total):
        best, best_score = 0, INT64_MIN
        for a in range(n_live):
            score[a] += grow[a] - (total if a == prev else 0)
            if score[a] > best_score:
                best, best_score = a, score[a]
        k = live[best]
        component[t] = k
        rows[t] = next_row[k]
        next_row[k] += 1
        prev = best
        if t == 1:
            for a in range(n_live):
                grow[a] = counts[live[a]]


cdef void round_robin(const int64_t[::1] counts, int64_t total, int64_t[:, ::1] scratch,
                      int64_t[::1] component, int64_t[::1] rows) noexcept nogil:
    """Exact weighted round robin over ``counts`` (zeros allowed): the component and as-is
    buffer row of every step; ``scratch`` holds SCRATCH zeroed rows of one int64 per component
    and keeps the first buffer row of every component in row START."""
    cdef Py_ssize_t n_live = _start(counts, scratch[LIVE], scratch[START], scratch[NEXT])
    if n_live <= LANES:
        _round_robin_lanes(counts, total, scratch[LIVE], n_live, scratch[NEXT], component, rows)
    else:
        _round_robin_any(counts, total, scratch[LIVE], n_live, scratch[SCORE], scratch[GROW],
                         scratch[NEXT], component, rows)


cdef void _weighted_random(const int64_t[::1] counts, int64_t total, uint64_t key,
                           int64_t[::1] active, Py_ssize_t n_active, int64_t[::1] emitted,
                           int64_t[::1] next_row, int64_t[::1] component,
                           int64_t[::1] rows) noexcept nogil:
    """Draw x in [0, W) per step; emit the first component whose running count exceeds x."""
    cdef Py_ssize_t a
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
        rows[t] = next_row[k]
        next_row[k] += 1
        emitted[k] += 1
        if emitted[k] == counts[k]:
            weight -= counts[k]
            n_active = _drop(active, n_active, a)


cdef Perm* _make_perms(const int64_t[::1] counts, const uint64_t[::1] keys) except NULL:
    """The permutation of every component, in a malloc'd array the caller frees."""
    cdef Py_ssize_t k, n = counts.shape[0]
    cdef Perm* perms = <Perm*>malloc((n if n > 0 else 1) * sizeof(Perm))
    if perms == NULL:
        raise MemoryError("read_order: no memory for the shuffle permutations")
    for k in range(n):
        perms[k] = perm_make(keys[k], <uint64_t>counts[k])
    return perms


cdef void _shuffle_rows(const Perm* perms, const int64_t[::1] starts,
                        const int64_t[::1] component, int64_t[::1] rows) noexcept nogil:
    """Map every as-is row start_k + j to start_k + perms[k](j), in place."""
    cdef Py_ssize_t k, t
    for t in range(component.shape[0]):
        k = component[t]
        rows[t] = starts[k] + <int64_t>perm_apply(&perms[k], <uint64_t>(rows[t] - starts[k]))


cdef void _read_order(const int64_t[::1] counts, int64_t total, bint weighted_random,
                      uint64_t random_key, const Perm* perms, int64_t[:, ::1] scratch,
                      int64_t[::1] component, int64_t[::1] rows) noexcept nogil:
    """Fill component and rows; scratch holds SCRATCH zeroed rows of one int64 per component.

    perms is NULL to read each component in stored order, else one permutation per component.
    """
    cdef Py_ssize_t n_live
    if weighted_random:
        n_live = _start(counts, scratch[LIVE], scratch[START], scratch[NEXT])
        _weighted_random(counts, total, random_key, scratch[LIVE], n_live, scratch[SCORE],
                         scratch[NEXT], component, rows)
    else:
        round_robin(counts, total, scratch, component, rows)
    if perms != NULL:
        _shuffle_rows(perms, scratch[START], component, rows)


cdef void _gather(const int64_t[:, ::1] buffer, const int64_t[::1] rows,
                  int64_t[:, ::1] pointers, bint stream) noexcept nogil:
    """pointers[t] = buffer[rows[t]]; with ``stream``, written past the caches (non-temporal
    stores): for arrays read later or by another process, not by this core now."""
    cdef Py_ssize_t t
    cdef int64_t r
    for t in range(rows.shape[0]):
        r = rows[t]
        stream_put(&pointers[t, 0], buffer[r, 0], stream)
        stream_put(&pointers[t, 1], buffer[r, 1], stream)
        stream_put(&pointers[t, 2], buffer[r, 2], stream)
    if stream:
        stream_fence()


cdef int64_t _total(const int64_t[::1] counts, const uint64_t[::1] shuffle_keys) except -1:
    """Sum of counts, after checking there is one shuffle key per component (if any)."""
    cdef Py_ssize_t k, n = counts.shape[0]
    cdef int64_t total = 0
    if shuffle_keys is not None and shuffle_keys.shape[0] != n:
        raise ValueError(f"read_order: shuffle_keys has {shuffle_keys.shape[0]} keys, "
                         f"counts has {n}; pass one key per component")
    for k in range(n):
        total += counts[k]
    return total


def read_order(const int64_t[::1] counts, bint weighted_random, uint64_t random_key,
               const uint64_t[::1] shuffle_keys):
    """(component, rows) int64 arrays of every step; the caller checked the counts.

    shuffle_keys is None to read each component in stored order, else one key per component.
    """
    cdef int64_t total = _total(counts, shuffle_keys)
    component = np.empty(total, dtype=np.int64)
    rows = np.empty(total, dtype=np.int64)
    scratch = np.zeros((SCRATCH, counts.shape[0]), dtype=np.int64)
    cdef int64_t[::1] component_view = component, rows_view = rows
    cdef int64_t[:, ::1] scratch_view = scratch
    cdef Perm* perms = NULL if shuffle_keys is None else _make_perms(counts, shuffle_keys)
    try:
        with nogil:
            _read_order(counts, total, weighted_random, random_key, perms, scratch_view,
                        component_view, rows_view)
    finally:
        free(perms)
    return component, rows


def read_pointers(const int64_t[:, ::1] buffer, const int64_t[::1] counts,
                  bint weighted_random, uint64_t random_key, const uint64_t[::1] shuffle_keys,
                  object pointers=None, object component=None):
    """(pointers (N, 3), component (N,)) int64 arrays: buffer[rows] and component of read_order.

    buffer is the chunk's (N, 3) pointers, components back to back as counts says. pointers
    and component, when given, are the C-contiguous int64 arrays written (and returned); the
    pointers go there past the caches (stream.h), as they are a window of a larger array (a
    DataLoader worker's shared slot) that is read later: paired runs of 2 workers read pointers
    1.14x as fast, the workers' CPU 3.0-3.4 against 3.3-4.0 us a batch of 256.
    """
    cdef int64_t total = _total(counts, shuffle_keys)
    if buffer.shape[0] != total or buffer.shape[1] != 3:
        raise ValueError(f"read_pointers: buffer has shape ({buffer.shape[0]}, "
                         f"{buffer.shape[1]}) but counts sum to {total}; pass the chunk's "
                         f"({total}, 3) buffer")
    cdef bint stream = pointers is not None
    pointers = np.empty((total, 3), dtype=np.int64) if pointers is None else pointers
    component = np.empty(total, dtype=np.int64) if component is None else component
    cdef int64_t[::1] component_view = component
    cdef int64_t[:, ::1] pointers_view = pointers
    if pointers_view.shape[0] != total or pointers_view.shape[1] != 3 or component_view.shape[0] != total:
        raise ValueError(f"read_pointers: the output arrays have shapes {np.shape(pointers)} and "
                         f"{np.shape(component)}; pass ({total}, 3) and ({total},) int64 arrays")
    rows = np.empty(total, dtype=np.int64)
    scratch = np.zeros((SCRATCH, counts.shape[0]), dtype=np.int64)
    cdef int64_t[::1] rows_view = rows
    cdef int64_t[:, ::1] scratch_view = scratch
    cdef Perm* perms = NULL if shuffle_keys is None else _make_perms(counts, shuffle_keys)
    try:
        with nogil:
            _read_order(counts, total, weighted_random, random_key, perms, scratch_view,
                        component_view, rows_view)
            _gather(buffer, rows_view, pointers_view, stream)
    finally:
        free(perms)
    return pointers, component


# -- Python pairs -----------------------------------------------------------------------------

cdef extern from *:
    """
    #ifdef Py_GIL_DISABLED
    #define ZEPHON_RECYCLE_PAIRS 0
    #else
    #define ZEPHON_RECYCLE_PAIRS 1
    #endif
    """
    const bint RECYCLE_PAIRS "ZEPHON_RECYCLE_PAIRS"  # refcount 1 means unshared only under a GIL

cdef extern from "Python.h":
    # Forms on borrowed pointers, so the reference counts below are exactly the ones written.
    PyObject* _tuple_item "PyTuple_GET_ITEM"(PyObject* tup, Py_ssize_t j)
    void _tuple_put "PyTuple_SET_ITEM"(PyObject* tup, Py_ssize_t j, PyObject* item)  # steals
    void _decref "Py_DECREF"(PyObject* obj)


cdef inline void _replace(PyObject* tup, Py_ssize_t j, object item) noexcept:
    """Put item at position j of a tuple only the caller holds, releasing the old item."""
    cdef PyObject* old = _tuple_item(tup, j)
    Py_INCREF(item)
    _tuple_put(tup, j, <PyObject*>item)
    _decref(old)  # an int, a str or an id tuple of ints: no finaliser runs


cdef class _Pairs:
    """Iterator of ``((d, s, o), names[component[i]])`` over read-order arrays.

    Like ``zip`` and ``enumerate``, it refills a pair it handed out earlier once nothing else
    holds it (and that pair's id tuple when nothing else holds the id). Two pairs alternate,
    so a ``for x in chunk`` loop, whose variable still holds the previous pair while the
    next is made, gets them back. Only ints and strs go in, so a refilled tuple never needs
    the cycle collector, whether it is tracked or not.
    """

    cdef const int64_t[:, ::1] pointers
    cdef const int64_t[::1] component
    cdef tuple names
    cdef Py_ssize_t i
    cdef object even, odd  # the last pair handed out at an even / odd position, or None

    def __iter__(self):
        return self

    def __next__(self):
        cdef Py_ssize_t i = self.i
        cdef PyObject* pair
        cdef PyObject* sample_id
        if i >= self.component.shape[0]:
            self.even = self.odd = None
            raise StopIteration
        self.i = i + 1
        d, s, o = self.pointers[i, 0], self.pointers[i, 1], self.pointers[i, 2]
        name = self.names[self.component[i]]
        pair = <PyObject*>self.odd if i & 1 else <PyObject*>self.even
        if RECYCLE_PAIRS and pair != <PyObject*>None and _Py_REFCNT(pair) == 1:
            sample_id = _tuple_item(pair, 0)
            if _Py_REFCNT(sample_id) == 1:
                _replace(sample_id, 0, d)
                _replace(sample_id, 1, s)
                _replace(sample_id, 2, o)
            else:
                _replace(pair, 0, (d, s, o))
            _replace(pair, 1, name)
            return <object>pair
        fresh = ((d, s, o), name)
        if i & 1:
            self.odd = fresh
        else:
            self.even = fresh
        return fresh


def iter_pairs(const int64_t[:, ::1] pointers, const int64_t[::1] component, tuple names):
    """Iterator of ``((d, s, o), names[k])`` Python pairs over read_pointers' arrays.

    Every component index must be in ``[0, len(names))``; the arrays must not change while
    the iterator runs (a chunk's are read-only).
    """
    cdef Py_ssize_t t, n_names = len(names)
    cdef bint in_range = True
    if pointers.shape[0] != component.shape[0] or pointers.shape[1] != 3:
        raise ValueError(f"iter_pairs: pointers has shape ({pointers.shape[0]}, "
                         f"{pointers.shape[1]}) for {component.shape[0]} components; "
                         "pass the (N, 3) and (N,) arrays of read_pointers")
    with nogil:
        for t in range(component.shape[0]):
            in_range &= 0 <= component[t] < n_names
    if not in_range:
        raise ValueError(f"iter_pairs: a component index is outside [0, {n_names}); "
                         "pass one name per component")
    cdef _Pairs pairs = _Pairs.__new__(_Pairs)
    pairs.pointers, pairs.component, pairs.names = pointers, component, names
    return pairs
