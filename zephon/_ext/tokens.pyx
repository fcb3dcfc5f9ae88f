# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Token-aware draws: the per-draw loop of a token mixture, compiled with -ffp-contract=off.

Defined by zephon/core/tokens.py::draw_reference. Each draw takes the next sample of the
active dataset with the largest token deficit (ties to the earlier dataset); then every active
deficit grows by ``weight × cost`` of that sample and the drawn dataset's falls by the cost.
"""
from libc.stdint cimport int64_t

cdef enum:
    DONE = -1


cdef Py_ssize_t _draw(double[::1] deficits, const double[::1] weights, const double[:, ::1] costs,
                      const int64_t[::1] available, int64_t[::1] drawn, int64_t target) noexcept nogil:
    cdef Py_ssize_t c, best, n = deficits.shape[0]
    cdef int64_t total = 0
    cdef double cost
    for c in range(n):
        total += drawn[c]
    while total < target:
        best = -1
        for c in range(n):
            if weights[c] > 0.0 and (best < 0 or deficits[c] > deficits[best]):
                best = c
        if drawn[best] == available[best]:
            return best
        cost = costs[best, drawn[best]]
        for c in range(n):
            if weights[c] > 0.0:
                deficits[c] = deficits[c] + weights[c] * cost
        deficits[best] = deficits[best] - cost
        drawn[best] += 1
        total += 1
    return DONE


def draw(double[::1] deficits, const double[::1] weights, const double[:, ::1] costs,
         const int64_t[::1] available, int64_t[::1] drawn, int64_t target):
    """Draw until ``sum(drawn) == target`` (returns -1) or the chosen dataset has no cost left.

    ``costs[c, j]`` is the cost of dataset c's j-th draw of this chunk, valid for
    ``j < available[c]``; ``deficits`` and ``drawn`` advance in place. Returns the dataset
    that needs more costs, or -1 when the chunk is full. At least one weight is positive.
    """
    cdef Py_ssize_t status
    with nogil:
        status = _draw(deficits, weights, costs, available, drawn, target)
    return status
