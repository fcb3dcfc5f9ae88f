# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A batch of targets in the orders a batched walk needs: by key, then by dataset, in runs of one pass.

Defined by numpy's stable argsort: ``stable_order(keys)`` (the order of ``walk_sort``) is
``np.argsort(keys, kind="stable")``, and ``walk_group`` is the same on the datasets, one
counting pass. A kernel answering many stream indices in one call (lookup.pyx) keys each
target, walks the stream once in key order, and hands the targets to the cursor kernel by
dataset; this module holds the orders, which know nothing of streams:

* ``walk_sort`` — an LSD radix sort of the keys, carrying the items: digits of at most 11 bits,
  as many passes as the largest key needs (none for keys already in order, one target
  included), and a pass whose digit is the same for every key moves nothing. O(m), no
  comparison sort.
* ``runs_count`` — during the walk, consecutive targets of one dataset in one pass make a run;
  a new run starts whenever a dataset's pass changes.
* ``walk_group`` — a stable counting sort of the walked targets by dataset, so each dataset's
  runs come one after the other, in walk order, each ready for one batch of the cursor kernel.

The four buffers of a ``Walk`` are reused as the steps free them (``batch.pxd``): 32 bytes of
scratch per target in all.
"""
import numpy as np
from libc.stdlib cimport free, malloc, realloc

cdef enum:
    DIGIT_BITS = 11  # widest radix digit: 2048 counters


def stable_order(const int64_t[::1] keys):
    """The indices that sort ``keys`` (each >= 0), equal keys in their order: ``walk_sort``'s order.

    Returns an int64 array, ``np.argsort(keys, kind="stable")``.
    """
    cdef Py_ssize_t j, m = keys.shape[0]
    cdef int64_t top = 0
    cdef bint ordered = True
    if m >= MAX_TARGETS:
        raise ValueError(f"stable_order: {m} keys; pass fewer than {MAX_TARGETS}")
    for j in range(m):
        if keys[j] < 0:
            raise ValueError(f"stable_order: keys[{j}] = {keys[j]}; pass keys >= 0")
        top = keys[j] if keys[j] > top else top
        ordered &= j == 0 or keys[j] >= keys[j - 1]
    scratch, order = np.empty(4 * m + 1, dtype=np.int64), np.empty(m, dtype=np.int64)
    cdef int64_t[::1] scratch_view = scratch, order_view = order
    cdef Walk w
    walk_open(&w, &scratch_view[0], m)
    with nogil:
        for j in range(m):
            w.keys[j], w.items[j] = keys[j], <uint64_t>j << 32
        walk_sort(&w, top, ordered)
        for j in range(m):
            order_view[j] = <int64_t>(w.items[j] >> 32)
    return order


cdef void walk_sort(Walk* w, int64_t top, bint ordered) noexcept nogil:
    """Put w.keys and w.items in key order (keys in [0, top]; nothing moves if ``ordered``);
    the spare key buffer becomes w.positions."""
    if not ordered:
        _radix_sort(w, top)
    w.positions = w.spare_keys


cdef void _radix_sort(Walk* w, int64_t top) noexcept nogil:
    """Sort w.keys and w.items by w.keys (stable LSD radix sort; keys in [0, top]).

    Digits of at most DIGIT_BITS bits, as many passes as ``top`` needs; a pass whose digit
    is the same for every key moves nothing.
    """
    cdef Py_ssize_t j, d, p, m = w.m, bits = 0, passes, width
    cdef int64_t shift, mask, total, count
    cdef Py_ssize_t counts[1 << DIGIT_BITS]
    while (top >> bits) != 0:
        bits += 1
    passes = (bits + DIGIT_BITS - 1) // DIGIT_BITS
    width = (bits + passes - 1) // passes if passes else 0
    mask = (<int64_t>1 << width) - 1
    for p in range(passes):
        shift = p * width
        for d in range(mask + 1):
            counts[d] = 0
        for j in range(m):
            counts[(w.keys[j] >> shift) & mask] += 1
        if counts[(w.keys[0] >> shift) & mask] < m:
            total = 0
            for d in range(mask + 1):
                count, counts[d] = counts[d], total
                total += count
            for j in range(m):
                d = (w.keys[j] >> shift) & mask
                w.spare_keys[counts[d]], w.spare_items[counts[d]] = w.keys[j], w.items[j]
                counts[d] += 1
            w.keys, w.spare_keys = w.spare_keys, w.keys
            w.items, w.spare_items = w.spare_items, w.items


cdef void walk_group(Walk* w, int64_t* offsets, Py_ssize_t n) noexcept nogil:
    """Stable counting sort of the walked targets by dataset (the low word of their items):
    w.positions into w.grouped, target indices into w.rows. offsets[c] = where dataset c's
    targets start; uses offsets[n:2n]."""
    cdef Py_ssize_t j, c
    cdef int64_t total = 0, count
    cdef int64_t* next_at = offsets + n
    w.grouped, w.rows = w.keys, <int64_t*>w.spare_items
    for c in range(n):
        offsets[c] = 0
    for j in range(w.m):
        offsets[w.items[j] & LOW] += 1
    for c in range(n):
        count, offsets[c], next_at[c] = offsets[c], total, total
        total += count
    for j in range(w.m):
        c = w.items[j] & LOW
        w.grouped[next_at[c]], w.rows[next_at[c]] = w.positions[j], <int64_t>(w.items[j] >> 32)
        next_at[c] += 1


cdef int runs_open(Runs* runs, Py_ssize_t n) except -1:
    """An empty Runs for ``n`` datasets (runs_close frees it)."""
    runs.at, runs.count, runs.capacity, runs.n = NULL, 0, 0, n
    runs.current = <Py_ssize_t*>malloc((n + 1) * sizeof(Py_ssize_t))
    if runs.current == NULL:
        raise MemoryError("Runs: no memory for the datasets' runs")
    return 0


cdef void runs_close(Runs* runs) noexcept nogil:
    free(runs.at)
    free(runs.current)
    runs.at, runs.current, runs.count, runs.capacity = NULL, NULL, 0, 0


cdef void runs_start(Runs* runs) noexcept nogil:
    """A new call: no runs, no dataset in one."""
    cdef Py_ssize_t c
    runs.count = 0
    for c in range(runs.n):
        runs.current[c] = -1


cdef void runs_trim(Runs* runs) noexcept nogil:
    """After a call: free the run buffer if it grew past RUNS_KEPT runs."""
    if runs.capacity > RUNS_KEPT:
        free(runs.at)
        runs.at, runs.count, runs.capacity = NULL, 0, 0


cdef int _runs_grow(Runs* runs) except -1 nogil:
    """Room for more runs (runs_count's slow path)."""
    cdef Py_ssize_t capacity = 2 * runs.capacity + 16
    cdef Run* grown = <Run*>realloc(runs.at, capacity * sizeof(Run))
    if grown == NULL:
        with gil:
            raise MemoryError("Runs: no memory for the runs of the targets")
    runs.at, runs.capacity = grown, capacity
    return 0
