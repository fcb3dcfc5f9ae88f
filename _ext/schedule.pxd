# cython: cdivision=True
# (A .pxd takes no directives from the .pyx that cimports it; _in_pass divides a non-negative
# position by a positive total, so C division is exact here.)
"""The scheduling kernel's C surface, for kernels that walk a lane themselves (lookup.pyx).

Defined in schedule.pyx; see its docstring.
"""
from libc.stdint cimport int64_t, uint64_t

cdef enum:
    ACCUMULATOR = 0
    FIXED = 1
    STOP = 0  # policy codes: index into zephon.core.config.POLICIES
    REPEAT = 1
    REDISTRIBUTE = 2
    PLANNED = -2  # _walk planned the lane's chunk
    ROUTE_MODULO = 0  # lane routing codes: zephon.core.routing's Routing.code
    ROUTE_PERMUTE = 1
    ALL_DONE = -1  # every dataset is done or none is active (else _walk returns the ending dataset)


cdef struct Ranked:
    # A dataset and its sort key, for ranking many datasets by (key, index) with qsort.
    double key
    Py_ssize_t index


cdef struct Schedule:
    # One walk's view of a Scheduler (Scheduler._open fills it, Scheduler._close frees it).
    Py_ssize_t n
    int allocator
    int64_t stop_after  # 0 = unset
    int64_t chunk_size
    const double* raw_weights
    const int64_t* totals
    const int64_t* policies
    const int64_t* max_repeats
    const int64_t* carry  # 1: pass_tail "carry" (draws run on into the next pass), 0: "drop"
    const int64_t* sum_order  # dataset indices in the mixture's insertion order (weights are summed so)
    double* weights  # active weights, recomputed only when a dataset retires
    Py_ssize_t retired  # drained redistributing datasets the weights were computed for; -1: none yet
    double* shares  # weights[c] * chunk_size, with the weights
    int64_t* fixed  # FixedAllocator's quotas, with the weights
    int exact  # the accumulator's arithmetic is exact on the grids below (1), not (0), not known yet (-1)
    int64_t* grid  # per dataset, m: its share is a multiple of 2^-m (with the weights)
    int64_t* units  # per dataset, its share as a multiple of 2^-m
    int64_t* ahead  # scratch: cumulative quotas of a block skip
    int64_t* carries  # per dataset, 1: its draws carry on through its pass ends (_carries, _room)
    double* saved  # scratch: accumulators at chunk start
    double* keys  # scratch: sort keys
    Py_ssize_t* order  # scratch: ranked dataset indices
    Ranked* ranked  # scratch: for ranking by sorting


cdef Py_ssize_t _walk(Schedule* s, int64_t lane, int64_t replicas, int routing, uint64_t lane_key,
                      int64_t* g, double* acc, int64_t* epochs, int64_t* positions, int64_t* tails,
                      int64_t* quotas, int64_t* start_epochs, int64_t* start_positions) noexcept nogil


cdef inline void _in_pass(Schedule* s, Py_ssize_t c, int64_t* epoch, int64_t* position) noexcept nogil:
    """cursor.in_pass in place: a position of dataset c past the end of pass ``epoch[0]`` (a
    "carry" draw running on) becomes the same sample in the pass it falls in. Defined here so
    that the kernels inline it."""
    cdef int64_t total = s.totals[c], passes
    if position[0] >= total:
        passes = position[0] // total
        epoch[0] += passes
        position[0] -= passes * total


cdef void _draw_starts(Schedule* s, int64_t* start_epochs, int64_t* start_positions) noexcept nogil


cdef class ScheduleTables:
    cdef const double[::1] raw_weights
    cdef const int64_t[::1] totals, policies, max_repeats, carry, sum_order
    cdef int allocator
    cdef int64_t stop_after, chunk_size


cdef class Scheduler:
    cdef ScheduleTables tables  # its config's, shared with the kernels of the config's other lanes
    cdef int64_t lane, replicas
    cdef int routing  # ROUTE_MODULO or ROUTE_PERMUTE
    cdef uint64_t lane_key

    cdef int _open(self, Schedule* s, double* weights) except -1
    cdef void _close(self, Schedule* s) noexcept
    cdef Py_ssize_t _step(self, Schedule* s, int64_t* g, double* acc, int64_t* epochs, int64_t* positions,
                          int64_t* tails, int64_t* out) noexcept nogil
