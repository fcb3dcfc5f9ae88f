# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Chunk shapes: a chunk's weighted round robin as a table, cached by its quota vector.

Defined by zephon/core/readorder.py::round_robin_reference: a shape's draws are the dataset
of every step of the round robin on the chunk's quotas and its rank among that dataset's
steps. It has no Python door: the random-access kernel (lookup.pyx) is its one user, and
tests/test_random_access.py checks that kernel against its twin, with a one-shape cache too.

A chunk's round robin depends only on its quotas, so random access keeps one table per
distinct quota vector (a *shape*: 8 bytes per sample of a chunk) instead of building it per
chunk. Shapes are few per stream (quotas move by a sample between chunks); the cache keeps
them first in, first out beyond ``max_shapes`` shapes or ``budget`` bytes, though the newest
is kept even if it alone is larger. A shape is built with the readorder kernel's exact round
robin (``readorder.round_robin``), the only step that takes the GIL.
"""
import numpy as np
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from zephon._ext.readorder cimport SCRATCH, START, round_robin


cdef int shapes_open(ShapeCache* cache, Py_ssize_t n, Py_ssize_t max_shapes, Py_ssize_t budget) except -1:
    """An empty cache of at most ``max_shapes`` (>= 1) shapes and ``budget`` bytes of draws
    for ``n`` datasets (shapes_close frees it)."""
    cache.n, cache.max_shapes, cache.budget = n, max_shapes, budget
    cache.first = cache.count = cache.last = cache.bytes = 0
    cache.ring = <Shape*>malloc(max_shapes * sizeof(Shape))
    if cache.ring == NULL:
        raise MemoryError(f"ShapeCache: no memory for {max_shapes} shapes")
    return 0


cdef void shapes_close(ShapeCache* cache) noexcept nogil:
    cdef Py_ssize_t i
    if cache.ring != NULL:
        for i in range(cache.count):
            _free_shape(&cache.ring[(cache.first + i) % cache.max_shapes])
    free(cache.ring)
    cache.ring, cache.count = NULL, 0


cdef const Draw* shapes_add(ShapeCache* cache, const int64_t* quotas) except NULL:
    """Build a chunk's round robin and cache it, evicting the oldest shapes over budget."""
    cdef Py_ssize_t c, t, slot, n = cache.n
    cdef int64_t total = 0
    for c in range(n):
        total += quotas[c]
    counts, scratch = np.empty(n, dtype=np.int64), np.zeros((SCRATCH, n), dtype=np.int64)
    component, rows = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.int64)
    cdef int64_t[::1] counts_view = counts, component_view = component, rows_view = rows
    cdef int64_t[:, ::1] scratch_view = scratch
    cdef Shape shape
    shape.total = total
    shape.quotas = <int64_t*>malloc(n * sizeof(int64_t))
    shape.draws = <Draw*>malloc(total * sizeof(Draw))
    if shape.quotas == NULL or shape.draws == NULL:
        _free_shape(&shape)
        raise MemoryError(f"ShapeCache: no memory for the round robin of a {total}-sample chunk")
    memcpy(shape.quotas, quotas, n * sizeof(int64_t))
    memcpy(&counts_view[0], quotas, n * sizeof(int64_t))
    with nogil:
        round_robin(counts_view, total, scratch_view, component_view, rows_view)
        for t in range(total):
            c = component_view[t]
            shape.draws[t].dataset = <int32_t>c
            shape.draws[t].rank = <int32_t>(rows_view[t] - scratch_view[START, c])
    while cache.count and (cache.count == cache.max_shapes
                           or cache.bytes + total * <Py_ssize_t>sizeof(Draw) > cache.budget):
        cache.bytes -= cache.ring[cache.first].total * sizeof(Draw)
        _free_shape(&cache.ring[cache.first])
        cache.first, cache.count = (cache.first + 1) % cache.max_shapes, cache.count - 1
    slot = (cache.first + cache.count) % cache.max_shapes
    cache.ring[slot], cache.last = shape, slot
    cache.count += 1
    cache.bytes += total * sizeof(Draw)
    return shape.draws


cdef void _free_shape(Shape* shape) noexcept nogil:
    free(shape.quotas)
    free(shape.draws)
