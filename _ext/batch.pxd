"""A batch of targets in the orders a batched walk needs, for kernels that answer many stream
indices in one call (lookup.pyx): the call's scratch (``Walk``), its runs of one pass (``Runs``).

Defined in batch.pyx; see its docstring. What runs once per target is inline here.
"""
from libc.stdint cimport int64_t, uint64_t

cdef extern from *:  # too wide for an enum
    """
    #define ZEPHON_MAX_TARGETS (1LL << 32)
    #define ZEPHON_ITEM_LOW 0xFFFFFFFFULL
    """
    const int64_t MAX_TARGETS "ZEPHON_MAX_TARGETS"  # per call: a target's index takes the high half of an item
    const uint64_t LOW "ZEPHON_ITEM_LOW"  # the low half of an item

cdef enum:
    RUNS_KEPT = 4096  # a Runs keeps its buffer between calls up to this many runs


cdef struct Walk:  # one call's scratch: four arrays of m 64-bit words (walk_open)
    Py_ssize_t m
    int64_t* keys  # the sort key of each target
    uint64_t* items  # target index << 32 | a low word (< 2**32) the caller sets, then the target's dataset
    int64_t* spare_keys  # the radix sort's other buffers
    uint64_t* spare_items
    int64_t* positions  # spare_keys after walk_sort: each target's pass position, in walk order
    int64_t* grouped  # keys after walk_group: the pass positions, grouped by dataset
    int64_t* rows  # spare_items after walk_group: the target indices, grouped by dataset


cdef inline void walk_open(Walk* w, int64_t* scratch, Py_ssize_t m) noexcept nogil:
    """Lay a Walk of ``m`` targets over ``scratch`` (4·m int64, m < MAX_TARGETS)."""
    w.m = m
    w.keys, w.spare_keys = scratch, scratch + m
    w.items, w.spare_items = <uint64_t*>(scratch + 2 * m), <uint64_t*>(scratch + 3 * m)


cdef void walk_sort(Walk* w, int64_t top, bint ordered) noexcept nogil
cdef void walk_group(Walk* w, int64_t* offsets, Py_ssize_t n) noexcept nogil


cdef struct Run:  # consecutive targets (in walk order) of one dataset in one pass
    Py_ssize_t dataset
    int64_t epoch  # the key epoch of the pass
    Py_ssize_t count


cdef struct Runs:  # one call's runs, in the order they start (runs_open, then runs_close)
    Run* at
    Py_ssize_t count, capacity
    Py_ssize_t n  # datasets
    Py_ssize_t* current  # per dataset: its current run, -1: none


cdef int runs_open(Runs* runs, Py_ssize_t n) except -1
cdef void runs_close(Runs* runs) noexcept nogil
cdef void runs_start(Runs* runs) noexcept nogil
cdef void runs_trim(Runs* runs) noexcept nogil
cdef int _runs_grow(Runs* runs) except -1 nogil  # declared here only for runs_count below; not for callers


cdef inline int runs_count(Runs* runs, Py_ssize_t dataset, int64_t epoch) except -1 nogil:
    """Count one more target of ``dataset`` in pass ``epoch`` (a new run if its pass changed)."""
    cdef Py_ssize_t r = runs.current[dataset]
    if r < 0 or runs.at[r].epoch != epoch:
        if runs.count == runs.capacity:
            _runs_grow(runs)
        r = runs.current[dataset] = runs.count
        runs.at[r].dataset, runs.at[r].epoch, runs.at[r].count = dataset, epoch, 0
        runs.count += 1
    runs.at[r].count += 1
    return 0
