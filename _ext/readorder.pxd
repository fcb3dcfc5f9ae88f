"""The readorder kernel's exact weighted round robin, for kernels that need a chunk's order
without reading it (shapes.pyx). Defined in readorder.pyx; see its docstring.
"""
from libc.stdint cimport int64_t

cdef enum:
    LANES = 4  # round robin over at most this many components keeps its scores in registers
    LIVE = 0  # scratch rows, one int64 per component: non-empty components, in order
    SCORE = 1  # round-robin score of the i-th live component / weighted-random emitted count
    GROW = 2  # count of the i-th live component (what its score gains per step)
    START = 3  # first buffer row of every component
    NEXT = 4  # next as-is buffer row of every component
    SCRATCH = 5  # how many scratch rows the doors allocate


cdef void round_robin(const int64_t[::1] counts, int64_t total, int64_t[:, ::1] scratch,
                      int64_t[::1] component, int64_t[::1] rows) noexcept nogil
