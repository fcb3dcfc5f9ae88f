# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Token-aware draws: the per-draw loop of a token mixture, in exact int64 arithmetic.

Defined by zephon/core/tokens.py::draw_reference. Each draw takes the next sample of the
active dataset with the largest token deficit (ties to the earlier dataset); then every active
deficit ``c`` grows by ``(W_c − WEIGHT_SCALE·[c drawn]) × cost`` of that sample, with integer
weights ``W`` summing to WEIGHT_SCALE and integer costs, so no deficit depends on rounding.

Costs come as runs (a shard's draws cost the same), so the increments of a draw from dataset
``j`` are one row of an n×n table, rebuilt only when ``j`` enters its next run: a draw is an
argmax and n additions. Inactive datasets sit at INT64_MIN in the working copy, so the argmax
needs no mask and their deficits never change. Up to SMALL datasets the working copy lives in
fixed-size local arrays, which the compiler keeps in registers (about 1.6× faster).
"""
from libc.stdint cimport INT64_MIN, int64_t
from libc.stdlib cimport free, malloc

cdef enum:
    DONE = -1
    SMALL = 8
    WEIGHT_SCALE = 1 << 24  # must match WEIGHT_SCALE in zephon/core/tokens.py


cdef struct Draws:
    # The working copy of one call: deficits d, increments delta[j * stride + c] of a draw
    # from j, and per dataset the index of its current run and the draws after which it ends.
    Py_ssize_t n, stride
    int64_t* d
    int64_t* delta
    int64_t* run
    int64_t* limit


cdef bint _enter_run(Draws* D, Py_ssize_t j, const int64_t[::1] weights, const int64_t[::1] ends,
                     const int64_t[::1] costs, const int64_t[::1] first, int64_t drawn) noexcept nogil:
    """Move j to the run holding its next draw and set its increments; False if none is known."""
    cdef Py_ssize_t c
    while D.run[j] < first[j + 1] and ends[D.run[j]] <= drawn:
        D.run[j] += 1
    if D.run[j] == first[j + 1]:
        return False
    D.limit[j] = ends[D.run[j]]
    for c in range(D.n):
        D.delta[j * D.stride + c] = (weights[c] - (WEIGHT_SCALE if c == j else 0)) * costs[D.run[j]]
    return True


cdef inline Py_ssize_t _draw(Draws* D, int64_t[::1] deficits, const int64_t[::1] weights,
                             const int64_t[::1] ends, const int64_t[::1] costs, const int64_t[::1] first,
                             int64_t[::1] drawn, int64_t target) noexcept nogil:
    cdef Py_ssize_t c, best, n = D.n, stride = D.stride, status = DONE
    cdef int64_t total = 0
    cdef int64_t top
    cdef int64_t* d = D.d
    cdef const int64_t* delta = D.delta
    cdef const int64_t* limit = D.limit
    cdef int64_t* count = &drawn[0]
    for c in range(n):
        total += count[c]
        d[c] = deficits[c] if weights[c] > 0 else INT64_MIN
        D.run[c], D.limit[c] = first[c], -1  # every active dataset enters its run when first chosen
    while total < target:
        best, top = 0, d[0]
        for c in range(1, n):
            if d[c] > top:
                best, top = c, d[c]
        if count[best] >= limit[best] and not _enter_run(D, best, weights, ends, costs, first, count[best]):
            status = best
            break
        for c in range(n):
            d[c] = d[c] + delta[best * stride + c]
        count[best] += 1
        total += 1
    for c in range(n):
        if weights[c] > 0:
            deficits[c] = d[c]
    return status


cdef Py_ssize_t _draw_small(int64_t[::1] deficits, const int64_t[::1] weights, const int64_t[::1] ends,
                            const int64_t[::1] costs, const int64_t[::1] first, int64_t[::1] drawn,
                            int64_t target) noexcept nogil:
    cdef int64_t d[SMALL]
    cdef int64_t delta[SMALL * SMALL]
    cdef int64_t run[SMALL]
    cdef int64_t limit[SMALL]
    cdef Draws D = Draws(n=deficits.shape[0], stride=SMALL, d=&d[0], delta=&delta[0], run=&run[0],
                     limit=&limit[0])
    return _draw(&D, deficits, weights, ends, costs, first, drawn, target)


def draw(int64_t[::1] deficits, const int64_t[::1] weights, const int64_t[::1] ends,
         const int64_t[::1] costs, const int64_t[::1] first, int64_t[::1] drawn, int64_t target):
    """Draw until ``sum(drawn) == target`` (returns -1) or the chosen dataset has no cost left.

    Dataset c's draws of this chunk are priced by its runs ``r`` in ``[first[c], first[c+1])``:
    run r covers its draws ``[ends[r-1], ends[r])`` (from 0 for its first run) at ``costs[r]``
    units each; ``weights`` are integer units (0: inactive). ``deficits`` and ``drawn`` advance
    in place. Returns the dataset that needs more runs, or -1 when the chunk is full. At least
    one weight is positive.
    """
    cdef Py_ssize_t status, c, n = deficits.shape[0]
    cdef Draws D
    if not (weights.shape[0] == drawn.shape[0] == n and first.shape[0] == n + 1 and first[0] == 0
            and first[n] == ends.shape[0] == costs.shape[0]):
        raise ValueError(f"draw: {n} deficits, {weights.shape[0]} weights, {drawn.shape[0]} drawn, "
                         f"{first.shape[0]} run offsets for {ends.shape[0]} ends and {costs.shape[0]} costs; "
                         f"pass one weight and count per deficit and first = run offsets (0 .. len(ends))")
    for c in range(n):
        if first[c] > first[c + 1] or weights[c] < 0:
            raise ValueError(f"draw: dataset {c} has run offsets {first[c]}..{first[c + 1]} and weight "
                             f"{weights[c]}; offsets must ascend and weights be >= 0")
    if not any(weights[c] > 0 for c in range(n)):
        raise ValueError("draw: every weight is 0; at least one dataset must be active")
    if n <= SMALL:
        with nogil:
            status = _draw_small(deficits, weights, ends, costs, first, drawn, target)
        return status
    D = Draws(n=n, stride=n, d=<int64_t*>malloc((n + n * n) * sizeof(int64_t)), delta=NULL,
              run=<int64_t*>malloc(2 * n * sizeof(int64_t)), limit=NULL)
    if D.d == NULL or D.run == NULL:
        free(D.d)
        free(D.run)
        raise MemoryError()
    D.delta, D.limit = D.d + n, D.run + n
    with nogil:
        status = _draw(&D, deficits, weights, ends, costs, first, drawn, target)
    free(D.d)
    free(D.run)
    return status
