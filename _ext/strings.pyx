# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Strings of Arrow string columns: gathered as bytes from many row groups, then made Python ``str``.

Defined by zephon/io/_take.py::gather_reference and ::strings_reference. A chunk is an
Arrow string array without nulls, given as its ``offsets`` (int32 or int64, as Arrow keeps
them: one more than its rows) and ``data`` (uint8, UTF-8). ``gather`` puts row ``local[i]``
of chunk ``chunk[i]`` at position ``i`` of one new ``(offsets, data)`` pair; ``strings``
makes the ``str`` of each row of such a pair. Arrow's ``take`` over many row groups first
joins them all (a copy of every row group) and then copies the rows; ``gather`` copies each
row once, chunk by chunk (a counting sort), so that a row group stays in cache while its rows
are copied. A reader that sends batches to another process sends the gathered bytes, and the
receiver makes the strings.
"""
from cpython.list cimport PyList_New
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcpy

cdef extern from "Python.h":  # steals the new value's reference: no juggling per row
    void set_item "PyList_SET_ITEM"(object, Py_ssize_t, PyObject*)
    void incref "Py_INCREF"(object)

import numpy as np


cdef inline int64_t _offset(const void* offsets, bint wide, int64_t r) noexcept nogil:
    """Offset ``r`` of a chunk's int64 (``wide``) or int32 offsets."""
    return (<const int64_t*> offsets)[r] if wide else (<const int32_t*> offsets)[r]


cdef class _Chunks:
    """The chunks' buffers as raw pointers."""

    cdef const void** offsets
    cdef bint* wide
    cdef const char** data
    cdef int64_t* rows
    cdef int64_t* size
    cdef Py_ssize_t count
    cdef tuple arrays  # the arrays the pointers point into, held here (the caller's lists may change)

    def __cinit__(self, list offsets, list data):
        if len(offsets) != len(data):
            raise ValueError(f"gather: {len(offsets)} offsets arrays for {len(data)} data arrays")
        self.count = len(offsets)
        self.arrays = (tuple(np.asarray(o) for o in offsets), tuple(data))
        cdef Py_ssize_t room = max(self.count, 1)
        self.offsets = <const void**> PyMem_Malloc(room * sizeof(void*))
        self.wide = <bint*> PyMem_Malloc(room * sizeof(bint))
        self.data = <const char**> PyMem_Malloc(room * sizeof(char*))
        self.rows = <int64_t*> PyMem_Malloc(room * sizeof(int64_t))
        self.size = <int64_t*> PyMem_Malloc(room * sizeof(int64_t))
        if not (self.offsets and self.wide and self.data and self.rows and self.size):
            raise MemoryError()
        cdef const int64_t[::1] o64
        cdef const int32_t[::1] o32
        cdef const uint8_t[::1] d
        cdef Py_ssize_t c, n
        for c in range(self.count):
            o, d = self.arrays[0][c], self.arrays[1][c]
            self.wide[c] = o.dtype == np.int64
            if self.wide[c]:
                o64 = o
                n, self.offsets[c] = o64.shape[0], &o64[0] if o64.shape[0] else NULL
            elif o.dtype == np.int32:
                o32 = o
                n, self.offsets[c] = o32.shape[0], &o32[0] if o32.shape[0] else NULL
            else:
                raise ValueError(f"gather: chunk {c}'s offsets are {o.dtype}, not int32 or int64")
            if n < 1:
                raise ValueError(f"gather: chunk {c} has no offsets (a chunk of n rows has n + 1)")
            self.rows[c] = n - 1
            self.data[c] = <const char*> &d[0] if d.shape[0] else NULL
            self.size[c] = d.shape[0]

    def __dealloc__(self):
        PyMem_Free(self.offsets)
        PyMem_Free(self.wide)
        PyMem_Free(self.data)
        PyMem_Free(self.rows)
        PyMem_Free(self.size)


