# cython: cdivision=True
# (A .pxd takes no directives from the .pyx that cimports it; the ring index is non-negative.)
"""Chunk shapes: a chunk's weighted round robin as a table of draws, cached by quota vector, for
kernels that place a chunk's samples without reading the chunk (lookup.pyx).

Defined in shapes.pyx; see its docstring. The lookup of a cached shape is inline here.
"""
from libc.stdint cimport int32_t, int64_t


cdef struct Draw:  # one step of a chunk's round robin
    int32_t dataset
    int32_t rank  # among the dataset's draws in the chunk (chunks of at most 2**31 samples)


cdef struct Shape:  # a cached round robin
    int64_t* quotas  # n, per dataset (zeros included)
    Draw* draws  # one per sample of the chunk
    Py_ssize_t total


cdef struct ShapeCache:  # first in, first out (shapes_open, then shapes_close)
    Py_ssize_t n  # datasets
    Py_ssize_t max_shapes, budget  # the most shapes and bytes of draws kept (the newest stays even if larger)
    Shape* ring  # max_shapes entries
    Py_ssize_t first, count, last, bytes  # oldest, how many, the one found last, their draws' bytes


cdef int shapes_open(ShapeCache* cache, Py_ssize_t n, Py_ssize_t max_shapes, Py_ssize_t budget) except -1
cdef void shapes_close(ShapeCache* cache) noexcept nogil
cdef const Draw* shapes_add(ShapeCache* cache, const int64_t* quotas) except NULL


cdef inline bint _same(const int64_t* a, const int64_t* b, Py_ssize_t n) noexcept nogil:  # for shapes_draws only
    cdef Py_ssize_t c
    for c in range(n):
        if a[c] != b[c]:
            return False
    return True


cdef inline const Draw* shapes_draws(ShapeCache* cache, const int64_t* quotas) except NULL nogil:
    """The round robin of a chunk with these quotas (n of them), from the cache or built."""
    cdef Py_ssize_t i, slot
    if cache.count and _same(cache.ring[cache.last].quotas, quotas, cache.n):
        return cache.ring[cache.last].draws
    for i in range(cache.count):
        slot = (cache.first + i) % cache.max_shapes
        if _same(cache.ring[slot].quotas, quotas, cache.n):
            cache.last = slot
            return cache.ring[slot].draws
    with gil:
        return shapes_add(cache, quotas)