def gather(list offsets not None, list data not None, chunk, local) -> tuple:
    """``(offsets, data)`` of the gathered rows (see the module docstring); every index and
    offset is checked first, so bad input raises ``ValueError`` rather than reading out of bounds."""
    cdef _Chunks chunks = _Chunks(offsets, data)
    cdef const int64_t[::1] at = np.ascontiguousarray(chunk, dtype=np.int64)
    cdef const int64_t[::1] row = np.ascontiguousarray(local, dtype=np.int64)
    cdef Py_ssize_t n = at.shape[0], i, j
    if row.shape[0] != n:
        raise ValueError(f"gather: {n} chunk ids for {row.shape[0]} rows")
    cdef int64_t c, r, start, stop
    out_offsets = np.empty(n + 1, dtype=np.int64)
    cdef int64_t[::1] ends = out_offsets
    cdef int64_t[::1] first = np.zeros(chunks.count + 1, dtype=np.int64)  # counting sort by chunk
    ends[0] = 0
    for i in range(n):
        c, r = at[i], row[i]
        if c < 0 or c >= chunks.count or r < 0 or r >= chunks.rows[c]:
            raise ValueError(f"gather: row {i} names row {r} of chunk {c}, which does not exist")
        start, stop = _offset(chunks.offsets[c], chunks.wide[c], r), _offset(chunks.offsets[c], chunks.wide[c], r + 1)
        if start < 0 or stop < start or stop > chunks.size[c]:
            raise ValueError(f"gather: chunk {c}'s offsets {start}..{stop} of row {r} are outside its "
                             f"{chunks.size[c]} bytes")
        ends[i + 1] = ends[i] + stop - start
        first[c + 1] += 1
    for c in range(chunks.count):
        first[c + 1] += first[c]
    cdef int64_t[::1] order = np.empty(n, dtype=np.int64)
    for i in range(n):
        order[first[at[i]]] = i
        first[at[i]] += 1
    out_data = np.empty(ends[n], dtype=np.uint8)
    cdef uint8_t[::1] bytes_out = out_data
    cdef uint8_t* into = &bytes_out[0] if ends[n] else NULL
    cdef const void** sources = chunks.offsets
    cdef bint* wide = chunks.wide
    cdef const char** blobs = chunks.data
    with nogil:  # a reader's other threads (fetching the next bundle) run meanwhile
        for j in range(n):
            i = order[j]
            c, r = at[i], row[i]
            start = _offset(sources[c], wide[c], r)
            if ends[i + 1] > ends[i]:
                memcpy(into + ends[i], blobs[c] + start, ends[i + 1] - ends[i])
    return out_offsets, out_data


def strings(offsets, data) -> list:
    """The ``str`` of each row of ``(offsets, data)`` (one more offset than rows, rising from 0
    to at most ``len(data)``: checked, ``ValueError`` otherwise)."""
    cdef const int64_t[::1] ends = np.ascontiguousarray(offsets, dtype=np.int64)
    cdef const uint8_t[::1] bytes_in = np.ascontiguousarray(data, dtype=np.uint8)
    cdef Py_ssize_t n = ends.shape[0] - 1, i
    if n < 0:
        raise ValueError("strings: no offsets (rows need one more offset than there are rows)")
    if ends[0] != 0:
        raise ValueError(f"strings: offsets start at {ends[0]}, not 0")
    for i in range(n):
        if ends[i + 1] < ends[i] or ends[i + 1] > bytes_in.shape[0]:
            raise ValueError(f"strings: row {i} spans bytes {ends[i]}..{ends[i + 1]} of {bytes_in.shape[0]}")
    cdef const char* start = <const char*> &bytes_in[0] if bytes_in.shape[0] else NULL
    cdef list out = PyList_New(n)
    cdef object value
    for i in range(n):
        value = PyUnicode_DecodeUTF8(start + ends[i], ends[i + 1] - ends[i], "strict")
        incref(value)
        set_item(out, i, <PyObject*> value)
    return out
